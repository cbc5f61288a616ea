"""Settings precedence: CLI > KERNELPRO_* environment > ini > default; clear bad values."""

from __future__ import annotations

import re

import pytest

from pytest_kernelpro.config import KernelproConfig


def _settings(
    pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None
) -> KernelproConfig:
    config = pytester.parseconfigure(*args)
    return KernelproConfig.from_pytest_config(config, environ=env or {})


def _optimize_settings(pytester: pytest.Pytester, *args: str) -> KernelproConfig:
    """The settings the optimizer plugin installs on the gate's session."""
    from pytest_kernelpro.run.items import PLUGIN_NAME

    config = pytester.parseconfigure(*args)
    return config.pluginmanager.get_plugin(PLUGIN_NAME).settings


def test_defaults(pytester: pytest.Pytester) -> None:
    s = _settings(pytester)
    assert (s.threshold, s.trials, s.device, s.check, s.cuda_graph) == (
        None,
        3,
        "auto",
        False,
        False,
    )
    # Unset threshold: 2% for kernels timed on a CUDA GPU, 5% on the CPU (gate/verdict.py).
    from pytest_kernelpro.gate.verdict import default_threshold

    assert (default_threshold("cuda"), default_threshold("cpu")) == (0.02, 0.05)
    assert (s.item_timeout_s, s.isolate, s.auto_profiles, s.auto_profile_time_s) == (
        300.0,
        False,
        3,
        30.0,
    )
    assert s.records_path == pytester.path / ".kernelpro" / "kernelpro-report.jsonl"
    assert s.baseline_path == pytester.path / "kernelpro-baseline.yaml"
    assert s.sources["threshold"] == "default"


def test_item_timeout_default_is_off_under_optimize(pytester: pytest.Pytester) -> None:
    # A replay recording: without one (or an API key) the optimize preflight is a usage error.
    import json

    from pytest_kernelpro.optimize.loop.replay import recording_record

    record = json.dumps(recording_record("### Strategy: s\n```python\nclass ModelNew: pass\n```"))
    (pytester.path / "rec.jsonl").write_text(record + "\n")
    replay = f"--kernelpro-llm=replay:{pytester.path / 'rec.jsonl'}"
    s = _optimize_settings(pytester, "--kernelpro-optimize=3", replay)
    assert s.item_timeout_s is None
    assert s.sources["item_timeout"].startswith("lifted by --kernelpro-optimize")
    s = _optimize_settings(
        pytester, "--kernelpro-optimize=3", replay, "--kernelpro-item-timeout=50"
    )
    assert s.item_timeout_s == 50.0
    assert s.threshold is None  # the per-device default
    s = _settings(pytester, "--kernelpro-threshold=4%")
    assert s.threshold == 0.04


def test_ini_then_env_then_cli(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkernelpro_threshold = 0.2\nkernelpro_trials = 5\n")
    s = _settings(pytester)
    assert (s.threshold, s.trials) == (0.2, 5)
    assert s.sources["threshold"] == "ini key kernelpro_threshold"
    s = _settings(pytester, env={"KERNELPRO_THRESHOLD": "3%"})
    assert s.threshold == pytest.approx(0.03)
    assert s.sources["threshold"] == "environment variable KERNELPRO_THRESHOLD"
    s = _settings(pytester, "--kernelpro-threshold=0.07", env={"KERNELPRO_THRESHOLD": "3%"})
    assert s.threshold == pytest.approx(0.07)
    assert s.sources["threshold"] == "command line --kernelpro-threshold"


def test_pyproject_ini_keys(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nkernelpro_device = "cpu"\nkernelpro_cuda_graph = "true"\n'
    )
    s = _settings(pytester)
    assert (s.device, s.cuda_graph) == ("cpu", True)


def test_bad_ini_value_names_source_and_fix(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkernelpro_threshold = lots\n")
    with pytest.raises(
        pytest.UsageError,
        match=r"invalid value from ini key kernelpro_threshold: 'lots' is not a fraction; write e\.g\. 0\.05 or 5%",
    ):
        _settings(pytester)


def test_bad_cli_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kernelpro-trials=0")
    result.stderr.fnmatch_lines(["*--kernelpro-trials*'0' must be 1 or more*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_save_baseline_defaults_to_the_baseline_path(pytester: pytest.Pytester) -> None:
    s = _settings(pytester, "--kernelpro-save-baseline", "--kernelpro-baseline=b.yaml")
    assert s.save_baseline == str(pytester.path / "b.yaml")
    s = _settings(pytester, "--kernelpro-save-baseline=out/new.yaml")
    assert s.save_baseline == str(pytester.path / "out/new.yaml")


def test_conftest_defaults_rank_below_ini_and_above_builtin(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        def pytest_kernelpro_defaults(config):
            return {"threshold": 0.2, "trials": "4"}
        """
    )
    s = _settings(pytester)
    assert (s.threshold, s.trials) == (0.2, 4)
    assert s.sources["threshold"] == "conftest pytest_kernelpro_defaults"
    pytester.makeini("[pytest]\nkernelpro_threshold = 0.3\n")
    s = _settings(pytester)
    assert s.threshold == 0.3
    assert s.sources["threshold"] == "ini key kernelpro_threshold"


def test_unknown_conftest_default_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_kernelpro_defaults(config):\n    return {'thresold': 0.2}\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown setting(s) thresold; valid names: device*"])


def test_help_lists_the_optimizer_options_in_their_own_section(pytester: pytest.Pytester) -> None:
    """`pytest --help`: the check/timing options under `kernelpro`, the optimizer's in a
    section of their own, each option in exactly one of them."""
    from pytest_kernelpro.optimize.settings import GROUP_DESCRIPTION, SETTINGS

    text = pytester.runpytest("--help").stdout.str()
    head = f"{GROUP_DESCRIPTION}:"
    assert head in text
    main_part, optimize_part = text.split(head, 1)
    optimize_part = optimize_part.split("\n\n", 1)[0]  # up to the next section
    optimizer_flags = {"--kernelpro-optimize", "--kernelpro-resume"} | {s.flag for s in SETTINGS}
    assert {"--kernelpro-llm", "--kernelpro-search", "--kernelpro-dask"} <= optimizer_flags

    def options(part: str) -> set[str]:  # an option starts a line, indented by two spaces
        return set(re.findall(r"^  (--kernelpro-[a-z-]+)", part, flags=re.MULTILINE))

    assert options(optimize_part) == optimizer_flags
    assert not options(main_part) & optimizer_flags
    assert {"--kernelpro-check", "--kernelpro-threshold", "--kernelpro-isolate"} <= options(
        main_part
    )
