"""Limits that hold (optimize/sandbox/task.py SandboxLimits, namespace_setup.py, the parent's
watch in supervise.py, limit_notes.py): processes, open files, file size and memory, each
refusal naming the limit and its setting."""

from __future__ import annotations

import dataclasses
import os

import pytest
from sandbox_attack_cases import DATA

from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.sandbox.limit_notes import limit_note
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

ISOLATION = Isolation.probe()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)


def test_memory_is_half_of_the_machines_by_default_and_configurable() -> None:
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    assert SandboxLimits().memory_limit_mb == max(1024, total_mb // 2)
    assert SandboxLimits(memory_limit_mb=2048).memory_limit_mb == 2048


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        (
            "OSError: [Errno 27] File too large",
            "file size limit of 16384 MB (SandboxLimits.scratch_limit_mb)",
        ),
        (
            "OSError: [Errno 24] Too many open files: 'x'",
            "limit of 4096 open files (SandboxLimits.max_open_files)",
        ),
        (
            "BlockingIOError: [Errno 11] Resource temporarily unavailable (os.fork)",
            "limit of 512 processes and threads (SandboxLimits.max_processes)",
        ),
    ],
)
def test_a_failure_caused_by_a_limit_names_the_limit_and_its_setting(
    reason: str, says: str
) -> None:
    out = limit_note(reason, SandboxLimits())
    assert out is not None
    assert out.startswith(reason)
    assert says in out


def test_other_failures_are_unchanged() -> None:
    for reason in (None, "", "RuntimeError: shapes differ", "Resource temporarily unavailable"):
        assert limit_note(reason, SandboxLimits()) == reason


SPAWN = """
import subprocess, sys, time
children = []
for _ in range(@@N@@):
    try:
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    except OSError as exc:
        print("refused spawn", exc)
        raise
print("spawned", len(children)); sys.stdout.flush()
time.sleep(60)
"""
OPEN_FILES = """
import os
handles = []
for k in range(@@N@@):
    handles.append(open(os.devnull))
"""


def _candidate(prefix: str, n: int) -> Candidate:
    correct = (DATA / "cpu" / "correct.py").read_text(encoding="utf-8")
    return Candidate(prefix.replace("@@N@@", str(n)) + correct)


@pytest.fixture(scope="module")
def limited() -> dict[str, Evaluation]:
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    task = KernelBenchTask(
        reference,
        name="softmax_linear",
        device="cpu",
        timing={"warmup_ms": 1.0, "max_time_s": 0.02, "min_samples": 5, "max_samples": 10},
        cpu_threads=1,
    )
    limits = dataclasses.replace(
        SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=4096),
        max_processes=24,
        max_open_files=256,
    )
    evaluator = SandboxEvaluator(task, limits)
    try:
        return {
            "processes": evaluator.evaluate(_candidate(SPAWN, 40)),
            "open_files": evaluator.evaluate(_candidate(OPEN_FILES, 1000)),
        }
    finally:
        evaluator.close()


@pytest.mark.slow
@needs_namespaces
def test_more_processes_than_the_limit_are_refused_naming_it(limited) -> None:
    ev = limited["processes"]
    assert ev.status in ("run_error", "build_error"), ev.reason
    reason = ev.reason or ""
    # Killed by the parent's count (root on the host is exempt from RLIMIT_NPROC), or
    # refused by the rlimit inside a user namespace: either way the limit is named.
    assert "24 process" in reason, reason
    assert "SandboxLimits.max_processes" in reason, reason
    assert "processes limited to 24" in ev.logs


@pytest.mark.slow
@needs_namespaces
def test_more_open_files_than_the_limit_are_refused_naming_it(limited) -> None:
    ev = limited["open_files"]
    assert ev.status in ("run_error", "build_error"), ev.reason
    assert "Too many open files" in (ev.reason or "")
    assert "limit of 256 open files (SandboxLimits.max_open_files)" in (ev.reason or "")
    assert "open files limited to 256" in ev.logs


def test_an_evaluations_run_limit_follows_the_gates_time_for_the_item() -> None:
    """A fixed 120 s killed evaluations of a large problem the gate itself took a minute and
    more on: the search's limit is four times the gate's time for the item, never under the
    sandbox's default (a quick item, or a record without its time, keeps the default)."""
    from pytest_kernelpro.optimize.loop.compose import RUN_LIMIT_PER_GATE_TIME, run_limit_s
    from pytest_kernelpro.optimize.sandbox.task import SandboxLimits

    default = SandboxLimits().run_timeout_s
    assert run_limit_s(0.0) == default
    assert run_limit_s(2.5) == default
    assert run_limit_s(52.0) == pytest.approx(RUN_LIMIT_PER_GATE_TIME * 52.0)
    assert run_limit_s(52.0) > 160.0  # the evaluation the fixed limit killed ran 159 s
