"""The sandboxed evaluator: each candidate is built, checked and timed in its own process.

`SandboxEvaluator(task).evaluate(candidate)` writes the task and the candidate's code to a
temporary directory, starts `python -m pytest_kernelpro.optimize.sandbox.worker` in a new session
(its own process group) with an environment stripped of secrets, and watches it:

- build timeout until the worker reports "built", then run timeout (a hang is killed,
  whole process group, compiler children included) → status `timeout`;
- resident memory over the limit (polled from /proc; the worker also caps its address
  space on the CPU) → `run_error`, "out of memory";
- no result file (segfault, `os._exit`, a CUDA error that kills the process) → `run_error`
  (or `build_error` when it died while building), with the signal or exit code and the
  phase it was in.

Fast-path kernels (`pytest_kernelpro.optimize.build.load_cuda` calls the candidate's source makes
with literal arguments) are compiled before the worker starts, by a pool of build threads
that `prepare(candidates)` fills with a whole expansion at once; the worker finds them in
the build cache, which it may read but not write. `Evaluation.build_s` is the candidate's
build time on the critical path (the wait for its compiles plus the worker's build phase);
`metrics["build"]` has the compile times and each build (cache hit or not).

Nothing a candidate does can raise into the search or the pytest session, and every
candidate gets a fresh CUDA context, so the GPU is usable by the next one.

A worker ran candidate code, so everything it reports is a claim. What is decided over one
runs in processes that never load candidate code: the judge's check of a "correct"
candidate's saved outputs and its timing of the reference (`_judged`), the check of a
worker's "the reference failed" (`_reference_failure_claim`), and the winner's confirmation
by a fresh re-timing and ncu (`confirm`; the rule is `confirm.py`'s).

With `SandboxLimits.standby` > 0 the worker and judge processes are started ahead, inside
the same sandbox, with torch imported, and each is handed one task (`pool.py`).

Split by job: the task and the limits (`task.py`), the worker's environment
(`environment.py`), watching and ending processes (`processes.py`); the names are
re-exported here, where callers import them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.build.api import ARCH_ENV
from pytest_kernelpro.optimize.build.cache import CACHE_ENV, READONLY_ENV, BuildCache
from pytest_kernelpro.optimize.build.prebuild import Prebuilder
from pytest_kernelpro.optimize.sandbox.compile_cache import CompileCaches, point_caches
from pytest_kernelpro.optimize.sandbox.cuda_probe import cuda_init_failure
from pytest_kernelpro.optimize.sandbox.environment import (
    PACKAGE_ROOT,
    SAFE_NAMES,
    SAFE_PREFIXES,
    is_secret_name,
    scrub_environment,
)
from pytest_kernelpro.optimize.sandbox.footprint import check_fits
from pytest_kernelpro.optimize.sandbox.handles import (
    HANDLE_FD_ENV,
    HandleChannels,
    Received,
    socket_pair,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.sandbox.limit_notes import limit_note
from pytest_kernelpro.optimize.sandbox.measurement import PRECISION_KEY, session_fp32_precision
from pytest_kernelpro.optimize.sandbox.outside_view import (
    PhaseMark,
    claim_failure,
    tree_cpu_s,
    usable_cores,
)
from pytest_kernelpro.optimize.sandbox.pool import StandbyPool
from pytest_kernelpro.optimize.sandbox.processes import (
    ProcessRun,
    children,
    clear_stale_locks,
    die_with_parent,
    exited,
    kill_group,
    last_phase,
    log_tail,
    phase_seconds,
    remove_tree,
    sandbox_setup_error,
    tree_rss_mb,
    tree_size_mb,
)
from pytest_kernelpro.optimize.sandbox.project_view import (
    ProjectView,
    project_view,
    set_session_view,
)
from pytest_kernelpro.optimize.sandbox.safe_read import create_log, read_text
from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits
from pytest_kernelpro.optimize.sandbox.worker import RUN_PHASES
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.problem.locate import project_import_path

# A worker killed by a memory fault, and the phases whose checked calls read sealed, read-only
# inputs (the in-place check, phase "checks", refills writable inputs of its own).
FAULTS = (-signal.SIGSEGV, -signal.SIGBUS)
CHECKED_PHASES = ("correctness", "shapes", "timed")


class SandboxEvaluator:
    """An `Evaluator` that runs every candidate in a fresh, sandboxed worker process."""

    def __init__(self, task: KernelBenchTask, limits: SandboxLimits | None = None) -> None:
        self.task = task
        self.limits = limits or SandboxLimits()
        self._inflight = 0  # workers running now (evaluate_many runs several)
        self._inflight_lock = threading.Lock()
        # Called with each new phase the worker reports (progress displays); must not raise.
        self.on_phase: Callable[[str], None] | None = None
        default_ext = Path(tempfile.gettempdir()) / "kernelpro-torch-extensions"
        self.extensions_dir = Path(
            self.limits.extensions_dir or os.environ.get("TORCH_EXTENSIONS_DIR") or default_ext
        )
        self._isolation: Isolation | None = None
        self._reference_ok: bool | None = None  # set once the judge has run the reference
        self._fits: dict[str, Any] | None = None  # the problem's footprint, once it fits
        self.build_cache = BuildCache(self.limits.build_cache_dir, writable=True)
        # The builds ahead of the worker compile candidate input: in the worker's sandbox.
        self.build_cache.confine = self.confine_build
        self._build_arch: str | None | bool = False  # False: not looked up yet
        self._prebuilder: Prebuilder | None = None
        self._prebuilder_lock = threading.Lock()
        # The session's TF32 flags, read once here and sent with every task, so the sandbox's
        # fresh processes relax fp32 tolerances when the gate does.
        self.fp32_precision = session_fp32_precision()
        # Each correct candidate's Triton/CUDA/inductor caches, kept from its evaluation for
        # its profile, re-timing and re-measurement (never shared between candidates).
        self.compile_caches = CompileCaches()
        # Worker and judge processes started ahead with torch imported (`pool.py`).
        self.standbys = StandbyPool(self, self.limits.standby)
        # What every sandbox of this process shows of the project: computed once, here.
        self.project = task_project_view(task)
        set_session_view(self.project)
        # Every sandboxed process's channel: checked outputs by handle (`handles.py`).
        self.handles = HandleChannels(self.limits.outputs_limit_mb * 2**20)

    # ----- builds ahead of the worker (pytest_kernelpro.optimize.build) -----

    def build_arch(self) -> str | None:
        """The compile target of fast-path builds: $KERNELPRO_CUDA_ARCH, else the GPU's
        (None on a machine without one, where the worker builds nothing ahead)."""
        if self._build_arch is False:
            from pytest_kernelpro.optimize.build.api import default_arch

            arch: str | None
            try:  # a CPU task builds ahead only when asked to ($KERNELPRO_CUDA_ARCH)
                cpu_only = self.task.device == "cpu" and not os.environ.get(ARCH_ENV)
                arch = None if cpu_only else default_arch()
            except KernelproError:
                arch = None
            self._build_arch = arch
        return self._build_arch or None

    def _builder(self) -> Prebuilder | None:
        arch = self.build_arch()
        if arch is None:
            return None
        with self._prebuilder_lock:
            if self._prebuilder is None:
                self._prebuilder = Prebuilder(
                    self.build_cache, arch=arch, jobs=self.limits.build_jobs
                )
            return self._prebuilder

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Start compiling the candidates' fast-path kernels on the CPU cores (all of one
        expansion at once); `evaluate` then waits only for its own candidate's builds."""
        builder = self._builder()
        if builder is not None:
            builder.submit_many([c.code for c in candidates])

    def close(self) -> None:
        """Stop the build threads (pending builds are dropped); drop the kept caches."""
        if self._prebuilder is not None:
            self._prebuilder.close()
            self._prebuilder = None
        self.compile_caches.close()
        self.standbys.close()
        self.handles.close()

    def confine_build(self, command: list[str], scratch: Path, writable: list[Path]) -> list[str]:
        """A compile of the builds ahead (`Prebuilder`) as it runs in the candidates' sandbox:
        the worker's isolation, writing only `scratch` and `writable`, seeing what a worker
        sees (`view.py`); the compile dies with this process."""
        from pytest_kernelpro.optimize.sandbox.isolation import confinement

        return confinement(self.isolation, self.readable_paths())(command, scratch, writable)

    def readable_paths(self) -> list[Path]:
        """Shown read-only in the sandbox besides the Python installation and this package:
        the project (the task's sys.path) and the build cache (read-only for the worker)."""
        self.build_cache.root.mkdir(parents=True, exist_ok=True)
        return [self.build_cache.root, *(Path(p) for p in self.task.sys_path)]

    @property
    def isolation(self) -> Isolation:
        """How workers are isolated on this machine (probed once)."""
        if self._isolation is None:
            self._isolation = Isolation.probe(
                self.limits.isolation, cuda=self._needs_cuda(), env=self.environment()
            )
        return self._isolation

    def _run_seeded(self, code: str, workdir: Path) -> Evaluation:
        """`_run_worker` with the caches an earlier run of the same code kept (if any);
        `metrics["compile_cache"]` says whether it started warm."""
        (workdir / "home").mkdir(exist_ok=True)
        warm = self.compile_caches.seed(code, workdir / "home")
        evaluation = self._run_worker(workdir)
        evaluation.metrics["compile_cache"] = (
            "warm (kept from this code's evaluation)" if warm else "cold"
        )
        return evaluation

    def _reprobe_if_cuda_failed(self, evaluation: Evaluation) -> str | None:
        """When a failed run's log says CUDA itself did not start (`cuda_init_failure`),
        re-probe the ladder with the torch check (`Isolation.reprobe_cuda`, once per
        process); the new verdict when the isolation changed (the run is repeated), else
        None. Only for a CUDA task in the namespaces."""
        if evaluation.status not in ("run_error", "build_error") or not self._needs_cuda():
            return None
        if self._isolation is None or not self._isolation.isolated:
            return None
        failure = cuda_init_failure(f"{evaluation.reason}\n{evaluation.logs}")
        if failure is None:
            return None
        before = self._isolation
        found = Isolation.reprobe_cuda(self.limits.isolation, failure, env=self.environment())
        if found is None:
            return None
        self._isolation = found
        return found.verdict if found != before else None

    def _needs_cuda(self) -> bool:
        if self.task.device.startswith("cuda"):
            return True
        if self.task.device != "auto":
            return False
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())

    def environment(self, workdir: Path | None = None) -> dict[str, str]:
        """The worker's environment (scrubbed; package importable; shared build cache)."""
        env = scrub_environment(os.environ, self.limits.keep_env)
        if workdir is not None:
            # Caches (triton, CUDA's JIT cache) and temporary files go to the scratch
            # directory: everything else is read-only in the sandbox.
            for name, sub in (("HOME", "home"), ("TMPDIR", "tmp")):
                (workdir / sub).mkdir(exist_ok=True)
                env[name] = str(workdir / sub)
            env.pop("TMP", None)
            env.pop("TEMP", None)
            point_caches(env, workdir / "home")  # not a session's TRITON_CACHE_DIR
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
        )
        # ninja and nvcc wrappers live next to the interpreter in a virtualenv.
        env["PATH"] = os.pathsep.join(
            p for p in (str(Path(self.limits.python).parent), env.get("PATH", "")) if p
        )
        # torch's own extension builds (a load_inline the build cache does not take) go to the
        # worker's scratch directory: a directory shared by candidates would let one plant a
        # module that the next one imports.
        env["TORCH_EXTENSIONS_DIR"] = str(
            workdir / "torch-extensions" if workdir is not None else self.extensions_dir
        )
        env["PYTHONUNBUFFERED"] = "1"  # a crash keeps everything printed before it
        # The worker reads the build cache but never writes it: a candidate cannot plant an
        # entry that a later candidate would load. Its misses build in its own directory.
        env[CACHE_ENV] = str(self.build_cache.root)
        env[READONLY_ENV] = "1"
        arch = self.build_arch()
        if arch is not None:
            env[ARCH_ENV] = arch  # the same target as the builds made ahead
        env.setdefault("MALLOC_ARENA_MAX", "4")  # fewer 64 MB arenas under RLIMIT_AS
        return env

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """Build, check and time `candidate` in a worker; never raises for its failures
        (a problem too large for this machine is refused, `footprint.py`)."""
        if self._fits is None:  # once, before any worker starts: the problem's, not a candidate's
            self._fits = check_fits(
                self.task.name, self.task.reference, self.limits.memory_limit_mb
            )
        workdir = self.standbys.scratch_dir("kernelpro-eval-")
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
        }
        received = Received()
        builder = self._builder()
        waiting = time.monotonic()
        prebuilt = builder.wait(candidate.code) if builder is not None else None
        waited = time.monotonic() - waiting  # compiles still running when this one's turn came
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            evaluation = self._run_seeded(candidate.code, workdir)
            received = self.handles.finish(workdir)
            reprobed = self._reprobe_if_cuda_failed(evaluation)
            if reprobed is not None:
                # CUDA did not start under the rung the driver check or the machine's cache
                # chose: run it once more under what the torch check found, and say so.
                remove_tree(workdir)
                workdir.mkdir()
                received.close()  # nothing of the failed run is judged
                (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
                evaluation = self._run_seeded(candidate.code, workdir)
                received = self.handles.finish(workdir)
                evaluation.metrics["sandbox_reprobe"] = reprobed
            if evaluation.status == "correct":
                # Its later runs (profile, re-timing, re-measurement) start from these.
                self.compile_caches.keep(candidate.code, workdir / "home")
            if prebuilt is not None:
                # On the critical path: the wait for this candidate's compiles (they may have
                # run while earlier candidates were on the GPU) and the worker's build phase.
                # What the compiles took is in metrics["build"]["prebuild"].
                evaluation.build_s += waited
                evaluation.wall_s += waited
                evaluation.metrics.setdefault("build", {})["prebuild"] = {
                    **prebuilt.to_dict(),
                    "waited_s": round(waited, 4),
                }
            evaluation.metrics["sandbox"] = self.isolation.describe()
            evaluation.metrics["footprint"] = self._fits
            if evaluation.status == "correct" and self.limits.judge:
                evaluation = self._judged(evaluation, received)
            evaluation.metrics["wall_split"] = wall_split(evaluation.metrics, waited)
            # Its host memory at the peak: the worker's or the judge's, each with the outputs
            # held by handle (`_watch`).
            evaluation.metrics["peak_mb"] = max(
                float(evaluation.metrics.get(key) or 0.0)
                for key in ("worker_peak_mb", "judge_peak_mb")
            )
            # Whatever the candidate wrote (errors, output, build logs) leaves here only
            # redacted and without control characters (text_safety).
            return evaluation.made_safe()
        finally:
            # Its outputs' memory goes with the evaluation (the worker's died with it).
            received.close()
            self.handles.finish(workdir).close()
            self.standbys.release(workdir)
            if not self.limits.keep_workdirs:
                self.standbys.remove(workdir)
            # The next candidate's processes import torch while the search generates it.
            self.standbys.fill()

    def _task_payload(self) -> dict[str, Any]:
        return {
            **asdict(self.task),
            "forbidden_ops": list(self.task.forbidden_ops),
            "timing": dict(self.task.timing),
            "sys_path": list(self.task.sys_path),
            PRECISION_KEY: self.fp32_precision,
        }

    def evaluate_many(self, candidates: Sequence[Candidate], *, jobs: int = 1) -> list[Evaluation]:
        """Evaluate several candidates, `jobs` workers at a time (CPU only: on one GPU,
        concurrent timing would disturb each other)."""
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(self.evaluate, candidates))

    # ----- the worker process -----

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
        evaluation = _outside_check(evaluation, run)
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
        while True:
            if exited(proc):
                break
            now = time.monotonic()
            seen = last_phase(progress_path) or phase
            if marks is not None:
                _mark_timing_phase(marks, seen, now, proc.pid)
            if seen != phase and self.on_phase is not None:
                self.on_phase(seen)
            phase = seen
            if run_started is None and phase in RUN_PHASES:
                run_started = now
                deadline = now + limits.run_timeout_s
            # Its processes' pages, and the outputs it handed over (a worker) or was handed
            # (a judge) counted once: the pages of them it maps are taken off its shared
            # pages (a shared mapping of its own beyond them still counts).
            handed_mb = self.handles.held_bytes(workdir) / 2**20
            resident, count = tree_rss_mb(proc.pid, count=True)
            shared = resident - tree_rss_mb(proc.pid, shared=False)
            rss = resident - min(shared, handed_mb) + handed_mb
            peak_mb = max(peak_mb, rss)
            peak_processes = max(peak_processes, count)
            if limits.memory_limit_mb and rss > limits.memory_limit_mb:
                killed = "memory"
            elif limits.max_processes and count > limits.max_processes:
                killed = "processes"
            elif self.handles.over_limit(workdir):
                killed = "outputs"
            elif limits.scratch_limit_mb and now >= next_disk_check:
                next_disk_check = now + 0.5
                if tree_size_mb(progress_path.parent) > limits.scratch_limit_mb:
                    killed = "disk"
            elif now > deadline:
                killed = "timeout"
            elif os.path.lexists(result_path):
                # The worker exits right after writing; give it a moment, then stop waiting.
                result_seen = result_seen or now
                if now - result_seen > 10.0:
                    killed = "linger"
            if killed:
                break
            time.sleep(delay)
            # Finer while the worker times: its end must be seen close to when it happens.
            delay = min(delay * 1.5, POLL_TIMING_S if phase == "timing" else POLL_S)
        if marks is not None and "timing" in marks and "timed" not in marks:
            # The worker ended before a poll saw it leave "timing": the last poll that saw it
            # timing is the end the parent can vouch for.
            marks["timed"] = marks["timing_last"]
        kill_group(proc)  # also stray children of a worker that exited on its own
        proc.wait()
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

    # ----- the trusted side: decided over a worker's claim, in processes without candidate
    # code (the worker ran candidate code, so everything it reports is a claim) -----

    def _run_judge(self, outputs: Received | None, *, retime: bool = False) -> dict[str, Any]:
        """Run judge.py (no candidate code) in a fresh sandboxed process, the worker's
        `outputs` forwarded to it by handle; its JSON result."""
        judgedir = self.standbys.scratch_dir("kernelpro-judge-", judge=True)
        if outputs is not None:
            self.handles.forward(judgedir, outputs)
        try:
            task = {**self._task_payload(), "retime": retime}
            (judgedir / "task.json").write_text(json.dumps(task), "utf-8")
            command = [
                self.limits.python,
                "-m",
                "pytest_kernelpro.optimize.sandbox.judge",
                "--task",
                str(judgedir / "task.json"),
                "--result",
                str(judgedir / "judge.json"),
                "--outputs-by-handle" if outputs is not None else "--preflight",
            ]
            run = self._launch(
                command, judgedir, judgedir / "progress.log", judgedir / "judge.json"
            )
            try:
                verdict = dict(json.loads(read_text(judgedir / "judge.json")))
                # Host memory at its peak: the judge's processes and the outputs it was handed.
                verdict["peak_mb"] = round(run.peak_mb, 1)
                return verdict
            except (OSError, ValueError):
                return {
                    "ok": False,
                    "judge_error": f"the judge process ended without a result ({run.how()}, "
                    f"{run.killed or 'not killed'})\n{run.logs[-4000:]}",
                }
        finally:
            self.handles.finish(judgedir)  # the judge's mappings died with it
            self.standbys.release(judgedir)
            if not self.limits.keep_workdirs:
                self.standbys.remove(judgedir)

    def _reference_error(self, verdict: Mapping[str, Any]) -> KernelproError:
        return KernelproError(
            f"The reference of task {self.task.name!r} fails in a trusted process, so no "
            f"candidate can be checked: {verdict.get('reference_error')}. Fix the problem file "
            f"(class Model, get_inputs, get_init_inputs).\n{verdict.get('traceback', '')}"
        )

    def _judged(self, evaluation: Evaluation, outputs: Received) -> Evaluation:
        """The worker's "correct" is a claim: the judge checks its saved outputs and times
        the reference; the speedup is the judge's reference time over the candidate's."""
        if outputs.refused is not None:  # an honest worker's outputs always pass
            return Evaluation(
                status="cheat",
                reason="result not confirmed: the outputs it handed over were refused "
                f"({outputs.refused})",
                correctness=evaluation.correctness,
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        started = time.perf_counter()
        verdict = self._run_judge(outputs)
        # The judge's own process (the search's wall split counts it as the check's).
        evaluation.metrics["judge_s"] = time.perf_counter() - started
        evaluation.metrics["judge_peak_mb"] = verdict.get("peak_mb")
        # A failed judge names the reference's exception in "reference_error"; a passing one
        # carries the correctness rule's "reference_error" (its normwise error): not a failure.
        if not verdict.get("ok") and verdict.get("reference_error"):
            raise self._reference_error(verdict)
        if verdict.get("judge_error"):
            return Evaluation(
                status="run_error",
                reason="the trusted check of this candidate's outputs did not finish: "
                + str(verdict["judge_error"]).splitlines()[0],
                logs=evaluation.logs + "\n" + str(verdict["judge_error"]),
                metrics=evaluation.metrics,
                wall_s=evaluation.wall_s,
            )
        self._reference_ok = True
        if not verdict.get("ok"):
            return Evaluation(
                status="cheat",
                reason="result not confirmed: the worker reported a correct result, but the "
                "outputs it handed over differ from the reference computed in a trusted "
                f"process ({verdict.get('reason')})",
                correctness=evaluation.correctness,
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        ref_timing = dict(verdict.get("reference_timing") or {})
        candidate_s = _positive(evaluation.timing.get("candidate", {}).get("median_s"))
        ref_s = _positive(ref_timing.get("median_s"))
        if candidate_s is None or ref_s is None:
            return Evaluation(
                status="run_error",
                reason=f"no usable timing (candidate median {candidate_s!r}, reference "
                f"median {ref_s!r} from the trusted process)",
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        evaluation.timing["reference_in_worker"] = evaluation.timing.get("reference")
        evaluation.timing["reference"] = ref_timing
        evaluation.speedup = ref_s / candidate_s
        evaluation.metrics["ref_median_s"] = ref_s
        evaluation.correctness["verified_by"] = (
            "judge: outputs of " + ", ".join(verdict.get("checked") or []) + " compared with "
            "the reference in a process without candidate code"
        )
        return evaluation

    def confirm(self, candidate: Candidate, evaluation: Evaluation) -> Evaluation:
        """Confirm a winner's time: re-time it in a fresh sandboxed worker the way the search
        timed it, by the gate's timer on fresh inputs with checked outputs (`worker.retime`),
        have the judge check the output of a call made after timing, and compare the fresh median
        and ncu's kernel durations (where the candidate was profiled) with the time the
        search used (`search.confirm.confirm_timing`: the rule and its tolerances).

        A mismatch disqualifies the candidate (status `cheat`) with the numbers in the
        reason; otherwise `timing["confirmed"]` holds the re-timing and the comparison (the
        judge checks the re-timed output and times nothing: the speedups are the final
        re-measurement's). Only correct evaluations are confirmed.
        """
        from pytest_kernelpro.optimize.sandbox.confirm import confirm_timing

        if evaluation.status != "correct":
            return evaluation
        claimed = _positive((evaluation.timing.get("candidate") or {}).get("median_s"))
        # In the pool's area, as an evaluation's: the judge (a standby started ahead) reads
        # outputs only there.
        workdir = self.standbys.scratch_dir("kernelpro-retime-")
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
            "retime": True,
        }
        outputs = Received()
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            retimed = self._run_seeded(candidate.code, workdir)
            outputs = self.handles.finish(workdir)
            if retimed.status != "correct":
                return _disqualified(
                    evaluation, f"timing not confirmed: the re-timing run failed ({retimed.reason})"
                )
            verdict = self._run_judge(outputs, retime=True)
        finally:
            outputs.close()
            self.handles.finish(workdir).close()
            self.standbys.release(workdir)
            if not self.limits.keep_workdirs:
                self.standbys.remove(workdir)
        if not verdict.get("ok"):
            why = (
                verdict.get("reason")
                or verdict.get("reference_error")
                or verdict.get("judge_error")
            )
            return _disqualified(
                evaluation,
                f"timing not confirmed: the output of the re-timed kernel is wrong ({why})",
            )
        raw = dict(retimed.timing.get("retimed") or {})
        samples = raw.get("samples_s")
        # Set by the profiling evaluator (optimize/candidate_profile/evaluator.py) for a profiled candidate.
        ncu_s = _positive((evaluation.metrics.get("profile") or {}).get("ncu_gpu_time_s"))
        outcome = confirm_timing(
            claimed or 0.0,
            samples if isinstance(samples, list) else [],
            device_kind="cuda" if self._needs_cuda() else "cpu",
            tolerance=self.limits.confirm_tolerance,
            ncu_s=ncu_s,
            method=str(raw.get("method") or ""),
        )
        # No reference time: the judge checks the re-timed output only (the speedups are the
        # final re-measurement's, interleaved with the current kernel and the reference).
        confirmed = {
            **outcome.record,
            "warmup_runs": raw.get("warmup_runs"),
            "honesty": raw.get("honesty"),
        }
        if not outcome.ok:
            disqualified = _disqualified(evaluation, outcome.reason)
            disqualified.timing["confirmation"] = confirmed
            return disqualified
        if outcome.reason:  # a disagreement the winner survives (confirm.py)
            confirmed["reason"] = outcome.reason
        evaluation.timing["confirmed"] = confirmed
        return evaluation

    def _reference_failure_claim(self, evaluation: Evaluation) -> Evaluation:
        """A worker says the reference failed. Its process may have run candidate code, so
        the claim is checked in a trusted process before the user's problem is blamed."""
        if self._reference_ok is None:
            verdict = self._run_judge(None)
            if not verdict.get("ok") and verdict.get("reference_error"):
                raise self._reference_error(verdict)
            self._reference_ok = bool(verdict.get("ok"))
        return Evaluation(
            status="run_error",
            reason="the worker reported that the reference failed, but the reference runs "
            "in a trusted process: counted as this candidate's failure "
            f"({str(evaluation.reason or '')[:200]})",
            build_log=evaluation.build_log,
        )


def task_project_view(task: KernelBenchTask) -> ProjectView:
    """The project view of `task` (`project_view.py`): the project is the working directory
    and the import path entries of the task and of this process that are not installed
    software; its imports are the entry files' and the reference's."""
    cwd = os.getcwd()
    roots = [cwd, *project_import_path(task.sys_path), *project_import_path()]
    return project_view(
        roots,
        entries=task.view_entries,
        sources=(task.reference,),
        data=task.sandbox_data,
        rootdir=task.rootdir or cwd,
    )


# The worker's phases (`worker.BUILD_PHASES`, `RUN_PHASES`; `launch`: the sandbox's setup and
# the interpreter's start before its first line) by the part of an evaluation they are.
SPLIT_PHASES = {
    "sandbox_start_s": ("launch", "start", "import"),
    "build_s": ("build",),
    "checks_s": ("reference", "built", "correctness", "checks", "shapes", "timed", "done"),
    "timing_s": ("timing",),
}


def wall_split(metrics: Mapping[str, Any], prebuild_wait_s: float = 0.0) -> dict[str, float]:
    """One evaluation's wall time by part: the sandbox's start, the build (with the wait for
    compiles made ahead), the checks, the timing (from the worker's progress lines) and the
    judge's process."""
    phases = metrics.get("phases") or {}
    split = {
        part: round(sum(float(phases.get(name) or 0.0) for name in names), 3)
        for part, names in SPLIT_PHASES.items()
    }
    split["build_s"] = round(split["build_s"] + prebuild_wait_s, 3)
    split["judge_s"] = round(float(metrics.get("judge_s") or 0.0), 3)
    return split


def _disqualified(evaluation: Evaluation, reason: str) -> Evaluation:
    return Evaluation(
        status="cheat",
        reason=reason,
        timing=evaluation.timing,
        correctness=evaluation.correctness,
        metrics=evaluation.metrics,
        logs=evaluation.logs,
        wall_s=evaluation.wall_s,
    )


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 and value == value and value != float("inf") else None


# The parent's progress polling interval at its longest (`SandboxEvaluator._watch`), and
# while the worker is in its timing phase.
POLL_S = 0.2
POLL_TIMING_S = 0.05
_AFTER_TIMING = ("timed", "done")


def _mark_timing_phase(marks: dict[str, Any], seen: str, now: float, pid: int) -> None:
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


def _outside_check(evaluation: Evaluation, run: ProcessRun) -> Evaluation:
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


__all__ = [
    "PACKAGE_ROOT",
    "SAFE_NAMES",
    "SAFE_PREFIXES",
    "KernelBenchTask",
    "SandboxEvaluator",
    "SandboxLimits",
    "is_secret_name",
    "scrub_environment",
]
