"""The optimizer's settings: built from the gate's, never by asking pytest twice."""

from __future__ import annotations

import pytest

from pytest_kernelpro.config import KernelproConfig
from pytest_kernelpro.optimize.search_config import OptimizeConfig


def test_sandbox_data_comes_from_pytests_ini_and_the_conftest_defaults_are_asked_once(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nkernelpro_sandbox_data =\n    data/*.bin\n    tables/\n")
    calls = pytester.path / "calls.txt"
    pytester.makeconftest(
        f"""
        def pytest_kernelpro_defaults(config):
            with open({str(calls)!r}, "a") as handle:
                handle.write("called\\n")
            return {{"candidates": 3, "threshold": 0.2}}
        """
    )
    config = pytester.parseconfigure()
    gate = KernelproConfig.from_pytest_config(config, environ={})
    asked = calls.read_text().splitlines()
    settings = OptimizeConfig.extend(gate, config, environ={})
    assert settings.sandbox_data == ("data/*.bin", "tables/")
    assert (settings.candidates, settings.threshold) == (3, 0.2)
    assert settings.sources["candidates"] == "conftest pytest_kernelpro_defaults"
    # The gate's settings asked the hooks; the optimizer's reuse their answer.
    assert asked
    assert calls.read_text().splitlines() == asked


def test_no_sandbox_data_named_is_an_empty_view(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfigure()
    settings = OptimizeConfig.extend(KernelproConfig.from_pytest_config(config, environ={}), config)
    assert settings.sandbox_data == ()
