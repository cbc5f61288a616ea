"""The sandboxed evaluator: each candidate is built, checked and timed in its own process.

`SandboxEvaluator(task).evaluate(candidate)` writes the task and the candidate's code to a
temporary directory, starts `python -m pytest_kernelpro.optimize.sandbox.worker` in a new session
(its own process group) with an environment stripped of secrets, and watches it: a hang, a
memory or process overrun, a crash each end as a failed evaluation with the limit and the
phase in its reason (`supervise.py`).

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
candidate's saved outputs and its timing of the reference, and the check of a worker's "the
reference failed" (`worker_claims.py`), and the winner's confirmation by a fresh re-timing
and ncu (`confirm_winner.py`; the rule is `confirm.py`'s).

With `SandboxLimits.standby` > 0 the worker and judge processes are started ahead, inside
the same sandbox, with torch imported, and each is handed one task (`pool.py`).

This module keeps the orchestration: the builds ahead, the sandbox's environment and
isolation, `evaluate`, `evaluate_many`, `prepare`, `close`. The other jobs live in:

- `supervise.py`: starting a sandboxed process, watching it, classifying how a worker ended;
- `worker_claims.py`: the judge's decisions over a worker's claims;
- `confirm_winner.py`: the winner's confirmation run (its rule: `confirm.py`);
- `wall_split.py`: one evaluation's wall time by part;
- `project_view.py` (`task_project_view`): what the task's sandboxes show of the project;
- `task.py` (the task and the limits, re-exported here, where most callers import them),
  `environment.py` (the scrubbed environment), `processes.py` (watching and ending processes).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.build.api import ARCH_ENV
from pytest_kernelpro.optimize.build.cache import CACHE_ENV, READONLY_ENV, BuildCache
from pytest_kernelpro.optimize.build.prebuild import Prebuilder
from pytest_kernelpro.optimize.sandbox.compile_cache import CompileCaches, point_caches
from pytest_kernelpro.optimize.sandbox.confirm_winner import WinnerConfirmation
from pytest_kernelpro.optimize.sandbox.cuda_probe import cuda_init_failure
from pytest_kernelpro.optimize.sandbox.device_peak import DevicePeak, cuda_used_bytes
from pytest_kernelpro.optimize.sandbox.environment import PACKAGE_ROOT, scrub_environment
from pytest_kernelpro.optimize.sandbox.footprint import check_fits, session_device
from pytest_kernelpro.optimize.sandbox.handles import HandleChannels, Received
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.sandbox.measurement import PRECISION_KEY, session_fp32_precision
from pytest_kernelpro.optimize.sandbox.pool import StandbyPool
from pytest_kernelpro.optimize.sandbox.processes import last_phase, remove_tree
from pytest_kernelpro.optimize.sandbox.project_view import set_session_view, task_project_view
from pytest_kernelpro.optimize.sandbox.supervise import WorkerSupervision
from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits
from pytest_kernelpro.optimize.sandbox.wall_split import wall_split
from pytest_kernelpro.optimize.sandbox.worker_claims import WorkerClaims
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation


class SandboxEvaluator(WorkerSupervision, WorkerClaims, WinnerConfirmation):
    """An `Evaluator` that runs every candidate in a fresh, sandboxed worker process.

    Its jobs' parts: running and watching the processes (`WorkerSupervision`), the judge's
    decisions (`WorkerClaims`), the winner's confirmation (`WinnerConfirmation`)."""

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
        self._reference_timing: dict[str, Any] | None = None  # once a judge timed it
        self._known_truth: dict[str, Any] | None = None  # once a judge found it
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
        # Each watched process's last resident and shared MB, and each worker's peak
        # together with the judge beside it (`supervise._watch`).
        self.memory_now: dict[Path, tuple[float, float]] = {}
        self.both_peak_mb: dict[Path, float] = {}
        self.both_peak_at: dict[Path, dict[str, Any]] = {}

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

    def last_evaluation(self) -> None:
        """The next evaluation is the search's last: no standby is started after it (each
        would import torch for an evaluation that never comes)."""
        self.standbys.size = 0

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
        # The GPU's share of the memory bound: torch's default CUDA allocator keeps a freed
        # block for requests of its own size only, so the judge's float32 copies stay
        # reserved beside its float64 truth and the worker's input-sized ones beside its
        # output-sized ones, copies it no longer uses
        # (bench/results/2026-12-06-device-calls5.md). Expandable segments reuse freed pages
        # for any size. Nothing is shared by CUDA IPC (`handles.py`), which they would
        # change; a setting of the user's is kept. The candidate and the reference are
        # timed under the same allocator.
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        return env

    def _device_peak(self, workdir: Path) -> DevicePeak | None:
        """The sampler of a CUDA problem's GPU memory while the worker of `workdir` and its
        judge run, with where they were at its peak (`device_peak.py`); None on the CPU."""
        device = session_device(self.task.device)
        if not device.startswith("cuda"):
            return None

        def where() -> dict[str, Any]:
            # The judge reports no phases: its host memory says whether it was at work.
            judge_dir = self.handles.judge_of(workdir)
            judge = self.memory_now.get(judge_dir) if judge_dir is not None else None
            return {
                "worker_phase": last_phase(workdir / "progress.log"),
                "judge_resident_mb": None if judge is None else round(judge[0], 1),
            }

        return DevicePeak(cuda_used_bytes(device), where)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """Build, check and time `candidate` in a worker; never raises for its failures
        (a problem too large for this machine is refused, `footprint.py`)."""
        if self._fits is None:  # once, before any worker starts: the problem's, not a candidate's
            self._fits = check_fits(
                self.task.name,
                self.task.reference,
                self.limits.memory_limit_mb,
                device=self.task.device,  # a CUDA problem's copies are held to its GPU's memory
            )
        workdir = self.standbys.scratch_dir("kernelpro-eval-")
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
            # A judge beside the worker decides each checked output as it comes and says
            # why it refused one: the worker makes no comparison of its own for those
            # (`harness._Pipeline.judge_decides`).
            "judge_beside": self.limits.judge,
        }
        received = Received()
        builder = self._builder()
        waiting = time.monotonic()
        prebuilt = builder.wait(candidate.code) if builder is not None else None
        waited = time.monotonic() - waiting  # compiles still running when this one's turn came
        # A CUDA problem's GPU memory, sampled from here while its processes run.
        device_peak = self._device_peak(workdir)
        # The judge starts with the worker and checks each output as it is handed over.
        beside = self._start_judge(workdir) if self.limits.judge else None
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            evaluation = self._run_seeded(candidate.code, workdir)
            # The worker's wait for the judge's checks (inside its checks' wall time, not
            # charged to its run timeout).
            evaluation.metrics["judge_wait_s"] = round(self.handles.judge_time_s(workdir), 3)
            received = self.handles.finish(workdir)
            reprobed = self._reprobe_if_cuda_failed(evaluation)
            if reprobed is not None:
                # CUDA did not start under the rung the driver check or the machine's cache
                # chose: run it once more under what the torch check found, and say so.
                remove_tree(workdir)
                workdir.mkdir()
                received.close()  # nothing of the failed run is judged
                if beside is not None:
                    beside.finish(judged=False)
                    beside = self._start_judge(workdir)
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
            # A hand-over the session refused is no honest worker's (a forged or reused
            # handle): a cheat, also where the judge's refusal of what the candidate handed
            # over in its stead made the worker say "wrong" (`WorkerClaims._judged`).
            forged = received.refused is not None and evaluation.status == "wrong"
            if (evaluation.status == "correct" or forged) and self.limits.judge:
                evaluation = self._judged(evaluation, received, beside)
            evaluation.metrics["wall_split"] = wall_split(evaluation.metrics, waited)
            if device_peak is not None:
                evaluation.metrics["device_peak_mb"] = round(device_peak.stop() / 2**20, 1)
                evaluation.metrics["device_peak_at"] = device_peak.at
            # Its host memory at the peak: the worker and the judge beside it together, or
            # either alone, each with the outputs held by handle (`_watch`).
            evaluation.metrics["both_peak_mb"] = round(self.both_peak_mb.pop(workdir, 0.0), 1)
            # Where that peak was: the worker's phase and each process's part of it.
            evaluation.metrics["both_peak_at"] = self.both_peak_at.pop(workdir, None)
            # The most checked-output bytes the session held at once (one output's, when the
            # judge beside the worker checks each as it comes).
            evaluation.metrics["held_outputs_peak_bytes"] = received.peak_nbytes
            evaluation.metrics["peak_mb"] = max(
                float(evaluation.metrics.get(key) or 0.0)
                for key in ("worker_peak_mb", "judge_peak_mb", "both_peak_mb")
            )
            # Whatever the candidate wrote (errors, output, build logs) leaves here only
            # redacted and without control characters (text_safety).
            return evaluation.made_safe()
        finally:
            if beside is not None:  # a verdict not asked for: its judge ends here
                beside.finish(judged=False)
            if device_peak is not None:
                device_peak.stop()
            self.both_peak_mb.pop(workdir, None)
            self.both_peak_at.pop(workdir, None)
            # Its outputs' memory goes with the evaluation (the worker's died with it).
            received.close()
            self._release_workdir(workdir)
            # The next candidate's processes import torch while the search generates it.
            self.standbys.fill()

    def _release_workdir(self, workdir: Path) -> None:
        """An evaluation's end: its handle channel closed, its standby given back, and its
        scratch directory removed unless the limits keep it."""
        self.handles.finish(workdir).close()
        self.standbys.release(workdir)
        if not self.limits.keep_workdirs:
            self.standbys.remove(workdir)

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


__all__ = ["KernelBenchTask", "SandboxEvaluator", "SandboxLimits"]
