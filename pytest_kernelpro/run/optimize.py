"""`--kernelpro-optimize`: what the guided search of one kernel item hands the user.

`optimize_search.run_search` composes the loop (Programmer Agent, sandbox, profiling
evaluator, MCTS or greedy, the final interleaved re-measurement and `SearchRanking`). This
module wraps it with what the user gets (`handoff/`), through `SearchHooks`:

1. a run folder (`handoff/runs.py`; `--kernelpro-resume` continues the latest);
2. the current kernel's sandbox evaluation is checked before any model call: a kernel the
   sandbox cannot import (it runs with pytest's sys.path) stops the search there;
3. live progress (`handoff/progress.py`); after every evaluation the summary (and, when the
   best changed, the patches) are written to the run folder, so Ctrl-C or a crash keeps the
   trajectory, the best so far and its patch;
4. the ranked candidates, one patch per candidate plus `best.patch` (`handoff/outcome.py`,
   `search/patch.py`), and the summary in the record (terminal, JSON, JUnit, PR comment).

A requested search that did not run fails the kernel item with the reason: never a silent
pass. Problems found before any work (no API key, unreachable API, an unusable replay) are
usage errors raised by the plugin (`handoff/preflight.py`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KernelproError
from ..fileio import atomic_write_json
from ..handoff.replay import slug as _slug
from .search_clock import with_rest

if TYPE_CHECKING:
    from ..handoff.progress import SearchProgress
    from ..handoff.runs import RunFolder
    from ..record import KernelRecord
    from ..search.base import Candidate, Evaluation
    from ..search.patch import KernelSite
    from .context import ItemRun, Services


_IMPORT_FAILURES = ("ModuleNotFoundError", "ImportError", "No module named")


class _SearchState:
    """What the search found so far, written to the run folder as it grows."""

    def __init__(
        self,
        kernel: str,
        budget: str,
        progress: SearchProgress,
        efficiency_before: float | None,
        efficiency_of: Callable[[float], float | None] | None = None,
    ) -> None:
        self.kernel = kernel
        self.budget = budget
        self.progress = progress
        self.efficiency_before = efficiency_before
        # A candidate `vs_current` times faster than the current kernel: its roofline share.
        self.efficiency_of = efficiency_of
        self.started = time.monotonic()
        self.run: RunFolder | None = None
        self.site: KernelSite | None = None
        self.root: Path | None = None
        self.site_error: str | None = None
        self.current: Evaluation | None = None
        self.algorithm: Any = None
        self.backend_name = ""
        self._written_best: tuple[int, ...] = ()
        self._patches: dict[int, tuple[Any, Any]] = {}
        self.patch_info: dict[str, Any] = {"best_patch": None, "errors": []}
        # The wall split's part of this module: before the loop (run folder, kernel site)
        # and the summaries and patches written while it runs.
        self.setup_s = 0.0
        self.patches_s = 0.0

    @property
    def current_speedup(self) -> float | None:
        cur = self.current
        return cur.speedup if cur is not None and cur.ok else None

    def summary(self, *, stop_reason: str = "", interrupted: bool = False) -> dict[str, Any]:
        """The summary of the search so far; writes it (and changed patches) to the run folder."""
        started = time.perf_counter()
        try:
            return self._summary(stop_reason=stop_reason, interrupted=interrupted)
        finally:
            self.patches_s += time.perf_counter() - started

    def _summary(self, *, stop_reason: str, interrupted: bool) -> dict[str, Any]:
        from ..handoff.outcome import rank_nodes, write_patches

        nodes = list(self.algorithm.tree.evaluated()) if self.algorithm is not None else []
        ranked, outcomes = rank_nodes(
            nodes,
            current_speedup=self.current_speedup,
            efficiency_before=self.efficiency_before,
            efficiency_of=self.efficiency_of,
        )
        ids = tuple(e["node_id"] for e in ranked)
        if self.run is not None and self.site is not None and self.root is not None and ranked:
            if ids != self._written_best:
                top = ranked[0]
                self.patch_info = write_patches(
                    ranked,
                    {n.id: n.candidate.code for n in nodes if n.candidate is not None},
                    self.site,
                    self.root,
                    self.run.patches,
                    kernel=self.kernel,
                    best=top["node_id"] if (top.get("speedup_vs_current") or 0.0) > 1.0 else None,
                )
                self._written_best = ids
                self._patches = {e["node_id"]: (e.get("patch"), e.get("files")) for e in ranked}
            else:
                for entry in ranked:
                    entry["patch"], entry["files"] = self._patches.get(
                        entry["node_id"], (None, None)
                    )
        best = ranked[0] if ranked else None
        faster = best is not None and (best.get("speedup_vs_current") or 0.0) > 1.0
        if best is None:
            status = "no correct candidate"
            reason = "the search produced no correct candidate"
        elif self.current_speedup is None:
            status = "candidates found"
            reason = "the current kernel could not be measured in the sandbox; speedups are over the reference"
        elif faster:
            status = "faster candidate found"
            reason = (
                f"candidate {best['node_id']} measured {best['speedup_vs_current']:.2f}x the current "
                "kernel (one measurement in the search, not re-measured)"
            )
        else:
            status = "no faster candidate"
            reason = "no correct candidate measured faster than the current kernel; keep it"
        if interrupted:
            reason = "interrupted (Ctrl-C or a crash) after the evaluations listed; " + reason
        cur = self.current
        data: dict[str, Any] = {
            "status": status,
            "reason": reason,
            "interrupted": interrupted,
            "kernel": self.kernel,
            "budget": self.budget,
            "backend": self.backend_name,
            "evaluations": len(nodes),
            "stop_reason": stop_reason or ("interrupted" if interrupted else ""),
            "usd": sum(n.candidate.cost_usd for n in nodes if n.candidate is not None),
            "elapsed_s": time.monotonic() - self.started,
            "run_dir": str(self.run.path) if self.run else None,
            "resumed": bool(self.run and self.run.resumed),
            "trajectory": str(self.run.trajectory) if self.run else None,
            "current": {
                "status": None if cur is None else cur.status,
                "reason": None if cur is None else cur.reason,
                "speedup_vs_reference": self.current_speedup,
                "efficiency": self.efficiency_before,
            },
            "outcomes": outcomes,
            "candidates": ranked,
            "winner": best["node_id"] if faster and best else None,
            "best_speedup": best["speedup_vs_reference"] if best else None,
            "best_speedup_vs_current": best.get("speedup_vs_current") if best else None,
            "best_patch": self.patch_info.get("best_patch") if faster else None,
            "patch_errors": list(self.patch_info.get("errors") or [])
            + ([self.site_error] if self.site_error else []),
            "guidance": best.get("lineage_guidance", []) if best else [],
        }
        if self.run is not None:
            atomic_write_json(self.run.summary, data)
        return data

    def final(self, ranking: Any, details: dict[str, Any]) -> dict[str, Any]:
        """The summary once the search ended and its contenders were re-measured."""
        from ..handoff.outcome import final_candidates, write_patches

        nodes = list(self.algorithm.tree.evaluated()) if self.algorithm is not None else []
        ranked = final_candidates(
            ranking,
            nodes,
            current_speedup=self.current_speedup,
            efficiency_before=self.efficiency_before,
            efficiency_of=self.efficiency_of,
        )
        winner = ranking.winner
        info: dict[str, Any] = {"best_patch": None, "errors": []}
        writing = time.perf_counter()
        if self.run is not None and self.site is not None and self.root is not None and ranked:
            info = write_patches(
                ranked,
                {e["node_id"]: e["code"] for e in ranked},
                self.site,
                self.root,
                self.run.patches,
                kernel=self.kernel,
                best=winner.node_id if winner is not None else None,
            )
        for entry in ranked:
            entry.pop("code", None)
        self.patches_s += time.perf_counter() - writing
        top = ranked[0] if ranked else None
        cur = self.current
        elapsed = time.monotonic() - self.started
        data: dict[str, Any] = {
            "status": ranking.status,
            "reason": ranking.reason,
            "interrupted": False,
            "kernel": self.kernel,
            "budget": self.budget,
            "backend": self.backend_name,
            "evaluations": ranking.evaluations,
            "stop_reason": ranking.stop_reason,
            "usd": ranking.usd,
            "elapsed_s": elapsed,
            # Every second of `elapsed_s` in a named bucket; `other` is the rest
            # (`run/search_clock.py`). Written last, so the summary's own write is "other".
            "wall_s": with_rest(
                dict(ranking.wall_s), elapsed, setup=self.setup_s, patches=self.patches_s
            ),
            # Evaluations in flight at once (Dask workers) overlap: their buckets can add up
            # to more than the elapsed time, by this much.
            "wall_overlap_s": max(
                0.0,
                sum(ranking.wall_s.values()) + self.setup_s + self.patches_s - elapsed,
            ),
            "rounds": ranking.rounds,
            "baseline": ranking.baseline,
            "run_dir": str(self.run.path) if self.run else None,
            "resumed": bool(self.run and self.run.resumed),
            "trajectory": details.get("trajectory"),
            "current": {
                "status": None if cur is None else cur.status,
                "reason": None if cur is None else cur.reason,
                "speedup_vs_reference": self.current_speedup,
                "efficiency": self.efficiency_before,
            },
            "outcomes": dict(
                Counter(n.evaluation.status for n in nodes if n.evaluation is not None)
            ),
            "candidates": ranked,
            "winner": None if winner is None else winner.node_id,
            "best_speedup": None if top is None else top.get("speedup_vs_reference"),
            "best_speedup_vs_current": None if top is None else top.get("speedup_vs_current"),
            "best_patch": info.get("best_patch"),
            "patch": None if top is None else top.get("patch"),
            "strategy": None if top is None else top.get("strategy"),
            "patch_errors": list(info.get("errors") or [])
            + ([self.site_error] if self.site_error else []),
            "guidance": [] if top is None else top.get("lineage_guidance", []),
            "ranking": ranking.to_dict(),
            "profiles": details.get("profiles", []),
            "per_candidate": details.get("per_candidate", []),
            "reference_profile_s": details.get("reference_profile_s"),
            "confirmation": details.get("winner_confirmation"),
            "sandbox": details.get("sandbox"),
            "compile_caches": details.get("compile_caches"),
        }
        if top is not None:
            data["best"] = {
                k: top.get(k)
                for k in ("node_id", "speedup_vs_current", "speedup_vs_reference", "verdict")
            }
        if ranking.status != "improved":
            data["why"] = ranking.reason
        if details.get("dask"):  # the cluster of --kernelpro-dask: workers, start/probe/close s
            data["dask"] = details["dask"]
        if self.run is not None:
            atomic_write_json(self.run.summary, data)
        return data


class _ObservedGenerator:
    """The Programmer Agent, reporting "generating" and the spend to the progress line."""

    def __init__(self, inner: Any, state: _SearchState) -> None:
        self.inner = inner
        self.state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, mode: Any, parent: Any, evaluation: Any, *, max_candidates: int = 1) -> Any:
        self.state.summary()  # the node evaluated last is in the tree now: keep it on disk
        self.state.progress.phase("generating")
        out = self.inner.generate(mode, parent, evaluation, max_candidates=max_candidates)
        self.state.progress.spent(self.state.progress.usd + sum(c.cost_usd for c in out))
        return out


class _ObservedEvaluator:
    """The evaluator, reporting each outcome to the progress line."""

    def __init__(self, inner: Any, state: _SearchState) -> None:
        self.inner = inner
        self.state = state

    def prepare(self, candidates: Any) -> None:
        """Let the inner evaluator build ahead (`SandboxEvaluator.prepare`)."""
        self.state.progress.phase("building")
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            prepare(candidates)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        state = self.state
        state.summary()
        evaluation = self.inner.evaluate(candidate)
        base = state.current_speedup
        vs_current = (
            evaluation.speedup / base if evaluation.ok and evaluation.speedup and base else None
        )
        shown = (
            vs_current
            if vs_current is not None
            else (evaluation.speedup if evaluation.ok else None)
        )
        label = f"candidate {len(state.algorithm.tree.nodes)}" if state.algorithm else ""
        detail = evaluation.status if not evaluation.ok else ""
        if evaluation.reason and not evaluation.ok:
            reason = " ".join(evaluation.reason.split())
            detail += f" ({reason if len(reason) <= 90 else reason[:87] + '...'})"
        profile = evaluation.metrics.get("profile") or {}
        note = ""
        if isinstance(profile.get("profile_s"), (int, float)):
            note = f"profiled in {profile['profile_s']:.1f} s"
            if profile.get("error"):
                note += f" (no profile: {str(profile['error'])[:60]})"
        state.progress.evaluated(detail or "correct", shown, label=label, note=note)
        return evaluation


def _efficiency_of(record: Any) -> Callable[[float], float | None] | None:
    """A candidate's share of the roofline from its speedup over the current kernel: its
    time (the current kernel's timed median over the speedup) priced on the item's roofline,
    at the peak its rate implies when it beats the op-level one (`measure.peak_paths`)."""
    from ..measure.peak_paths import kernel_efficiency

    median, roofline = record.median_s, record.roofline
    if not median or roofline is None:
        return None
    return lambda vs_current: kernel_efficiency(roofline, median / vs_current)


def optimize_item(run: ItemRun, services: Services) -> None:
    """Run the search within the session's budget; a search that did not run fails the item."""
    from ..search.budget import parse_budget

    settings, record = services.settings, run.record
    budget = parse_budget(settings.optimize or "", where="--kernelpro-optimize")
    kernel_dir = settings.artifacts_dir / "optimize" / _slug(record.name)
    progress = services.search_progress(record.name, str(budget), budget.max_evaluations)
    state = _SearchState(
        record.name, str(budget), progress, record.efficiency, _efficiency_of(record)
    )
    summary: dict[str, Any]
    try:
        summary = _search(run, services, kernel_dir, state)
    except KernelproError as exc:
        summary = {
            "status": "not run",
            "reason": str(exc),
            "kernel": record.name,
            "run_dir": str(state.run.path) if state.run else None,
        }
    except KeyboardInterrupt:
        summary = (
            state.summary(interrupted=True)
            if state.algorithm is not None
            else {
                "status": "not run",
                "reason": "interrupted before the search started",
                "interrupted": True,
                "kernel": record.name,
            }
        )
        _attach(record, summary)
        progress.close(f"interrupted; kept {summary.get('run_dir')}")
        record.outcome = "passed"
        record.message = "optimize interrupted"
        services.add_record(record)  # no report comes for an interrupted item
        raise
    progress.close(_closing_line(summary))
    _attach(record, summary)
    if summary["status"] == "not run":
        raise KernelproError(
            f"{record.name}: --kernelpro-optimize was requested but the search did not run: "
            f"{summary['reason']}"
        )


def _attach(record: KernelRecord, summary: dict[str, Any]) -> None:
    from ..gate.optimize_table import render_optimize_text

    record.extra["optimize"] = summary
    record.extra["optimize_text"] = render_optimize_text(summary)


def _closing_line(summary: dict[str, Any]) -> str:
    best = summary.get("best_speedup_vs_current")
    text = f"{summary['status']}"
    if best is not None:
        text += f", best {best:.2f}x the current kernel"
    if summary.get("best_patch"):
        text += f"; patch {summary['best_patch']}"
    return text


class SearchHooks:
    """How this module watches and steers `optimize_search.run_search` (see its doc)."""

    def __init__(self, settings: Any, record: KernelRecord, run: RunFolder, state: _SearchState):
        self.settings = settings
        self.record = record
        self.run = run
        self.state = state
        self.resume = run.resumed

    def phase(self, name: str) -> None:
        self.state.progress.phase(name)

    def backend(self, out_dir: Path) -> Any:
        """A replay (directory or file, noise-tolerant); None: the loop's own backend."""
        backend = _backend(self.settings, self.record, self.run)
        if backend is not None:
            self.state.backend_name = getattr(backend, "name", "")
        else:
            self.state.backend_name = self.settings.llm
        return backend

    def checked_current(self, evaluation: Evaluation) -> None:
        self.state.current = evaluation
        if evaluation.ok:
            return
        reason = evaluation.reason or evaluation.status
        if any(word in (reason + evaluation.logs) for word in _IMPORT_FAILURES):
            raise KernelproError(
                f"the sandbox cannot import the kernel {self.record.name} as pytest did: "
                f"{reason}. It runs with pytest's sys.path; make the kernel's imports work from "
                "the rootdir (pythonpath ini, a package, or conftest sys.path insertions)"
            )
        self.state.progress.note(
            f"the current kernel did not pass in the sandbox ({reason}); speedups are over "
            "the reference"
        )

    def wrap(self, generator: Any, evaluator: Any) -> tuple[Any, Any]:
        return _ObservedGenerator(generator, self.state), _ObservedEvaluator(evaluator, self.state)

    def started(self, algorithm: Any) -> None:
        self.state.algorithm = algorithm


def _search(
    run: ItemRun, services: Services, kernel_dir: Path, state: _SearchState
) -> dict[str, Any]:
    from ..handoff.runs import open_run
    from ..handoff.site import kernel_site
    from ..search.patch import PatchError
    from .optimize_search import run_search

    settings = services.settings
    folder = open_run(kernel_dir, resume=settings.resume)
    state.run = folder
    state.progress.note(("resuming " if folder.resumed else "run folder ") + str(folder.path))
    try:
        state.site, state.root = kernel_site(
            run.locator, run.problem.kind, run.module, settings.rootpath
        )
    except PatchError as exc:
        state.site_error = f"no patch can be written: {exc}"
    state.progress.phase("checking")
    hooks = SearchHooks(settings, run.record, folder, state)
    state.setup_s = time.monotonic() - state.started
    ranking, details = run_search(run, services, folder.path, hooks=hooks)
    atomic_write_json(folder.path / "ranking.json", ranking.to_dict())
    return state.final(ranking, details)


def _backend(settings: Any, record: KernelRecord, run: RunFolder) -> Any:
    """The model backend, recording every call into the run folder."""
    from ..agents.llm.base import LLMError
    from ..agents.llm.replay import RecordingBackend
    from ..handoff.replay import NoiseTolerantReplay, recording_for, replay_source

    source = replay_source(settings.llm)
    if source is None:
        return None  # the loop builds the model backend, recording into the run folder
    try:
        path = recording_for(source, record.name, record.kernel)
        if path is None:
            raise KernelproError(
                f"the replay directory {source} has no recording for {record.name}"
            )
        replay = NoiseTolerantReplay(path)
        if run.resumed:
            # Answers whose candidates reached the trajectory; one generated but cut off by
            # the interruption before it was evaluated is served again.
            replay.skip_served(run.trajectory)
        return RecordingBackend(replay, run.llm_calls)
    except LLMError as exc:
        raise KernelproError(str(exc)) from None
