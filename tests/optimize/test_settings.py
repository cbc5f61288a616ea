"""The optimizer's settings: built from the gate's, never by asking pytest twice."""

from __future__ import annotations

import dataclasses

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


def test_the_models_price_resolves_with_the_projects_precedence_and_reaches_a_child(
    pytester: pytest.Pytester,
) -> None:
    """The price is an ini key and a `KERNELPRO_*` variable like every setting; the command
    line wins; an item's own process under --kernelpro-isolate gets the same pair back."""
    from pytest_kernelpro.optimize.settings import parse_price_pair

    pytester.makeini("[pytest]\nkernelpro_llm_price = 1,2\n")
    from_ini = pytester.parseconfigure()
    gate = KernelproConfig.from_pytest_config(from_ini, environ={})
    assert OptimizeConfig.extend(gate, from_ini, environ={}).llm_price == (1.0, 2.0)
    environ = {"KERNELPRO_LLM_PRICE": "0.25,1.5"}
    settings = OptimizeConfig.extend(gate, from_ini, environ=environ)
    assert settings.llm_price == (0.25, 1.5)
    assert settings.sources["llm_price"] == "environment variable KERNELPRO_LLM_PRICE"
    assert settings.model_prices() == {settings.model: (0.25, 1.5)}
    searching = dataclasses.replace(settings, optimize="3")  # child_args: only under the flag
    flag = [arg for arg in searching.child_args() if arg.startswith("--kernelpro-llm-price=")]
    assert flag == ["--kernelpro-llm-price=0.25,1.5"]
    assert parse_price_pair(flag[0].split("=", 1)[1]) == (0.25, 1.5)
    from_cli = pytester.parseconfigure("--kernelpro-llm-price=3,15")
    gate = KernelproConfig.from_pytest_config(from_cli, environ=environ)
    assert OptimizeConfig.extend(gate, from_cli, environ=environ).llm_price == (3.0, 15.0)
    pytester.makeini("[pytest]\n")
    unset = OptimizeConfig.extend(gate, pytester.parseconfigure(), environ={})
    assert unset.llm_price is None
    assert unset.model_prices() == {}
