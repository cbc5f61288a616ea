"""The sandboxed evaluator: each candidate is built, checked and timed in its own process.

`SandboxEvaluator(task).evaluate(candidate)` writes the task and the candidate's code to a
temporary directory, starts `python -m pytest_kernelpro.search.worker` in a new session
(its own process group) with an environment stripped of secrets, and watches it:

- build timeout until the worker reports "built", then run timeout (a hang is killed,
  whole process group, compiler children included) → status `timeout`;
- resident memory over the limit (polled from /proc; the worker also caps its address
  space on the CPU) → `run_error`, "out of memory";
- no result file (segfault, `os._exit`, a CUDA error that kills the process) → `run_error`
  (or `build_error` when it died while building), with the signal or exit code and the
  phase it was in.

Fast-path kernels (`pytest_kernelpro.build.load_cuda` calls the candidate's source makes
with literal arguments) are compiled before the worker starts, by a pool of build threads
that `prepare(candidates)` fills with a whole expansion at once; the worker finds them in
the build cache, which it may read but not write. `Evaluation.build_s` is the candidate's
build time on the critical path (the wait for its compiles plus the worker's build phase);
`metrics["build"]` has the compile times and each build (cache hit or not).

Nothing a candidate does can raise into the search or the pytest session, and every
candidate gets a fresh CUDA context, so the GPU is usable by the next one.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.build.api import ARCH_ENV
from pytest_kernelpro.build.cache import CACHE_ENV, READONLY_ENV, BuildCache
from pytest_kernelpro.build.prebuild import Prebuilder
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.search.base import Candidate, Evaluation
from pytest_kernelpro.search.isolation import Isolation
from pytest_kernelpro.search.worker import RUN_PHASES

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding pytest_kernelpro/

# Variables a build and a kernel need. Everything else is dropped, and these too when the
# name looks like a secret.
SAFE_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "TMP",
        "TEMP",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "CC",
        "CXX",
        "CUDAHOSTCXX",
        "MAX_JOBS",
        "CUTLASS_PATH",
        "MALLOC_ARENA_MAX",
        "OPENBLAS_NUM_THREADS",
    }
)
SAFE_PREFIXES = (
    "CUDA_",
    "CUDNN_",
    "NVIDIA_",
    "NCCL_",
    "NVCC_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "LC_",
    "OMP_",
    "MKL_",
    "KMP_",
    "XDG_",
    "KERNELPRO_",
)
_SECRET_WORDS = re.compile(
    r"API_?KEY|TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|AUTH|SESSION|COOKIE|ACCESS_?KEY",
    re.IGNORECASE,
)
_SECRET_PREFIXES = (
    "ANTHROPIC_",
    "OPENAI_",
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GCP_",
    "GH_",
    "GITHUB_",
    "GITLAB_",
    "HF_",
    "HUGGING",
    "WANDB_",
    "SSH_",
    "GPG_",
    "NPM_",
    "PYPI_",
    "TWINE_",
    "DOCKER_",
    "SLACK_",
    "CI_JOB_",
)


def is_secret_name(name: str) -> bool:
    """True for a variable name that may hold a credential (never passed to a worker)."""
    upper = name.upper()
    return bool(_SECRET_WORDS.search(upper)) or upper.startswith(_SECRET_PREFIXES)


def scrub_environment(env: Mapping[str, str], keep: Sequence[str] = ()) -> dict[str, str]:
    """The worker's environment: allow-listed names (plus `keep`), minus anything secret."""
    kept = set(keep)
    return {
        name: value
        for name, value in env.items()
        if (name in SAFE_NAMES or name.startswith(SAFE_PREFIXES) or name in kept)
        and not is_secret_name(name)
    }


@dataclass(frozen=True)
class KernelBenchTask:
    """A KernelBench-format problem and how to check candidates against it."""

    reference: str  # source text: class Model, get_inputs(), get_init_inputs()
    name: str = "task"
    device: str = "auto"  # "auto" (cuda when available), "cuda" or "cpu"
    seed: int = 42
    correct_trials: int = 3
    atol: float | None = None  # None: by output dtype (fp32 1e-4, fp16/bf16 1e-2)
    rtol: float | None = None
    forbidden_ops: tuple[str, ...] = ()  # e.g. ("aten.mm", "aten.addmm") for a GEMM task
    shape_check: str = "auto"  # "auto" | "variants" | "off" (see harness.py)
    # `measure.timing.TimingBudget` settings (warmup_ms, max_time_s, min_samples,
    # max_samples, flush_l2, ...) for the reference and each candidate; empty: its defaults.
    timing: Mapping[str, Any] = field(default_factory=dict)
    cpu_threads: int | None = None  # torch.set_num_threads in the worker (None: torch's default)
    # sys.path entries of the session that collected the kernel (rootdir, pythonpath ini,
    # conftest insertions, src/ layout), added to the worker's so it imports the same modules.
    sys_path: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.shape_check not in ("auto", "variants", "off"):
            raise KernelproError(
                f"Invalid shape_check={self.shape_check!r} for task {self.name!r}: use "
                "'auto', 'variants' or 'off'."
            )
        if self.device not in ("auto", "cuda", "cpu") and not self.device.startswith("cuda:"):
            raise KernelproError(
                f"Invalid device={self.device!r} for task {self.name!r}: use 'auto', 'cuda', "
                "'cuda:N' or 'cpu'."
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> KernelBenchTask:
        """A task from a KernelBench problem file."""
        source = Path(path).read_text(encoding="utf-8")
        return cls(reference=source, name=options.pop("name", Path(path).stem), **options)


def _default_memory_mb() -> int | None:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return max(1024, total // (2 * 1024 * 1024))


@dataclass(frozen=True)
class SandboxLimits:
    """Process limits of one evaluation."""

    build_timeout_s: float = 300.0  # start, imports, reference, candidate build (load_inline)
    run_timeout_s: float = 120.0  # correctness, checks, timing
    memory_limit_mb: int | None = field(default_factory=_default_memory_mb)  # host memory
    python: str = sys.executable
    extensions_dir: str | None = None  # TORCH_EXTENSIONS_DIR shared by workers (build cache)
    keep_env: tuple[str, ...] = ()  # extra variable names to pass (never secret-looking ones)
    log_chars: int = 20_000  # tail of the worker's stdout/stderr kept in the evaluation
    keep_workdirs: bool = False  # leave each candidate's directory behind (debugging)
    # "auto": Linux namespaces where the machine allows them, else the weaker fallback (the
    # evaluation's metrics["sandbox"] says which); "namespaces": refuse the fallback.
    isolation: str = "auto"
    # Decide correctness and the reference's time in a trusted process (judge.py) for every
    # candidate that claims to be correct. Off only for tests of the worker itself.
    judge: bool = True
    # `confirm()`: a re-timed median above this many times the search's median disqualifies.
    # None: by device (`search.confirm`: 1.25 on a GPU, 3.0 on a loaded CPU).
    confirm_tolerance: float | None = None
    # Fast-path builds (pytest_kernelpro.build): the cache the evaluator builds into (the
    # worker only reads it) and how many candidates compile at once.
    build_cache_dir: str | None = None  # default: $KERNELPRO_BUILD_CACHE or ~/.cache/...
    build_jobs: int | None = None  # default: min(8, CPU count)


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
        self.build_cache = BuildCache(self.limits.build_cache_dir, writable=True)
        self._build_arch: str | None | bool = False  # False: not looked up yet
        self._prebuilder: Prebuilder | None = None
        self._prebuilder_lock = threading.Lock()

    # ----- builds ahead of the worker (pytest_kernelpro.build) -----

    def build_arch(self) -> str | None:
        """The compile target of fast-path builds: $KERNELPRO_CUDA_ARCH, else the GPU's
        (None on a machine without one, where the worker builds nothing ahead)."""
        if self._build_arch is False:
            from pytest_kernelpro.build.api import default_arch

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
        """Stop the build threads (pending builds are dropped)."""
        if self._prebuilder is not None:
            self._prebuilder.close()
            self._prebuilder = None

    @property
    def isolation(self) -> Isolation:
        """How workers are isolated on this machine (probed once)."""
        if self._isolation is None:
            self._isolation = Isolation.probe(
                self.limits.isolation, cuda=self._needs_cuda(), env=self.environment()
            )
        return self._isolation

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
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
        )
        # ninja and nvcc wrappers live next to the interpreter in a virtualenv.
        env["PATH"] = os.pathsep.join(
            p for p in (str(Path(self.limits.python).parent), env.get("PATH", "")) if p
        )
        env["TORCH_EXTENSIONS_DIR"] = str(self.extensions_dir)
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
        """Build, check and time `candidate` in a worker; never raises for its failures."""
        workdir = Path(tempfile.mkdtemp(prefix="kernelpro-eval-"))
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
            "outputs_dir": str(workdir / "outputs"),
        }
        builder = self._builder()
        waiting = time.monotonic()
        prebuilt = builder.wait(candidate.code) if builder is not None else None
        waited = time.monotonic() - waiting  # compiles still running when this one's turn came
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            evaluation = self._run_worker(workdir)
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
            if evaluation.status == "correct" and self.limits.judge:
                evaluation = self._judged(evaluation, workdir / "outputs")
            return evaluation
        finally:
            if not self.limits.keep_workdirs:
                _remove_tree(workdir)

    def _task_payload(self) -> dict[str, Any]:
        return {
            **asdict(self.task),
            "forbidden_ops": list(self.task.forbidden_ops),
            "timing": dict(self.task.timing),
            "sys_path": list(self.task.sys_path),
        }

    # ----- the trusted side -----

    def _run_judge(self, outputs: Path | None, *, retime: bool = False) -> dict[str, Any]:
        """Run judge.py (no candidate code) in a fresh sandboxed process; its JSON result."""
        judgedir = Path(tempfile.mkdtemp(prefix="kernelpro-judge-"))
        try:
            task = {**self._task_payload(), "retime": retime}
            (judgedir / "task.json").write_text(json.dumps(task), "utf-8")
            command = [
                self.limits.python,
                "-m",
                "pytest_kernelpro.search.judge",
                "--task",
                str(judgedir / "task.json"),
                "--result",
                str(judgedir / "judge.json"),
                *(["--outputs", str(outputs)] if outputs is not None else ["--preflight"]),
            ]
            run = self._launch(
                command, judgedir, judgedir / "progress.log", judgedir / "judge.json"
            )
            try:
                return dict(json.loads((judgedir / "judge.json").read_text(encoding="utf-8")))
            except (OSError, ValueError):
                logs = _tail(judgedir / "stdout.log", judgedir / "stderr.log", 4000)
                return {
                    "ok": False,
                    "judge_error": f"the judge process ended without a result ({run.how()}, "
                    f"{run.killed or 'not killed'})\n{logs}",
                }
        finally:
            if not self.limits.keep_workdirs:
                _remove_tree(judgedir)

    def _reference_error(self, verdict: Mapping[str, Any]) -> KernelproError:
        return KernelproError(
            f"The reference of task {self.task.name!r} fails in a trusted process, so no "
            f"candidate can be checked: {verdict.get('reference_error')}. Fix the problem file "
            f"(class Model, get_inputs, get_init_inputs).\n{verdict.get('traceback', '')}"
        )

    def _judged(self, evaluation: Evaluation, outputs: Path) -> Evaluation:
        """The worker's "correct" is a claim: the judge checks its saved outputs and times
        the reference; the speedup is the judge's reference time over the candidate's."""
        verdict = self._run_judge(outputs)
        if verdict.get("reference_error"):
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
        timed it, with clocks bound before the candidate's code runs (`worker.retime`), have
        the judge check the output of a call made after timing, and compare the fresh median
        and ncu's kernel durations (where the candidate was profiled) with the time the
        search used (`search.confirm.confirm_timing`: the rule and its tolerances).

        A mismatch disqualifies the candidate (status `cheat`) with the numbers in the
        reason; otherwise `timing["confirmed"]` holds the re-timing, the comparison and the
        speedup it gives. Only correct evaluations are confirmed.
        """
        from pytest_kernelpro.search.confirm import confirm_timing

        if evaluation.status != "correct":
            return evaluation
        claimed = _positive((evaluation.timing.get("candidate") or {}).get("median_s"))
        workdir = Path(tempfile.mkdtemp(prefix="kernelpro-retime-"))
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
            "outputs_dir": str(workdir / "outputs"),
            "retime": True,
        }
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            retimed = self._run_worker(workdir)
            if retimed.status != "correct":
                return _disqualified(
                    evaluation, f"timing not confirmed: the re-timing run failed ({retimed.reason})"
                )
            verdict = self._run_judge(workdir / "outputs", retime=True)
        finally:
            if not self.limits.keep_workdirs:
                _remove_tree(workdir)
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
        unwarmed = raw.get("unwarmed_samples_s")
        # Set by the profiling evaluator (analysis/evaluator.py) for a profiled candidate.
        ncu_s = _positive((evaluation.metrics.get("profile") or {}).get("ncu_gpu_time_s"))
        outcome = confirm_timing(
            claimed or 0.0,
            samples if isinstance(samples, list) else [],
            device_kind="cuda" if self._needs_cuda() else "cpu",
            tolerance=self.limits.confirm_tolerance,
            ncu_s=ncu_s,
            unwarmed_s=unwarmed if isinstance(unwarmed, list) else (),
            method=str(raw.get("method") or ""),
        )
        ref_s = _positive((verdict.get("reference_timing") or {}).get("median_s"))
        fresh = outcome.record.get("median_s")
        confirmed = {
            **outcome.record,
            "warmup_runs": raw.get("warmup_runs"),
            "reference_median_s": ref_s,
            "speedup": None if ref_s is None or not fresh else ref_s / fresh,
        }
        if not outcome.ok:
            disqualified = _disqualified(evaluation, outcome.reason)
            disqualified.timing["confirmation"] = confirmed
            return disqualified
        evaluation.timing["confirmed"] = confirmed
        return evaluation

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
            "pytest_kernelpro.search.worker",
            "--task",
            str(workdir / "task.json"),
            "--result",
            str(result_path),
            "--progress",
            str(progress_path),
        ]
        run = self._launch(command, workdir, progress_path, result_path)
        evaluation = self._classify(run, result_path)
        evaluation.logs = run.logs
        evaluation.wall_s = run.wall_s
        if not evaluation.build_log and evaluation.status == "build_error":
            evaluation.build_log = run.logs
        return evaluation

    def _launch(
        self, command: list[str], workdir: Path, progress_path: Path, result_path: Path
    ) -> _Run:
        """Run `command` in the sandbox with `workdir` as its scratch directory; watch it."""
        limits = self.limits
        self.extensions_dir.mkdir(parents=True, exist_ok=True)
        wrapped = self.isolation.wrap(
            command, scratch=workdir, writable=[self.extensions_dir], python=limits.python
        )
        # If the process watching it dies (a Dask worker killed mid-search, a session killed
        # with SIGKILL), the sandbox goes too instead of running on unwatched.
        wrapped = [*_die_with_parent(), *wrapped]
        env = self.environment(workdir)
        started = time.monotonic()
        with self._inflight_lock:
            self._inflight += 1
        with open(workdir / "stdout.log", "wb") as out, open(workdir / "stderr.log", "wb") as err:
            proc = subprocess.Popen(
                wrapped,
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                killed, phase, peak_mb = self._watch(proc, progress_path, result_path, started)
            except BaseException:  # Ctrl-C in the session: the worker (own session) must go too
                _kill_group(proc)
                proc.wait()
                with self._inflight_lock:
                    self._inflight -= 1
                raise
        wall = time.monotonic() - started
        logs = _tail(workdir / "stdout.log", workdir / "stderr.log", limits.log_chars)
        with self._inflight_lock:
            self._inflight -= 1
            # A build killed or crashed mid-way may leave torch's build lock behind, which
            # would make every later build with that extension name wait forever. Only when
            # no other worker runs: a sibling's fresh lock must not be taken away.
            died = killed is not None or not result_path.exists()
            if died and phase not in RUN_PHASES and self._inflight == 0:
                _clear_stale_locks(self.extensions_dir, started)
        return _Run(proc.returncode, killed, phase, peak_mb, wall, logs)

    def _watch(
        self,
        proc: subprocess.Popen[bytes],
        progress_path: Path,
        result_path: Path,
        started: float,
    ) -> tuple[str | None, str, float]:
        """Wait for the worker; kill its group on a timeout or memory overrun.

        Returns (why it was killed or None, last phase, peak RSS in MB).
        """
        limits = self.limits
        deadline = started + limits.build_timeout_s
        run_started: float | None = None
        phase, peak_mb, killed = "start", 0.0, None
        result_seen: float | None = None
        delay = 0.02
        while True:
            if _exited(proc):
                break
            now = time.monotonic()
            seen = _last_phase(progress_path) or phase
            if seen != phase and self.on_phase is not None:
                self.on_phase(seen)
            phase = seen
            if run_started is None and phase in RUN_PHASES:
                run_started = now
                deadline = now + limits.run_timeout_s
            rss = _tree_rss_mb(proc.pid)
            peak_mb = max(peak_mb, rss)
            if limits.memory_limit_mb and rss > limits.memory_limit_mb:
                killed = "memory"
            elif now > deadline:
                killed = "timeout"
            elif result_path.exists():
                # The worker exits right after writing; give it a moment, then stop waiting.
                result_seen = result_seen or now
                if now - result_seen > 10.0:
                    killed = "linger"
            if killed:
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        _kill_group(proc)  # also stray children of a worker that exited on its own
        proc.wait()
        # The worker may have moved on since the last poll: the file has its final phase.
        return killed, _last_phase(progress_path) or phase, peak_mb

    def _classify(self, run: _Run, result_path: Path) -> Evaluation:
        killed, phase, peak_mb = run.killed, run.phase, run.peak_mb
        in_build = phase not in RUN_PHASES
        if result_path.exists() and killed != "memory":
            try:
                data = json.loads(result_path.read_text(encoding="utf-8"))
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
                f"{self.limits.memory_limit_mb} MB limit in phase {phase!r} (killed)",
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
        setup = _sandbox_setup_error(run.logs) if run.returncode == 125 else None
        if setup:
            raise KernelproError(
                f"The candidate sandbox could not be set up ({setup}); no candidate runs "
                "without it. Use SandboxLimits(isolation='fallback') to run with the weaker "
                "isolation, or fix the mount that cannot be made read-only."
            )
        return Evaluation(
            status="build_error" if phase == "build" else "run_error",
            reason=f"worker died ({run.how()}) without a result in phase {phase!r}",
        )

    def _reference_failure_claim(self, evaluation: Evaluation) -> Evaluation:
        """A worker says the reference failed. Its process may have run candidate code, so
        the claim is checked in a trusted process before the user's problem is blamed."""
        if self._reference_ok is None:
            verdict = self._run_judge(None)
            if verdict.get("reference_error"):
                raise self._reference_error(verdict)
            self._reference_ok = bool(verdict.get("ok"))
        return Evaluation(
            status="run_error",
            reason="the worker reported that the reference failed, but the reference runs "
            "in a trusted process: counted as this candidate's failure "
            f"({str(evaluation.reason or '')[:200]})",
            build_log=evaluation.build_log,
        )


@dataclass(frozen=True)
class _Run:
    """How one sandboxed process ended."""

    returncode: int | None
    killed: str | None
    phase: str
    peak_mb: float
    wall_s: float
    logs: str

    def how(self) -> str:
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"signal {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"signal {-self.returncode}"
        return f"exit code {self.returncode}"


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


def _sandbox_setup_error(logs: str) -> str | None:
    for line in logs.splitlines():
        if "kernelpro sandbox: setup failed" in line:
            return line.split("setup failed", 1)[1].lstrip(", :")[:400]
    return None


# ----- process helpers -----


@functools.cache
def _die_with_parent() -> tuple[str, ...]:
    """`setpriv --pdeathsig KILL --` where util-linux has it: the kernel kills the sandbox
    when the thread that started (and watches) it exits. Empty where it is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    try:
        probe = subprocess.run(
            [*prefix, "true"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return prefix if probe.returncode == 0 else ()


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """True once the worker exited, without reaping it: until `wait`, its pid (and so its
    process group id) cannot be reused, so killing the group stays safe."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return proc.poll() is not None
    try:
        info = waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as handle:
                kids += [int(k) for k in handle.read().split()]
    except (OSError, ValueError):
        pass
    return kids


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of `pid` and all its descendants (the sandbox's `unshare` holds the
    worker as a child, and a candidate may start processes of its own)."""
    total, todo, seen = 0.0, [pid], set()
    while todo and len(seen) < 4096:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += _rss_mb(current)
        todo += _children(current)
    return total


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return 0.0


def _last_phase(progress_path: Path) -> str | None:
    try:
        text = progress_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # Complete lines are "phase timestamp"; a line still being written is skipped.
    for line in reversed(text.splitlines()):
        fields = line.split()
        if len(fields) == 2:
            return fields[0]
    return None


def _tail(stdout: Path, stderr: Path, limit: int) -> str:
    parts = []
    for label, path in (("stdout", stdout), ("stderr", stderr)):
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue
        if text.strip():
            if len(text) > limit // 2:
                text = "[...]\n" + text[-(limit // 2) :]
            parts.append(f"----- worker {label} -----\n{text.rstrip()}")
    return "\n".join(parts)


def _clear_stale_locks(extensions_dir: Path, since: float) -> None:
    """Remove torch build locks created after `since` (monotonic) by a killed worker."""
    if not extensions_dir.is_dir():
        return
    cutoff = time.time() - (time.monotonic() - since)
    for lock in extensions_dir.glob("*/lock"):
        try:
            if lock.stat().st_mtime >= cutoff - 1.0:
                lock.unlink()
        except OSError:
            pass


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
