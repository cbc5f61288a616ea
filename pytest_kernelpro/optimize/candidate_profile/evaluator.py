"""An `Evaluator` wrapper that profiles every correct candidate like a user's kernel item.

`ProfilingEvaluator(inner, profiler)` delegates to `inner` (the sandbox: build, check, time)
and, for each candidate it finds correct, calls `profiler(candidate, evaluation)`, which
returns `Analysis.to_dict()` (ncu of the candidate's own `__global__` kernels, SASS,
timeline, Stage 1, every relevant tool). What the next prompt needs goes into the
evaluation, where `agents/feedback.py` reads it:

- `metrics["guidance_md"]`: the tools' guidance in the seed's order ("tools" feedback);
- `metrics["raw_guidance_md"]`: the same candidate's ncu counters as name = value lines
  ("raw" feedback);
- `metrics["profile"]`: Stage 1, what was not collected, the report text, and the seconds the
  profile cost (`profile_s`, also per candidate in `records`);
- `findings`: the tools' findings (tool, severity, title, root cause).

With feedback "none" nothing is profiled (the ablation's control, and no GPU time spent).
The search never knows: it sees a slower evaluator whose evaluations say more. A profile
that fails or runs past `timeout_s` leaves the candidate's evaluation as the sandbox made it,
with the reason in `metrics["profile"]["error"]`; it never fails the candidate.

`CandidateProfiler` is the GPU profiler: one child process per candidate
(`optimize/candidate_profile/child.py`), which imports and runs the candidate's code under ncu. It runs in
the same OS sandbox as the candidate's evaluation (`search.isolation.Isolation.wrap`: PID,
network and mount namespaces, everything read-only but its scratch directory and the shared
extension build directory, no capabilities), with the sandbox's scrubbed environment whose
HOME and TMPDIR point into that scratch directory (ncu, Triton and CUDA write their temporary
files and caches there). Where the machine allows only the weaker fallback, it runs with that
and says so: every profile records the isolation it ran under (`metrics["profile"]
["isolation"]`, `ProfileRecord.isolation`). The child is killed at its time limit (with
namespaces, every process of its PID namespace; in the fallback, its process group).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.agents.feedback import check_feedback_mode
from pytest_kernelpro.optimize.candidate_profile.child import combined_problem
from pytest_kernelpro.optimize.sandbox.processes import kill_group
from pytest_kernelpro.optimize.sandbox.safe_read import create_log, read_tail_fd, read_text

if TYPE_CHECKING:
    from pytest_kernelpro.analysis.core import RooflineFacts
    from pytest_kernelpro.optimize.sandbox.compile_cache import CompileCaches
    from pytest_kernelpro.optimize.sandbox.isolation import Isolation
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation, Evaluator

Profiler = Callable[["Candidate", "Evaluation"], Mapping[str, Any]]


class ProfileFailed(KernelproError):
    """Profiling one candidate did not produce an analysis (the reason says why)."""

    def __init__(self, message: str, *, isolation: str = "") -> None:
        super().__init__(message)
        self.isolation = isolation  # the sandbox it failed in ("" when it never started)

    def __reduce__(self) -> tuple[Any, ...]:  # keeps `isolation` across processes (Dask)
        return (_profile_failed, (str(self), self.isolation))


def _profile_failed(message: str, isolation: str) -> ProfileFailed:
    return ProfileFailed(message, isolation=isolation)


@dataclass(frozen=True)
class ProfileRecord:
    """What profiling one candidate cost and found (for the search's report)."""

    strategy: str
    profile_s: float
    ok: bool
    stage1: str = ""
    findings: int = 0
    error: str = ""
    guidance_chars: int = 0
    isolation: str = ""  # which sandbox the profile ran in (Isolation.describe())
    worker: str = ""  # the Dask worker that profiled it ("" in the search's own process)
    phases: dict[str, float] = field(default_factory=dict)  # the child's parts, seconds
    compile_cache: str = ""  # whether its child started from its evaluation's caches

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the search's report."""
        return asdict(self)


class ProfilingEvaluator:
    """Profiles each correct candidate after `inner` evaluated it (module doc)."""

    def __init__(
        self, inner: Evaluator, profiler: Profiler | None, *, feedback: str = "tools"
    ) -> None:
        self.inner = inner
        self.profiler = profiler
        self.feedback = check_feedback_mode(feedback)
        self.records: list[ProfileRecord] = []
        # Called with "profiling" before each candidate's profile (progress displays).
        self.on_phase: Callable[[str], None] | None = None

    def environment(self) -> dict[str, str] | None:
        """The inner sandbox's worker environment, when it has one."""
        env = getattr(self.inner, "environment", None)
        return env() if callable(env) else None

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Let the inner evaluator build the expansion ahead (`SandboxEvaluator.prepare`)."""
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            prepare(candidates)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """The inner evaluation, with the candidate's profile and guidance when correct.

        With `profiler=None` the inner evaluator has profiled already where it evaluated (a
        Dask worker, `optimize/dask/dask_evaluator.py`): the profile came back in the evaluation's
        metrics and only its record is kept here, so the report lists it as for a local one.
        """
        evaluation = self.inner.evaluate(candidate)
        if not evaluation.ok or self.feedback == "none":
            return evaluation
        if self.profiler is None:
            record = record_of(candidate.strategy, evaluation)
            if record is not None:
                self.records.append(record)
            return evaluation
        if self.on_phase is not None:
            self.on_phase("profiling")
        started = time.perf_counter()
        try:
            result = dict(self.profiler(candidate, evaluation))
        except ProfileFailed as exc:
            spent = time.perf_counter() - started
            evaluation.metrics["profile"] = {
                "error": str(exc),
                "profile_s": spent,
                "isolation": exc.isolation,
            }
        else:
            _attach(evaluation, result, time.perf_counter() - started)
            _check_against_ncu(evaluation)
        record = record_of(candidate.strategy, evaluation)
        if record is not None:
            self.records.append(record)
        return evaluation


def record_of(strategy: str, evaluation: Evaluation) -> ProfileRecord | None:
    """The record of the profile an evaluation carries (`metrics["profile"]`, as `_attach`
    or a failed profile left it); None when it was not profiled."""
    profile = evaluation.metrics.get("profile")
    if not isinstance(profile, Mapping):
        return None
    dask = evaluation.metrics.get("dask")
    stage1 = profile.get("stage1")
    return ProfileRecord(
        strategy,
        float(profile.get("profile_s") or 0.0),
        not profile.get("error"),
        stage1=str((stage1 or {}).get("cls") or "") if isinstance(stage1, Mapping) else "",
        findings=int(profile.get("findings") or 0),
        error=str(profile.get("error") or ""),
        guidance_chars=len(str(evaluation.metrics.get("guidance_md") or "")),
        isolation=str(profile.get("isolation") or ""),
        worker=str((dask or {}).get("worker") or "") if isinstance(dask, Mapping) else "",
        phases=_seconds_map(profile.get("phases")),
        compile_cache=str(profile.get("compile_cache") or ""),
    )


def _seconds_map(value: Any) -> dict[str, float]:
    """The numeric entries of a phases mapping (the child's JSON is the candidate's to forge:
    anything else is dropped)."""
    if not isinstance(value, Mapping):
        return {}
    return {
        str(k): float(v)
        for k, v in value.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def ncu_gpu_time_s(kernels: Sequence[Mapping[str, Any]]) -> float | None:
    """Sum of `gpu__time_duration.sum` over profiled kernels (the `profile.kernels` entries
    of an Analysis dict), in seconds: the GPU time one call cannot go below, which the
    winner's confirmation checks its time against (`search.confirm`). None when no kernel
    has a usable duration."""
    from pytest_kernelpro.tools.timeline import SECONDS_PER_UNIT

    total, seen = 0.0, False
    for kernel in kernels:
        metrics = ((kernel.get("metrics") or {}).get("metrics") or {}) if kernel else {}
        entry = metrics.get("gpu__time_duration.sum") or {}
        value, scale = entry.get("value"), SECONDS_PER_UNIT.get(str(entry.get("unit", "")))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or scale is None:
            continue
        if value > 0:
            total += float(value) * scale
            seen = True
    return total if seen else None


def _main_counters(profile: Mapping[str, Any]) -> dict[str, float]:
    for kernel in profile.get("kernels") or ():
        metrics = (kernel.get("metrics") or {}).get("metrics") or {}
        if metrics:
            return {
                name: float(m["value"])
                for name, m in metrics.items()
                if isinstance(m.get("value"), (int, float)) and not isinstance(m["value"], bool)
            }
    return {}


def _check_against_ncu(evaluation: Evaluation) -> None:
    """At every profiled candidate, not only the winner: its timed median must not be below
    the GPU time ncu measured for its kernels of one call (`sandbox.confirm`'s rule: ncu's
    sum is time a call cannot take less than). A candidate that was, is a cheat."""
    from pytest_kernelpro.optimize.sandbox.confirm import NCU_SLACK_S, NCU_TOLERANCE

    ncu_s = (evaluation.metrics.get("profile") or {}).get("ncu_gpu_time_s")
    median_s = (evaluation.timing.get("candidate") or {}).get("median_s")
    if not isinstance(ncu_s, (int, float)) or not isinstance(median_s, (int, float)):
        return
    if ncu_s <= 0 or median_s <= 0 or median_s * NCU_TOLERANCE + NCU_SLACK_S >= ncu_s:
        return
    evaluation.status = "cheat"
    evaluation.speedup = None
    evaluation.reason = (
        f"timing not believed at its profile: ncu measured its kernels at {ncu_s * 1e6:.4g} us "
        f"of GPU time per call, {ncu_s / median_s:.3g}x the {median_s * 1e6:.4g} us it was timed "
        f"at (a call cannot take less than its kernels; more than the {NCU_TOLERANCE:g}x "
        "allowed): work outside the timed region or stream"
    )


def _attach(evaluation: Evaluation, result: Mapping[str, Any], spent: float) -> None:
    profile = result.get("profile") or {}
    tools = result.get("tools") or {}
    if result.get("guidance_md"):
        evaluation.metrics["guidance_md"] = result["guidance_md"]
    if result.get("raw_md"):
        evaluation.metrics["raw_guidance_md"] = result["raw_md"]
    counters = _main_counters(profile)
    if counters:
        evaluation.metrics["ncu"] = counters
    evaluation.metrics["profile"] = {
        "profile_s": spent,
        "collect_s": float(result.get("profile_s") or 0.0),
        "build_s": result.get("build_s"),
        "stage1": result.get("stage1"),
        "kernels": [k.get("name") for k in profile.get("kernels") or ()],
        # GPU time of one call by ncu's clock: the winner's confirmation cross-checks with it.
        "ncu_gpu_time_s": ncu_gpu_time_s(profile.get("kernels") or ()),
        "sass": any(k.get("sass") for k in profile.get("kernels") or ()),
        # Per kernel with SASS: its instruction count and the binary it was read from
        # (a Triton kernel's cubin; None for a captured load_inline module's function).
        "sass_kernels": [
            {
                "kernel": k.get("name"),
                "instructions": (k.get("sass") or {}).get("total_instructions"),
                "source": k.get("sass_source"),
            }
            for k in profile.get("kernels") or ()
            if k.get("sass")
        ],
        "timeline": profile.get("timeline") is not None,
        "not_collected": list(profile.get("not_collected") or ()),
        "text": result.get("text", ""),
        "isolation": result.get("isolation"),
        "compile_cache": result.get("compile_cache"),
        # Seconds of the child's parts: build, static, timeline, ncu_query, ncu, analysis.
        "phases": _seconds_map(result.get("phases")),
        "findings": len(result.get("findings") or ()),
        # Which tools ran on it, and which were skipped for an input it lacks (not affinity).
        "tools_ran": sorted({str(r.get("tool")) for r in tools.get("ran") or ()}),
        "tools_lacking_inputs": sorted(
            {
                f"{s.get('tool')} on {s.get('kernel')}: "
                + (", ".join(s.get("missing") or ()) or str(s.get("reason")))
                for s in tools.get("skipped") or ()
                if s.get("reason") != "affinity"
            }
        ),
    }
    for finding in result.get("findings") or ():
        evaluation.findings.append(
            {k: finding.get(k) for k in ("tool", "kernel", "severity", "title", "root_cause")}
        )


def _scrubbed_environment() -> dict[str, str]:
    """The sandbox's environment rules (no secrets), with this package importable."""
    from pytest_kernelpro.optimize.sandbox.environment import PACKAGE_ROOT, scrub_environment

    env = scrub_environment(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class CandidateProfiler:
    """Profiles a candidate on the GPU in a sandboxed child process (`optimize/candidate_profile/child.py`).

    `isolation` is the sandbox to run it in: an `Isolation` (the evaluator's, already probed)
    or a mode (`auto`, `namespaces`, `fallback`) probed where the profile runs, which on a
    Dask worker is the worker's machine. `writable` directories stay writable inside it
    besides the scratch directory; by default none (torch's extension builds go to the
    child's scratch directory, as in the evaluation's worker)."""

    def __init__(
        self,
        reference_source: str,
        facts: RooflineFacts,
        *,
        device: str = "cuda",
        timeout_s: float = 120.0,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        ncu_path: str | None = None,
        timeline_runs: int = 5,
        max_launches: int = 8,
        isolation: Isolation | str = "auto",
        writable: Sequence[Path] | None = None,
        caches: CompileCaches | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise KernelproError(f"candidate profile timeout_s={timeout_s!r} must be positive")
        self.reference_source = reference_source
        self.facts = facts
        self.device = device
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else _scrubbed_environment()
        self.python = python
        self.ncu_path = ncu_path
        self.timeline_runs = timeline_runs
        # ncu replays every profiled launch once per metric pass, so a PyTorch-op candidate of
        # a dozen kernels costs a dozen fused ones: the cap bounds one candidate's profile.
        self.max_launches = max_launches
        self._isolation = isolation
        # Nothing shared is writable by default: a directory that several candidates write
        # would let one plant a module that another imports (TORCH_EXTENSIONS_DIR is the
        # child's own, in its scratch directory).
        self.writable = [Path(p) for p in writable or ()]
        # The candidates' own compile caches kept from their evaluations (the sandbox
        # evaluator's `compile_caches`): a profile starts from a copy of its candidate's.
        self.caches = caches

    @property
    def isolation(self) -> Isolation:
        """The sandbox the child runs in. A mode is probed where the profile runs (once per
        process, `Isolation.probe` keeps it) and asked again for every profile, so a
        re-probe after CUDA did not start (`Isolation.reprobe_cuda`) applies here too."""
        if isinstance(self._isolation, str):
            from pytest_kernelpro.optimize.sandbox.isolation import Isolation

            return Isolation.probe(
                self._isolation, cuda=self.device.startswith("cuda"), env=self.env
            )
        return self._isolation

    def _ncu_catalog(self) -> frozenset[str] | None:
        """The metrics ncu offers on this chip, asked once per process here (not in every
        candidate's child: each query starts ncu and the driver again); None without ncu."""
        if not self.device.startswith("cuda"):
            return None
        from pytest_kernelpro.profile.ncu import find_ncu, query_catalog

        ncu = find_ncu(self.ncu_path)
        return query_catalog(ncu) if ncu else None

    def __call__(self, candidate: Candidate, evaluation: Evaluation) -> Mapping[str, Any]:
        """The candidate's Analysis dict; `ProfileFailed` when none could be made."""
        from pytest_kernelpro.optimize.sandbox.compile_cache import point_caches

        median = evaluation.metrics.get("candidate_median_s")
        facts = self.facts.for_median(float(median) if median else None)
        isolation = self.isolation
        where = isolation.describe()
        with tempfile.TemporaryDirectory(prefix="kernelpro-profile-cand-") as tmp:
            workdir = Path(tmp)
            env = dict(self.env)
            # The only writable place inside the sandbox: ncu's temporary files and lock,
            # Triton's and CUDA's caches, the kineto trace go here.
            for name, sub in (("HOME", "home"), ("TMPDIR", "tmp")):
                (workdir / sub).mkdir()
                env[name] = str(workdir / sub)
            env.pop("TMP", None)
            env.pop("TEMP", None)
            point_caches(env, workdir / "home")
            if not self.writable:  # torch's extension builds: this child's own, not shared
                env["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch-extensions")
            warm = self.caches is not None and self.caches.seed(candidate.code, workdir / "home")
            problem = workdir / "candidate_problem.py"
            problem.write_text(
                combined_problem(self.reference_source, candidate.code), encoding="utf-8"
            )
            output = workdir / "analysis.json"
            catalog = self._ncu_catalog()
            if catalog:
                (workdir / "ncu-metrics.txt").write_text("\n".join(sorted(catalog)), "utf-8")
            spec = {
                "problem_file": str(problem),
                "device": self.device,
                # The child's own profilers share the budget: the timeline and ncu runs.
                "timeout_s": max(1.0, self.timeout_s / 2),
                "facts": facts.to_dict(),
                "output": str(output),
                "ncu_path": self.ncu_path,
                "timeline_runs": self.timeline_runs,
                "max_launches": self.max_launches,
                "ncu_catalog": str(workdir / "ncu-metrics.txt") if catalog else None,
                # The child's Triton cache is its scratch's, empty or seeded from this same
                # code only: every cubin in it is this candidate's, whatever its mtime (a
                # seed keeps the evaluation's).
                "cubins_since": 0.0,
            }
            (workdir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            for path in self.writable:
                path.mkdir(parents=True, exist_ok=True)
            command = isolation.wrap(
                [
                    self.python,
                    "-m",
                    "pytest_kernelpro.optimize.candidate_profile.child",
                    str(workdir / "spec.json"),
                ],
                scratch=workdir,
                writable=self.writable,
                python=self.python,
                env=env,
            )
            # Read back through this descriptor, never by name (`sandbox.safe_read`).
            with create_log(workdir / "stderr.log") as err:
                proc = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    code = proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    proc.wait()
                    raise ProfileFailed(
                        f"profiling the candidate ran past its {self.timeout_s:.0f} s limit "
                        "(--kernelpro-profile-timeout)",
                        isolation=where,
                    ) from None
                except BaseException:
                    kill_group(proc)
                    proc.wait()
                    raise
                kill_group(proc)  # profiler children left behind (fallback)
                stderr = read_tail_fd(err.fileno(), 64 * 1024).decode("utf-8", "replace")
            if code != 0 or not os.path.lexists(output):
                lines = stderr.strip().splitlines()
                # The sandbox's own setup line is not the reason.
                tail = [
                    ln
                    for ln in lines
                    if not ln.startswith("kernelpro sandbox: ") or "setup failed" in ln
                ]
                raise ProfileFailed(
                    f"the candidate profiler exited with {code}: " + " | ".join(tail[-3:])[:600],
                    isolation=where,
                )
            try:
                result = json.loads(read_text(output))
            except (OSError, ValueError) as exc:  # a link, a FIFO, a forged file
                raise ProfileFailed(f"unreadable profile result: {exc}", isolation=where) from None
        if isinstance(result, dict):
            result["isolation"] = where
            result["compile_cache"] = "warm (kept from its evaluation)" if warm else "cold"
        return result
