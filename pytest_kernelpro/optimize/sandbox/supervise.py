"""Starting a sandboxed process, watching it to its end, and saying how it ended.

`WorkerSupervision` is the part of `SandboxEvaluator` (`evaluator.py`) that runs the worker
and the judge: `start_sandboxed` starts a command in the sandbox in its own process group
(the one launch of the worker, the judge and the standbys), `_launch` runs it (or hands it to
a standby, `pool.py`) and `_watch` polls it:

- build timeout until the worker reports "built", then run timeout (a hang is killed,
  whole process group, compiler children included) -> status `timeout`;
- resident memory over the limit (polled from /proc; the worker also caps its address
  space on the CPU) -> `run_error`, "out of memory"; likewise too many processes, too many
  checked outputs handed over, a full scratch directory;
- no result file (segfault, `os._exit`, a CUDA error that kills the process) -> `run_error`
  (or `build_error` when it died while building), with the signal or exit code and the
  phase it was in (`_classify`).

The worker's claimed timing phase is held against what the parent saw of it
(`mark_timing_phase`, `outside_check`, the rule in `outside_view.py`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox.handles import HANDLE_FD_ENV, HandleChannels, socket_pair
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.sandbox.limit_notes import limit_note
from pytest_kernelpro.optimize.sandbox.outside_view import (
    PhaseMark,
    claim_failure,
    tree_cpu_s,
    usable_cores,
)
from pytest_kernelpro.optimize.sandbox.pool import StandbyPool
from pytest_kernelpro.optimize.sandbox.processes import (
    ExitWait,
    ProcessRun,
    children,
    clear_stale_locks,
    die_with_parent,
    exited,
    kill_group,
    last_phase,
    log_tail,
    phase_seconds,
    sandbox_setup_error,
    tree_rss_mb,
    tree_size_mb,
)
from pytest_kernelpro.optimize.sandbox.safe_read import create_log, read_text
from pytest_kernelpro.optimize.sandbox.task import SandboxLimits
from pytest_kernelpro.optimize.sandbox.worker import RUN_PHASES
from pytest_kernelpro.optimize.search.interfaces import Evaluation

# A worker killed by a memory fault, and the phases whose checked calls read sealed, read-only
# inputs (the in-place check, phase "checks", refills writable inputs of its own).
FAULTS = (-signal.SIGSEGV, -signal.SIGBUS)
CHECKED_PHASES = ("correctness", "shapes", "timed")

# The parent's progress polling interval at its longest (`WorkerSupervision._watch`), and
# while the worker is in its timing phase.
POLL_S = 0.2
POLL_TIMING_S = 0.05
_AFTER_TIMING = ("timed", "done")


def over_memory_limit(own_mb: float, limit_mb: int | None) -> bool:
    """The watchdog's memory rule, per process: a process is killed on its own memory (its
    pages and the outputs it handed over not yet checked), never on another's. A judge's
    memory is the session's cost (no candidate code runs in it; the up-front estimate,
    `footprint.py`, bounds it): were the worker and the judge summed, a judge near its peak
    would kill an honest candidate beside it, charged with the judge's memory."""
    return bool(limit_mb) and own_mb > float(limit_mb or 0)


def mark_timing_phase(marks: dict[str, Any], seen: str, now: float, pid: int) -> None:
    """`PhaseMark`s of the worker's timing phase: "timing" at the first poll that saw it,
    "timed" at the last poll that still saw it (set once a later phase, "timed" or "done", or
    the worker's exit is seen). The phase surely lasted from the first to the last of those
    polls, however late the parent's polls ran: a loaded machine can shorten the parent's
    window, never lengthen it, so it cannot make an honest claim look short."""
    if "timed" in marks:
        return
    if seen == "timing":
        mark = PhaseMark(now, tree_cpu_s(pid, children))
        marks.setdefault("timing", mark)
        marks["timing_last"] = mark
    elif seen in _AFTER_TIMING and "timing" in marks:
        marks["timed"] = marks["timing_last"]


def outside_check(evaluation: Evaluation, run: ProcessRun) -> Evaluation:
    """A correct evaluation whose claimed timing phase is shorter than its parent saw is a
    cheat (`outside_view.claim_failure`)."""
    if evaluation.status != "correct":
        return evaluation
    marks = run.phase_marks
    claimed = (evaluation.timing or {}).get("phase_s")
    failure = claim_failure(
        claimed if isinstance(claimed, (int, float)) else None,
        marks.get("timing"),
        marks.get("timed"),
        poll_s=POLL_TIMING_S,
        cores=int(marks.get("cores") or 1),
    )
    if failure is None:
        return evaluation
    evaluation.status, evaluation.reason, evaluation.speedup = "cheat", failure, None
    return evaluation


class WorkerSupervision:
    """Runs sandboxed processes for `SandboxEvaluator` and turns a worker's end into an
    `Evaluation`. What it uses of the evaluator is annotated here; the evaluator sets it."""

    limits: SandboxLimits
    extensions_dir: Path
    handles: HandleChannels
    standbys: StandbyPool
    isolation: Isolation
    on_phase: Callable[[str], None] | None
    _inflight: int  # workers running now (evaluate_many runs several)
    memory_now: dict[Path, tuple[float, float]]  # per process: last resident, shared MB
    both_peak_mb: dict[Path, float]  # per worker: its peak with the judge beside it
    # Per worker: at that peak, its phase and each process's share (where the peak is).
    both_peak_at: dict[Path, dict[str, Any]]
    _inflight_lock: threading.Lock
    environment: Callable[[Path | None], dict[str, str]]
    readable_paths: Callable[[], list[Path]]
    # The check of a worker's "the reference failed" (`worker_claims.py`).
    _reference_failure_claim: Callable[[Evaluation], Evaluation]

    def _run_worker(self, workdir: Path) -> Evaluation:
        result_path, progress_path = workdir / "result.json", workdir / "progress.log"
        command = [
            self.limits.python,
            "-m",
            "pytest_kernelpro.optimize.sandbox.worker",
            "--task",
            str(workdir / "task.json"),
            "--result",
            str(result_path),
            "--progress",
            str(progress_path),
        ]
        run = self._launch(command, workdir, progress_path, result_path)
        ended = time.monotonic()
        evaluation = self._classify(run, result_path)
        evaluation = outside_check(evaluation, run)
        evaluation.reason = limit_note(evaluation.reason, self.limits)
        evaluation.logs = run.logs
        evaluation.wall_s = run.wall_s
        # Host memory at its peak: the worker's processes and the outputs it handed over.
        evaluation.metrics["worker_peak_mb"] = round(run.peak_mb, 1)
        standby = self.standbys.handover(workdir)
        if standby is not None:
            evaluation.metrics["standby"] = standby
        # Where the worker's wall time went (the sandbox's start, imports, checks, timing).
        phases = phase_seconds(progress_path, ended - run.wall_s, ended)
        if phases:
            evaluation.metrics["phases"] = phases
        if not evaluation.build_log and evaluation.status == "build_error":
            evaluation.build_log = run.logs
        return evaluation

    def _launch(
        self,
        command: list[str],
        workdir: Path,
        progress_path: Path,
        result_path: Path,
        readable: Sequence[Path] = (),
        writable: Sequence[Path] = (),
    ) -> ProcessRun:
        """Run `command` in the sandbox with `workdir` as its scratch directory; watch it.
        `readable`: shown read-only besides `readable_paths()` (the judge's outputs);
        `writable`: writable besides the scratch directory (the worker's outputs)."""
        handed = self.standbys.launch(
            command, workdir, progress_path, result_path, readable=readable, writable=writable
        )
        if handed is not None:  # a process started ahead for `workdir` ran it
            return handed
        limits = self.limits
        started = time.monotonic()
        with self._inflight_lock:
            self._inflight += 1
        # Created here, before the process runs, and read back through these descriptors:
        # never through their names, which the candidate can replace (`safe_read`).
        with create_log(workdir / "stdout.log") as out, create_log(workdir / "stderr.log") as err:
            proc = self.start_sandboxed(
                command, workdir, writable, [*self.readable_paths(), *readable], out, err
            )
            marks: dict[str, Any] = {}
            try:
                killed, phase, peak_mb = self._watch(
                    proc, progress_path, result_path, started, marks
                )
            except BaseException:  # Ctrl-C in the session: the worker (own session) must go too
                kill_group(proc)
                proc.wait()
                with self._inflight_lock:
                    self._inflight -= 1
                raise
            wall = time.monotonic() - started
            logs = log_tail(out, err, limits.log_chars)
        with self._inflight_lock:
            self._inflight -= 1
            # A build killed or crashed mid-way may leave torch's build lock behind, which
            # would make every later build with that extension name wait forever. Only when
            # no other worker runs: a sibling's fresh lock must not be taken away.
            died = killed is not None or not os.path.lexists(result_path)
            if died and phase not in RUN_PHASES and self._inflight == 0:
                clear_stale_locks(self.extensions_dir, started)
        marks["cores"] = usable_cores(proc.pid) if marks else 1
        return ProcessRun(proc.returncode, killed, phase, peak_mb, wall, logs, marks)

    def start_sandboxed(
        self,
        command: list[str],
        workdir: Path,
        writable: Sequence[Path],
        readable: Sequence[Path],
        stdout: IO[bytes],
        stderr: IO[bytes],
    ) -> subprocess.Popen[bytes]:
        """Start `command` in the sandbox (scratch `workdir`; `writable` and `readable` shown
        besides it) in its own process group, logging to `stdout` and `stderr`. The one
        launch of the worker, the judge and the standbys: their views differ, nothing else."""
        env = self.environment(workdir)
        wrapped = self.isolation.wrap(
            command,
            scratch=workdir,
            writable=writable,
            readable=readable,
            python=self.limits.python,
            file_limit_mb=self.limits.scratch_limit_mb,
            process_limit=self.limits.max_processes,
            open_files_limit=self.limits.max_open_files,
            env=env,  # its PATH, LD_LIBRARY_PATH and CUDA directories are shown
        )
        # Its end of the channel that carries checked outputs by handle (`handles.py`).
        ours, theirs = socket_pair()
        env[HANDLE_FD_ENV] = str(theirs.fileno())
        # If the process watching it dies (a Dask worker killed mid-search, a session killed
        # with SIGKILL), the sandbox goes too instead of running on unwatched.
        try:
            proc = subprocess.Popen(
                [*die_with_parent(), *wrapped],
                cwd=workdir,
                env=env,
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.handles.open(workdir, ours)
        return proc

    def _watch(
        self,
        proc: subprocess.Popen[bytes],
        progress_path: Path,
        result_path: Path,
        started: float,
        marks: dict[str, Any] | None = None,
    ) -> tuple[str | None, str, float]:
        """Wait for the worker; kill its group on a timeout or memory overrun. `marks` gets
        a `PhaseMark` for the "timing" phase and for its end (`_mark_timing_phase`).

        Returns (why it was killed or None, last phase, peak RSS in MB).
        """
        limits = self.limits
        deadline = started + limits.build_timeout_s
        run_started: float | None = None
        phase, peak_mb, killed, peak_processes = "start", 0.0, None, 0
        result_seen: float | None = None
        next_disk_check = started
        # The checked outputs handed over so far (`handles.py`): host memory of this
        # evaluation, held by the session's descriptors.
        workdir = progress_path.parent
        delay = 0.02
        with ExitWait(proc) as wait:
            while True:
                if exited(proc):
                    break
                now = time.monotonic()
                seen = last_phase(progress_path) or phase
                if marks is not None:
                    mark_timing_phase(marks, seen, now, proc.pid)
                if seen != phase and self.on_phase is not None:
                    self.on_phase(seen)
                phase = seen
                if run_started is None and phase in RUN_PHASES:
                    run_started = now
                    deadline = now + limits.run_timeout_s
                if self.handles.judging_live_worker(workdir):
                    # A judge beside a worker (trusted code, no phases of its own) lives through
                    # the worker's checks and timing, which the worker's own limits bound, and
                    # then decides and times the reference: its run limit counts from the
                    # worker's end. Its build limit alone (300 s) killed the judges of a
                    # 16384x32768 softmax while their workers, under the run limit scaled to
                    # the gate's time, were still timing
                    # (bench/results/2026-12-06-optimizer-speed12-cpu.md).
                    deadline = max(deadline, now + limits.run_timeout_s)
                # This process's own memory: its processes' pages, and the outputs it handed over
                # (a worker, until the judge has checked them) or was handed (a judge) counted
                # once: the pages of them it maps are taken off its shared pages (a shared
                # mapping of its own beyond them still counts).
                handed_mb = self.handles.held_bytes(workdir) / 2**20
                resident, count = tree_rss_mb(proc.pid, count=True)
                shared = resident - tree_rss_mb(proc.pid, shared=False)
                own_mb = resident - min(shared, handed_mb) + handed_mb
                peak_mb = max(peak_mb, own_mb)
                self.memory_now[workdir] = (resident, shared)
                judge_dir = self.handles.judge_of(workdir)
                if judge_dir is not None:
                    # The worker and the judge beside it at once, reported, never a limit: the
                    # judge's pages of the output it maps are the handed-over bytes already counted.
                    judge_resident, judge_shared = self.memory_now.get(judge_dir, (0.0, 0.0))
                    both = own_mb + judge_resident - min(judge_shared, handed_mb)
                    if both > self.both_peak_mb.get(workdir, 0.0):
                        self.both_peak_mb[workdir] = both
                        self.both_peak_at[workdir] = {
                            "worker_phase": phase,
                            "worker_mb": round(own_mb, 1),
                            "judge_mb": round(both - own_mb, 1),
                        }
                peak_processes = max(peak_processes, count)
                if over_memory_limit(own_mb, limits.memory_limit_mb):
                    killed = "memory"
                elif limits.max_processes and count > limits.max_processes:
                    killed = "processes"
                elif self.handles.over_limit(workdir):
                    killed = "outputs"
                elif limits.scratch_limit_mb and now >= next_disk_check:
                    next_disk_check = now + 0.5
                    if tree_size_mb(progress_path.parent) > limits.scratch_limit_mb:
                        killed = "disk"
                # The judge's checks while the worker waits for them are not the candidate's time.
                elif now > deadline + self.handles.judge_time_s(workdir):
                    killed = "timeout"
                elif os.path.lexists(result_path):
                    # The worker exits right after writing; give it a moment, then stop waiting.
                    result_seen = result_seen or now
                    if now - result_seen > 10.0:
                        killed = "linger"
                if killed:
                    break
                wait.pause(delay)  # ends early when the worker exits
                # Finer while the worker times: its end must be seen close to when it happens.
                delay = min(delay * 1.5, POLL_TIMING_S if phase == "timing" else POLL_S)
        if marks is not None and "timing" in marks and "timed" not in marks:
            # The worker ended before a poll saw it leave "timing": the last poll that saw it
            # timing is the end the parent can vouch for.
            marks["timed"] = marks["timing_last"]
        kill_group(proc)  # also stray children of a worker that exited on its own
        proc.wait()
        self.memory_now.pop(workdir, None)
        # The worker may have moved on since the last poll: the file has its final phase.
        return killed, last_phase(progress_path) or phase, peak_mb

    def _classify(self, run: ProcessRun, result_path: Path) -> Evaluation:
        killed, phase, peak_mb = run.killed, run.phase, run.peak_mb
        in_build = phase not in RUN_PHASES
        if os.path.lexists(result_path) and killed not in (
            "memory",
            "disk",
            "outputs",
            "processes",
        ):
            try:
                data = json.loads(read_text(result_path))
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                harness_error = data.pop("harness_error", None)
                evaluation = Evaluation.from_dict(data)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                return Evaluation(status="run_error", reason=f"unreadable worker result: {exc}")
            if harness_error:
                return self._reference_failure_claim(evaluation)
            if isinstance(data.get("build"), dict):
                worker = dict(data["build"], worker_s=evaluation.build_s)
                evaluation.metrics["build"] = worker
            return evaluation
        if killed == "memory":
            return Evaluation(
                status="run_error",
                reason=f"out of memory: resident memory {peak_mb:.0f} MB passed the "
                f"{self.limits.memory_limit_mb} MB limit in phase {phase!r} (killed; "
                "SandboxLimits.memory_limit_mb, by default half of this machine's memory)",
            )
        if killed == "processes":
            return Evaluation(
                status="run_error",
                reason=f"too many processes: the candidate's processes passed the "
                f"{self.limits.max_processes} process limit in phase {phase!r} (killed; "
                "SandboxLimits.max_processes)",
            )
        if killed == "outputs":
            return Evaluation(
                status="run_error",
                reason=f"outputs too large: the candidate wrote more than "
                f"{self.limits.outputs_limit_mb} MB of checked outputs in phase {phase!r} "
                "(killed; SandboxLimits.outputs_limit_mb)",
            )
        if killed == "disk":
            return Evaluation(
                status="run_error",
                reason=f"scratch disk full: the candidate wrote more than "
                f"{self.limits.scratch_limit_mb} MB into its scratch directory in phase "
                f"{phase!r} (killed)",
            )
        if killed == "timeout":
            limit = self.limits.build_timeout_s if in_build else self.limits.run_timeout_s
            what = "build" if in_build else "run"
            return Evaluation(
                status="timeout",
                reason=f"no result within the {limit:g}s {what} timeout (phase {phase!r}); "
                + (
                    "every process of its PID namespace killed"
                    if self.isolation.isolated
                    else "process group killed"
                ),
            )
        setup = sandbox_setup_error(run.logs) if run.returncode == 125 else None
        if setup:
            raise KernelproError(
                f"The candidate sandbox could not be set up ({setup}); no candidate runs "
                "without it. Use SandboxLimits(isolation='fallback') to run with the weaker "
                "isolation, or fix the mount that cannot be made read-only."
            )
        reason = f"worker died ({run.how()}) without a result in phase {phase!r}"
        if run.returncode in FAULTS and phase in CHECKED_PHASES:
            reason += (
                "; a checked call's inputs are read-only shared memory (`input_handles.py`): "
                "a kernel that writes into its inputs where the reference does not faults there"
            )
        return Evaluation(status="build_error" if phase == "build" else "run_error", reason=reason)
