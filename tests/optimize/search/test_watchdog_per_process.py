"""The watchdog's memory limit is per process (`supervise.over_memory_limit`): the worker is
killed on its own memory, never on the judge's beside it. Real processes watched by the real
`WorkerSupervision._watch` (no sandbox: the rule is the parent's), each holding the memory it
says (`bytes` filled, so every page is resident)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pytest_kernelpro.optimize.sandbox.handles import HandleChannels
from pytest_kernelpro.optimize.sandbox.processes import ProcessRun
from pytest_kernelpro.optimize.sandbox.supervise import WorkerSupervision, over_memory_limit
from pytest_kernelpro.optimize.sandbox.task import SandboxLimits
from pytest_kernelpro.optimize.sandbox.worker_claims import judge_end_error

LIMIT_MB = 400


class Watchdog(WorkerSupervision):
    """The supervision's watch with what it reads of the evaluator, and nothing else."""

    def __init__(self, limit_mb: int) -> None:
        self.limits = SandboxLimits(memory_limit_mb=limit_mb, build_timeout_s=120.0)
        self.handles = HandleChannels(2**30)
        self.on_phase = None
        self.memory_now = {}
        self.both_peak_mb = {}
        self.both_peak_at = {}

    def watch(self, proc: subprocess.Popen[bytes], workdir: Path) -> tuple[str | None, str, float]:
        return self._watch(
            proc, workdir / "progress.log", workdir / "result.json", time.monotonic()
        )


def holding(mb: int, seconds: float, ready: Path) -> subprocess.Popen[bytes]:
    """A process that holds `mb` MB resident for `seconds` (after writing `ready`), then exits."""
    code = (
        "import pathlib, sys, time\n"
        f"held = b'x' * ({mb} * 2**20)\n"
        f"pathlib.Path({str(ready)!r}).write_text('ready')\n"
        f"time.sleep({seconds})\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def beside(tmp_path: Path, worker_mb: int, judge_mb: int) -> dict[str, Any]:
    """A worker of `worker_mb` and a judge of `judge_mb` watched at once, as an evaluation
    watches them (the judge streamed beside the worker: `HandleChannels.stream`)."""
    watchdog = Watchdog(LIMIT_MB)
    worker_dir, judge_dir = tmp_path / "worker", tmp_path / "judge"
    worker_dir.mkdir()
    judge_dir.mkdir()
    watchdog.handles.stream(worker_dir, judge_dir)
    ends: dict[str, Any] = {}
    judge = holding(judge_mb, 6.0, judge_dir / "ready")
    judge_watch = threading.Thread(
        target=lambda: ends.setdefault("judge", watchdog.watch(judge, judge_dir))
    )
    judge_watch.start()
    try:
        wait_for(judge_dir / "ready")  # the judge at its peak before the worker grows
        worker = holding(worker_mb, 3.0, worker_dir / "ready")
        ends["worker"] = watchdog.watch(worker, worker_dir)
    finally:
        judge_watch.join(60)
        watchdog.handles.end_stream(worker_dir, judged=False)
    ends["both_mb"] = watchdog.both_peak_mb.get(worker_dir, 0.0)
    return ends


def test_an_honest_worker_beside_a_judge_near_its_peak_is_not_killed(tmp_path: Path) -> None:
    """Each under the limit, both together over it: neither is killed, and the sum (the
    evaluation's memory) is still reported."""
    ends = beside(tmp_path, worker_mb=250, judge_mb=250)
    killed, _, worker_peak = ends["worker"]
    assert killed is None
    assert ends["judge"][0] is None
    assert worker_peak < LIMIT_MB < ends["both_mb"]  # the sum passed the limit: no kill
    assert ends["both_mb"] >= worker_peak + 250


def test_a_candidate_past_the_limit_is_still_killed_out_of_memory(tmp_path: Path) -> None:
    """The attack: a candidate's worker that allocates past the limit, beside a small judge,
    is killed and classified "out of memory"."""
    ends = beside(tmp_path, worker_mb=LIMIT_MB + 100, judge_mb=20)
    killed, phase, peak = ends["worker"]
    assert killed == "memory"
    assert peak > LIMIT_MB
    assert ends["judge"][0] is None  # the judge is not charged with the worker's memory
    watchdog = Watchdog(LIMIT_MB)
    run = ProcessRun(-9, killed, phase, peak, 1.0, "")
    evaluation = watchdog._classify(run, tmp_path / "worker" / "result.json")
    assert evaluation.status == "run_error"
    assert evaluation.reason.startswith("out of memory: resident memory")


def test_a_judge_over_its_own_limit_is_an_evaluation_error_not_the_candidates(
    tmp_path: Path,
) -> None:
    """A judge past the limit is killed on its own memory, and the evaluation says it is an
    evaluation error, not the candidate's "out of memory"."""
    watchdog = Watchdog(LIMIT_MB)
    judge_dir = tmp_path / "judge"
    judge_dir.mkdir()
    proc = holding(LIMIT_MB + 100, 6.0, judge_dir / "ready")
    killed, phase, peak = watchdog.watch(proc, judge_dir)
    assert killed == "memory"
    text = judge_end_error(ProcessRun(-9, killed, phase, peak, 1.0, ""), watchdog.limits)
    assert text.startswith("an evaluation error, not the candidate's: the judge")
    assert f"passed its own {LIMIT_MB} MB memory limit" in text
    assert "out of memory" not in text


def test_the_rule_is_the_process_own_memory_against_the_limit() -> None:
    assert not over_memory_limit(LIMIT_MB, LIMIT_MB)
    assert over_memory_limit(LIMIT_MB + 0.1, LIMIT_MB)
    assert not over_memory_limit(10**9, None)  # no limit set
    assert not over_memory_limit(10**9, 0)
