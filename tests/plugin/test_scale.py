"""A suite at scale on the CPU: a KernelBench directory in one session, records that survive a
killed session, the item time limit, crashes under --kernelpro-isolate, missing records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import records_by_name

from pytest_kernelpro.gate.report_read import read_records_log
from pytest_kernelpro.record import record_builtins
from pytest_kernelpro.review.records_report import report_main

PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self{init_sig}):
        super().__init__()
        {init_body}
    def forward(self, x):
        return {forward}
{model_new}
def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return [{init_args}]
"""

PROBLEMS = {
    "1_Relu.py": {"forward": "torch.relu(x)"},
    "2_Softmax.py": {"forward": "torch.softmax(x, dim=1)"},
    "3_Linear.py": {
        "init_sig": ", n",
        "init_body": "self.fc = nn.Linear(32, n)",
        "forward": "self.fc(x)",
        "init_args": "16",
    },
    "4_Wrong.py": {
        "forward": "x * 2",
        "model_new": ("class ModelNew(Model):\n    def forward(self, x):\n        return x * 3\n"),
    },
}


def _write_problems(root: Path) -> Path:
    folder = root / "problems"
    folder.mkdir()
    for name, parts in PROBLEMS.items():
        fields = {"init_sig": "", "init_body": "pass", "model_new": "", "init_args": ""}
        fields.update(parts)
        (folder / name).write_text(PROBLEM.format(**fields))
    return folder


def _log_path(pytester: pytest.Pytester) -> Path:
    return Path(pytester.path) / ".kernelpro" / "kernelpro-report.jsonl"


def test_kernelbench_directory_in_one_session(kp_project: pytest.Pytester) -> None:
    folder = _write_problems(Path(kp_project.path))
    result = kp_project.runpytest(f"--kernelpro-problems={folder}", "-p", "no:randomly")
    result.assert_outcomes(passed=3, failed=1)
    logged = read_records_log(_log_path(kp_project))
    assert logged.finished
    assert logged.exitstatus == 1
    assert sorted(r.name for r in logged.records) == ["1_Relu", "2_Softmax", "3_Linear", "4_Wrong"]
    assert logged.missing == []
    by_name = {r.name: r for r in logged.records}
    assert by_name["4_Wrong"].outcome == "failed"
    assert "is wrong" in (by_name["4_Wrong"].message or "")
    # The records log and the JSON report hold the same records.
    report = records_by_name(kp_project)
    assert set(report) == set(by_name)
    for name, record in by_name.items():
        assert report[name]["timing"] == record_builtins(record)["timing"]


def test_kernelbench_inputs_are_seeded_and_the_model_is_built_once(tmp_path: Path) -> None:
    import torch

    from pytest_kernelpro.problem.kernelbench import problem_from_kernelbench

    folder = _write_problems(tmp_path)
    relu = problem_from_kernelbench(folder / "1_Relu.py")
    first, again, other = (
        relu.make_inputs("cpu", 7),
        relu.make_inputs("cpu", 7),
        relu.make_inputs("cpu", 8),
    )
    assert torch.equal(first[0], again[0])  # bit-identical for one seed
    assert not torch.equal(first[0], other[0])
    kernel, reference = relu.instantiate("cpu")
    assert kernel is reference  # no ModelNew: the reference module is the kernel, built once
    linear = problem_from_kernelbench(folder / "3_Linear.py")
    kernel, reference = linear.instantiate("cpu")
    assert kernel is reference
    assert reference.fc.weight.shape == (16, 32)
    wrong = problem_from_kernelbench(folder / "4_Wrong.py")
    kernel, reference = wrong.instantiate("cpu")
    assert kernel is not reference
    assert type(kernel).__name__ == "ModelNew"


KILLED = """
import os, signal, pytest, torch

def vec(device):
    return (torch.randn(1000, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def a_first(x):
    return -x

@pytest.mark.kernelpro(reference=torch.abs, inputs=vec)
def b_second(x):
    return x.abs()

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def c_killed(x):
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def d_never(x):
    return -x
"""


def _run_subprocess(pytester: pytest.Pytester, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_sigkilled_session_keeps_finished_records_and_the_check_fails(
    kp_project: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    kp_project.makepyfile(test_k=KILLED)
    proc = _run_subprocess(kp_project)
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (Path(kp_project.path) / ".kernelpro" / "kernelpro-report.json").exists()
    log = _log_path(kp_project)
    logged = read_records_log(log)
    assert not logged.finished
    assert [r.name for r in logged.records] == ["a_first", "b_second"]
    assert all(r.outcome == "passed" and r.timing for r in logged.records)
    assert logged.missing == ["test_k.py::c_killed", "test_k.py::d_never"]
    # The report is rebuilt from the log; --check fails on the missing records.
    rebuilt, junit = Path(kp_project.path) / "rebuilt.json", Path(kp_project.path) / "junit.xml"
    assert report_main([str(log), "--json", str(rebuilt), "--junit", str(junit)]) == 0
    assert report_main([str(log), "--check"]) == 1
    err = capsys.readouterr().err
    assert "2 collected kernel(s) have no record" in err
    assert "did not finish" in err
    report = json.loads(rebuilt.read_text())
    assert report["summary"]["kernels"] == 4
    assert report["summary"]["failed"] == 2
    missing = [r for r in report["records"] if r["extra"].get("missing_record")]
    assert [r["name"] for r in missing] == ["c_killed", "d_never"]
    assert "ended before this kernel finished" in missing[0]["message"]
    from pytest_kernelpro.review.junit_read import read_junit_records

    from_junit = {r.name: r for r in read_junit_records(junit)}
    assert from_junit["a_first"].outcome == "passed"
    assert from_junit["c_killed"].outcome == "failed"


def test_records_log_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text(
        '{"kind": "session", "created": "x"}\n'
        '{"kind": "collected", "nodeids": ["t.py::a"]}\n'
        '{"kind": "record", "record": {"nodeid": "t.py::a", "name": "a", "kernel": "a", '
        '"outcome": "passed"}}\n{"kind": "rec'
    )
    logged = read_records_log(log)
    assert (len(logged.records), logged.torn_lines, logged.missing) == (1, 1, [])
    log.write_text('{"kind": "session"}\nnot json\n{"kind": "finished", "exitstatus": 0}\n')
    with pytest.raises(Exception, match="line 2 is not JSON"):
        read_records_log(log)


def test_a_records_log_of_another_schema_version_is_refused_naming_both(tmp_path: Path) -> None:
    import json

    from pytest_kernelpro.gate.report import RECORDS_LOG_SCHEMA_VERSION, RecordsLog

    log = tmp_path / "r.jsonl"
    RecordsLog(log).start(["-q"])
    assert read_records_log(log).created  # what this version writes, it reads
    first = json.loads(log.read_text().splitlines()[0])
    assert first["schema_version"] == RECORDS_LOG_SCHEMA_VERSION
    log.write_text(json.dumps({**first, "schema_version": 9}) + "\n")
    with pytest.raises(
        Exception, match=r"schema version 9; this pytest-kernelpro .* reads version 1"
    ):
        read_records_log(log)


HANGING = """
import time, pytest, torch

def vec(device):
    return (torch.randn(100, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def hangs(x):
    while True:
        time.sleep(0.05)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def fine(x):
    return -x
"""


def test_item_timeout_fails_a_hanging_kernel_and_the_session_goes_on(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=HANGING)
    result = kp_project.runpytest("--kernelpro-item-timeout=2", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*hangs ran past the item time limit of 2 s (command line --kernelpro-item-timeout)*"]
    )
    records = records_by_name(kp_project)
    assert records["hangs"]["outcome"] == "failed"
    assert "checking correctness" in records["hangs"]["message"]
    assert records["fine"]["outcome"] == "passed"


def test_an_alarm_as_the_item_ends_does_not_leave_the_watchdog_armed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The limit's alarm can fire inside the block's cleanup (an item that ends right at its
    limit): the ItemTimeout then raised there must still disarm the watchdog, which would
    otherwise end this process WATCHDOG_GRACE_S later."""
    from pytest_kernelpro.run import context as limits

    exits: list[int] = []
    monkeypatch.setattr(limits, "WATCHDOG_GRACE_S", 0.2)
    monkeypatch.setattr(limits.os, "_exit", exits.append)
    real_setitimer = limits.signal.setitimer

    def alarm_during_reset(which: int, seconds: float, *rest: float) -> object:
        real_setitimer(which, 0)
        if seconds == 0:  # the reset in the cleanup: the alarm "fires" right there
            raise limits.ItemTimeout("at the limit")
        return None

    monkeypatch.setattr(limits.signal, "setitimer", alarm_during_reset)
    with pytest.raises(limits.ItemTimeout):
        with limits.item_time_limit(0.3, lambda: "limit", lambda text: None):
            pass
    time.sleep(1.0)  # past the limit plus the watchdog's grace
    assert exits == []


def _limit_fires_inside(block: Any) -> BaseException:
    """What leaves a 0.2 s item limit around `block()`, which waits for the limit's alarm."""
    from pytest_kernelpro.run import context as limits

    try:
        with limits.item_time_limit(0.2, lambda: "ran past the limit", lambda text: None):
            block()
    except BaseException as exc:  # what left it, whatever it is
        return exc
    raise AssertionError("nothing left the block past its limit")


def _wait_for_the_alarm() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise AssertionError("the limit's alarm never came")


def test_a_limit_whose_alarm_c_code_turned_into_its_own_error_fails_the_item_for_its_time() -> None:
    """The alarm raised inside `compile` came out as "SystemError: AST constructor recursion
    depth mismatch" (a loaded machine, a 1 s limit): the item failed with that error, not its
    time. Here a handler turns the alarm into another error, as that C code did."""
    from pytest_kernelpro.run.context import ItemTimeout

    def converted() -> None:
        try:
            _wait_for_the_alarm()
        except BaseException as exc:
            raise SystemError("AST constructor recursion depth mismatch") from exc

    left = _limit_fires_inside(converted)
    assert isinstance(left, ItemTimeout)
    assert str(left) == "ran past the limit"
    assert isinstance(left.__cause__, SystemError)


def test_a_limit_whose_alarm_a_kernel_swallowed_still_fails_the_item() -> None:
    """A kernel that catches everything and goes on: it ran past its limit all the same."""
    from pytest_kernelpro.run.context import ItemTimeout

    def swallowed() -> None:
        try:
            _wait_for_the_alarm()
        except BaseException:  # noqa: S110 - the attack: the alarm caught and dropped
            pass

    left = _limit_fires_inside(swallowed)
    assert isinstance(left, ItemTimeout)


def test_an_error_of_the_block_before_its_limit_stays_that_error() -> None:
    from pytest_kernelpro.run import context as limits

    with pytest.raises(ValueError, match="the kernel's own"):
        with limits.item_time_limit(30, lambda: "limit", lambda text: None):
            raise ValueError("the kernel's own")


CRASHING = """
import ctypes, os, pytest, torch

def vec(device):
    return (torch.randn(100, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def exits(x):
    os._exit(0)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def segfaults(x):
    ctypes.string_at(0)

@pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
def survives(x):
    return -x
"""


def test_isolate_turns_os_exit_and_a_segfault_into_failures_of_their_items(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=CRASHING)
    proc = _run_subprocess(kp_project, "--kernelpro-isolate", "-q")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    assert "2 failed, 1 passed" in out
    records = records_by_name(kp_project)
    assert records["survives"]["outcome"] == "passed"
    assert records["survives"]["timing"]["stats"]["median_s"] > 0
    assert records["survives"]["extra"]["isolated"]["returncode"] == 0
    exits, segv = records["exits"], records["segfaults"]
    assert exits["outcome"] == segv["outcome"] == "failed"
    assert "exited with status 0 without writing its record" in exits["message"]
    assert "killed by SIGSEGV" in segv["message"]
    assert "the other kernels are not affected" in segv["message"]
    logged = read_records_log(_log_path(kp_project))
    assert logged.finished
    assert logged.missing == []
    assert len(logged.records) == 3


def test_isolate_children_load_the_plugin_when_it_is_not_an_installed_entry_point(
    kp_project: pytest.Pytester,
) -> None:
    """As on the H200 machine (a checkout on PYTHONPATH, the plugin given with -p): the child
    must load the plugin too, or it rejects the --kernelpro-* flags of its command line."""
    kp_project.makepyfile(
        test_k="import pytest, torch\n\n"
        "@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda d: (torch.randn(100, device=d),))\n"
        "def survives(x):\n    return -x\n"
    )
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_kernelpro.plugin", "-p",
         "no:cacheprovider", "-q", "--kernelpro-isolate"],
        cwd=kp_project.path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = records_by_name(kp_project)["survives"]
    assert record["outcome"] == "passed"
    assert record["extra"]["isolated"]["returncode"] == 0


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process groups from /proc")
def test_a_killed_childs_whole_group_is_gone_before_the_next_child() -> None:
    """At the item limit the parent kills the child's process group and waits for every
    process of it (a grandchild too: a compiler, a profiler) before the next child starts,
    so none is left holding the GPU."""
    from pytest_kernelpro.run import isolate

    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while len(isolate.group_pids(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # sh and its two sleeps
    assert len(isolate.group_pids(proc.pid)) == 3
    pids = isolate.kill_group(proc)
    proc.communicate()
    released = isolate.wait_released(pids, 10.0)
    assert len(released["pids"]) == 3
    assert released["still_alive"] == []
    assert released["still_on_gpu"] == []
    assert isolate.group_pids(proc.pid) == []


def _scale_baseline(path: Path, factor: float) -> None:
    """Multiply every time of each kernel in a saved baseline by `factor`: its wall times and,
    on the CPU, its on-CPU times and its ratios to the CPU anchor (what the CPU gate compares);
    the anchor's own times stay, as the machine's."""
    import yaml

    data = yaml.safe_load(path.read_text())
    for entry in data["kernels"].values():
        for key in ("median_s", "q1_s", "q3_s"):
            if entry.get(key):
                entry[key] = entry[key] * factor
        for key in ("samples_s", "cpu_kernel_s", "anchor_ratios"):
            if entry.get(key):
                entry[key] = [v * factor for v in entry[key]]
    path.write_text(yaml.safe_dump(data))


LOST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report):
    # Stands in for a record lost on the way (a worker that died after its item ran).
    if report.nodeid.endswith("::lost") and hasattr(report, "kernelpro_record"):
        del report.kernelpro_record
"""


def test_check_fails_when_a_collected_kernel_has_no_record(kp_project: pytest.Pytester) -> None:
    kp_project.makeconftest(LOST)
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        vec = lambda device: (torch.randn(100, device=device),)

        @pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
        def kept(x):
            return -x

        @pytest.mark.kernelpro(reference=torch.neg, inputs=vec)
        def lost(x):
            return -x
        """
    )
    base = Path(kp_project.path) / "base.yaml"
    kp_project.runpytest(f"--kernelpro-save-baseline={base}").assert_outcomes(passed=2)
    _scale_baseline(base, 1000.0)  # far slower than now: no kernel can regress, whatever the load
    result = kp_project.runpytest("--kernelpro-check", f"--kernelpro-baseline={base}")
    result.assert_outcomes(passed=2)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*1 collected kernel(s) left no record (fails the check)*lost*"])
    # Without --kernelpro-check a missing record is reported, not a failure.
    result = kp_project.runpytest()
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*left no record (not checked)*"])


REGRESSING = """
import pytest, torch

def inp(device):
    return (torch.randn(1024, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def k1(x):
    return -x

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def k2(x):
    return -x

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def k3(x):
    return -x
"""


def test_automatic_regression_profiles_are_bounded(
    kp_project: pytest.Pytester, injected_timing: list[float]
) -> None:
    # Injected timings: a real timing on an oversubscribed CPU is "suspect", never regressed.
    kp_project.makepyfile(test_k=REGRESSING)
    kp_project.runpytest("--kernelpro-save-baseline", "-p", "no:randomly").assert_outcomes(passed=3)
    # A baseline 1000x faster than anything this machine can measure: every kernel regresses
    # and every confirmation reproduces it, however loaded the machine is.
    _scale_baseline(Path(kp_project.path) / "kernelpro-baseline.yaml", 1e-3)
    result = kp_project.runpytest(
        "--kernelpro-check", "--kernelpro-auto-profiles=1", "-p", "no:randomly"
    )
    result.assert_outcomes(failed=3)
    records = records_by_name(kp_project)
    assert all(r["gate"]["status"] == "regressed" for r in records.values())
    texts = [records[k]["extra"]["profile_text"] for k in ("k1", "k2", "k3")]
    # The first regression got its automatic profile (on the CPU: a note that ncu needs a GPU),
    # the others say how to profile them.
    assert "need a CUDA GPU" in texts[0]
    for name, text in zip(("k2", "k3"), texts[1:], strict=True):
        assert "not collected automatically: 1 regressed kernel(s) were already profiled" in text
        assert f"pytest test_k.py::{name} --kernelpro-profile" in text


def test_kernelbench_models_run_without_autograd(kp_project: pytest.Pytester) -> None:
    folder = Path(kp_project.path) / "problems"
    folder.mkdir()
    # A forward with autograd on would record the graph and keep its saved activations alive.
    (folder / "1_NoGrad.py").write_text(
        PROBLEM.format(
            init_sig="",
            init_body="self.fc = nn.Linear(32, 8)",
            forward="self.checked(x)",
            model_new="",
            init_args="",
        ).replace(
            "    def forward(self, x):",
            "    def checked(self, x):\n"
            "        assert not torch.is_grad_enabled(), 'autograd is on'\n"
            "        return self.fc(x)\n"
            "    def forward(self, x):",
        )
    )
    result = kp_project.runpytest(f"--kernelpro-problems={folder}")
    result.assert_outcomes(passed=1)
