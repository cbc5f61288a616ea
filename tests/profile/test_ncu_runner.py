"""The ncu runner: command line, and every way a run ends, with small fake `ncu` executables
run as real subprocesses (the real one needs a GPU)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from pytest_kernelpro.profile.ncu import (
    NCU_ENV_VAR,
    KernelSelector,
    NcuRequest,
    arch_from_cc,
    build_ncu_command,
    find_ncu,
    query_catalog,
    rejected_metrics,
    run_ncu,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "profile"

TARGET = ("python", "-m", "pytest_kernelpro.profile.target", "spec.json")


def fake_ncu(folder: Path, body: str) -> str:
    """An executable Python script standing in for ncu; `body` sees `argv` and `DATA`."""
    path = folder / "ncu"
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time, subprocess\n"
        "argv = sys.argv[1:]\n"
        f"DATA = {str(DATA)!r}\n" + body,
        encoding="utf-8",
    )
    path.chmod(0o755)
    return str(path)


def test_command_line() -> None:
    request = NcuRequest(
        target_command=TARGET,
        metrics=("gpu__time_duration.sum", "dram__bytes_read.sum"),
        kernels=KernelSelector(("_Z3fooPf", "$__internal_x"), "mangled"),
        launch_skip=2,
        launch_count=8,
    )
    command = build_ncu_command("/opt/ncu", request)
    assert command[:12] == [
        "/opt/ncu",
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--metrics",
        "gpu__time_duration.sum,dram__bytes_read.sum",
    ]
    assert command[command.index("--kernel-name-base") + 1] == "mangled"
    assert command[command.index("-k") + 1] == r"regex:^(_Z3fooPf|\$__internal_x)$"
    assert command[command.index("--print-kernel-base") + 1] == "mangled"
    assert command[command.index("--nvtx") + 1 : command.index("--nvtx") + 3] == [
        "--nvtx-include",
        "kernelpro/",
    ]
    assert command[command.index("--launch-skip") + 1] == "2"
    assert command[command.index("--launch-count") + 1] == "8"
    assert tuple(command[-4:]) == TARGET


def test_command_line_for_library_kernels_and_no_filters() -> None:
    by_function = NcuRequest(
        target_command=TARGET,
        kernels=KernelSelector(("nvjet_sm90_tst", "softmax_kernel"), "function"),
    )
    command = build_ncu_command("ncu", by_function)
    assert command[command.index("-k") + 1] == "regex:(nvjet_sm90_tst|softmax_kernel)"
    assert "--print-kernel-base" not in command
    metrics = command[command.index("--metrics") + 1].split(",")
    assert "launch__grid_size" not in metrics  # implicit: written on every raw page
    assert "gpu__time_duration.sum" in metrics
    bare = build_ncu_command(
        "ncu", NcuRequest(target_command=TARGET, metrics=(), nvtx_include=None)
    )
    assert "-k" not in bare
    assert "--nvtx" not in bare
    assert "--metrics" not in bare


def test_no_ncu_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(NCU_ENV_VAR, raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr("pytest_kernelpro.profile.binaries._DEFAULT_CUDA_ROOTS", ())
    assert find_ncu() is None
    result = run_ncu(NcuRequest(target_command=TARGET))
    assert result.kernels == []
    (missing,) = result.not_collected
    assert missing.what == "ncu"
    assert "ncu not found on PATH" in missing.why
    assert NCU_ENV_VAR in missing.why
    explicit = run_ncu(NcuRequest(target_command=TARGET), ncu_path=str(tmp_path / "nope"))
    assert "is not executable" in explicit.not_collected[0].why


def test_env_override_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = fake_ncu(tmp_path, "print(open(os.path.join(DATA, 'ncu_raw.csv')).read())\n")
    monkeypatch.setenv(NCU_ENV_VAR, script)
    assert find_ncu() == script
    result = run_ncu(NcuRequest(target_command=TARGET), query_catalog_first=False)
    assert result.not_collected == []
    assert len(result.kernels) == 51


def test_counter_permission_refused(tmp_path: Path) -> None:
    script = fake_ncu(
        tmp_path,
        "print('==PROF== Connected to process 1 (/usr/bin/python3)')\n"
        "print('==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
        "GPU Performance Counters on the target device 0.')\n"
        "sys.exit(1)\n",
    )
    result = run_ncu(NcuRequest(target_command=TARGET), ncu_path=script, query_catalog_first=False)
    (refused,) = result.not_collected
    assert refused.what == "ncu"
    assert "ERR_NVGPUCTRPERM" in refused.why
    assert "https://developer.nvidia.com/ERR_NVGPUCTRPERM" in refused.why


def test_no_kernel_matched(tmp_path: Path) -> None:
    script = fake_ncu(
        tmp_path,
        "print('==PROF== Connected to process 1')\n"
        "print('==PROF== Disconnected from process 1')\n"
        "print('==WARNING== No kernels were profiled.')\n",
    )
    request = NcuRequest(target_command=TARGET, kernels=KernelSelector(("_Z3fooPf",)))
    result = run_ncu(request, ncu_path=script, query_catalog_first=False)
    (nothing,) = result.not_collected
    assert "no kernel matched -k regex:^(_Z3fooPf)$" in nothing.why
    assert "kernelpro/" in nothing.why


def test_target_failure_is_reported(tmp_path: Path) -> None:
    script = fake_ncu(
        tmp_path,
        "sys.stderr.write('kernelpro target: ImportError: no module named mykernels\\n')\n"
        "print('==ERROR== The application returned an error code (3).')\n"
        "sys.exit(3)\n",
    )
    result = run_ncu(NcuRequest(target_command=TARGET), ncu_path=script, query_catalog_first=False)
    (failed,) = result.not_collected
    assert "ncu exited with 3" in failed.why
    assert "The application returned an error code (3)" in failed.why


def test_timeout_kills_ncu_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = fake_ncu(
        tmp_path,
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n",
    )
    started = time.monotonic()
    result = run_ncu(
        NcuRequest(target_command=TARGET, timeout_s=1.5), ncu_path=script, query_catalog_first=False
    )
    assert time.monotonic() - started < 30
    (timeout,) = result.not_collected
    assert "timed out after 2 s" in timeout.why or "timed out after 1 s" in timeout.why
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the target's child process {child} survived the timeout")


def test_rejected_metric_is_dropped_and_the_run_repeated(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    script = fake_ncu(
        tmp_path,
        f"open({str(calls)!r}, 'a').write(' '.join(argv) + '\\n')\n"
        "if any('sm__bogus_metric.sum' in a for a in argv):\n"
        "    print('==ERROR== Failed to find metric sm__bogus_metric.sum')\n"
        "    sys.exit(1)\n"
        "print(open(os.path.join(DATA, 'ncu_raw.csv')).read())\n",
    )
    request = NcuRequest(
        target_command=TARGET, metrics=("gpu__time_duration.sum", "sm__bogus_metric.sum")
    )
    result = run_ncu(request, ncu_path=script, query_catalog_first=False)
    assert result.dropped_metrics == ("sm__bogus_metric.sum",)
    assert result.attempt_errors == ("==ERROR== Failed to find metric sm__bogus_metric.sum",)
    assert result.not_collected == []
    assert len(calls.read_text().splitlines()) == 2
    assert "sm__bogus_metric.sum" not in " ".join(result.command)
    spill = next(k for k in result.kernels if k.kernel_name.startswith("spill_kernel"))
    assert "sm__bogus_metric.sum" in spill.missing
    assert spill.get("gpu__time_duration.sum") == 198_560
    # the raw page's device attributes are trimmed; launch geometry is kept
    assert "device__attribute_clock_rate" not in spill.metrics
    assert spill.get("launch__grid_dim_x") == 4096
    assert result.compute_capability == "9.0"


def test_catalog_drops_before_running(tmp_path: Path, probe_catalog: str) -> None:
    calls = tmp_path / "calls.txt"
    script = fake_ncu(
        tmp_path,
        "if '--query-metrics' in argv:\n"
        "    print(open(os.path.join(DATA, 'ncu_query_metrics.txt')).read()); sys.exit(0)\n"
        f"open({str(calls)!r}, 'a').write(' '.join(argv) + '\\n')\n"
        "print(open(os.path.join(DATA, 'ncu_raw.csv')).read())\n",
    )
    catalog = query_catalog(script)
    assert catalog is not None
    assert "dram__bytes_read" in catalog
    request = NcuRequest(target_command=TARGET, metrics=("dram__bytes_read.sum", "sm__gone.sum"))
    result = run_ncu(request, ncu_path=script)
    assert result.dropped_metrics == ("sm__gone.sum",)
    assert "sm__gone.sum" not in calls.read_text()
    assert len(result.kernels) == 51


def test_rejected_metrics_only_from_error_lines() -> None:
    requested = ["gpu__time_duration.sum", "sm__foo.avg.pct_of_peak_sustained_active"]
    assert rejected_metrics("==ERROR== Failed to find metric sm__foo\n", requested) == [
        requested[1]
    ]
    assert rejected_metrics("sm__foo mentioned in program output\n", requested) == []


@pytest.mark.parametrize(
    ("cc", "arch"), [("9.0", "sm_90"), ("10,0", "sm_100"), ("", None), (None, None)]
)
def test_arch_from_cc(cc, arch) -> None:
    assert arch_from_cc(cc) == arch
