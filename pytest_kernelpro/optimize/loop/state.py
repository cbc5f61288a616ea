"""What a running search has found, kept on disk as it grows: `SearchState` writes the run
folder's summary (and the interim patches, when the ranking changed) after every evaluation,
so Ctrl-C or a crash keeps the best so far, and once more at the end with the re-measured
ranking (the only summary that names a `best.patch`); `ObservedGenerator` and `ObservedEvaluator` wrap the Programmer Agent and the
evaluator to keep it and the live progress line current."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.optimize.loop.clock import with_rest

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.loop.patch import KernelSite
    from pytest_kernelpro.optimize.loop.progress import SearchProgress
    from pytest_kernelpro.optimize.loop.runs import RunFolder
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation


class SearchState:
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
        self._written_best: tuple[int, ...] | None = None  # None: nothing written yet
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
        from pytest_kernelpro.optimize.loop.outcome import rank_nodes, sync_patches, write_patches

        nodes = list(self.algorithm.tree.evaluated()) if self.algorithm is not None else []
        ranked, outcomes = rank_nodes(
            nodes,
            current_speedup=self.current_speedup,
            efficiency_before=self.efficiency_before,
            efficiency_of=self.efficiency_of,
        )
        ids = tuple(e["node_id"] for e in ranked)
        if self.run is not None:
            if ids != self._written_best:
                # Interim patches only (`outcome.write_patches`): best.patch waits for the
                # ranking. The first write also clears the patches of an earlier run resumed.
                if self.site is not None and self.root is not None and ranked:
                    top = ranked[0]
                    self.patch_info = write_patches(
                        ranked,
                        {n.id: n.candidate.code for n in nodes if n.candidate is not None},
                        self.site,
                        self.root,
                        self.run.patches,
                        kernel=self.kernel,
                        best=top["node_id"]
                        if (top.get("speedup_vs_current") or 0.0) > 1.0
                        else None,
                        interim=True,
                    )
                else:
                    sync_patches(self.run.patches, keep=set())
                    self.patch_info = {"best_patch": None, "errors": []}
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
            # No ranking yet, so no best.patch: the top candidate's interim patch, if faster.
            "best_patch": None,
            "interim_best_patch": self.patch_info.get("interim_best_patch") if faster else None,
            "patch_errors": list(self.patch_info.get("errors") or [])
            + ([self.site_error] if self.site_error else []),
            "guidance": best.get("lineage_guidance", []) if best else [],
        }
        if self.run is not None:
            atomic_write_json(self.run.summary, data)
        return data

    def final(self, ranking: Any, details: dict[str, Any]) -> dict[str, Any]:
        """The summary once the search ended and its contenders were re-measured."""
        from pytest_kernelpro.optimize.loop.outcome import (
            final_candidates,
            sync_patches,
            write_patches,
        )

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
        elif self.run is not None:  # nothing ranked: no interim patch outlives the search
            sync_patches(self.run.patches, keep=set())
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
            # (`optimize/loop/clock.py`). Written last, so the summary's own write is "other".
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
            "standby": details.get("standby"),  # processes started ahead (sandbox/pool.py)
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


class ObservedGenerator:
    """The Programmer Agent, reporting "generating" and the spend to the progress line."""

    def __init__(self, inner: Any, state: SearchState) -> None:
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


class ObservedEvaluator:
    """The evaluator, reporting each outcome to the progress line."""

    def __init__(self, inner: Any, state: SearchState) -> None:
        self.inner = inner
        self.state = state

    def prepare(self, candidates: Any) -> None:
        """Let the inner evaluator build ahead (`SandboxEvaluator.prepare`)."""
        self.state.progress.phase("building")
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            prepare(candidates)

    def last_evaluation(self) -> None:
        """Pass on that the next evaluation is the budget's last (`SandboxEvaluator.last_evaluation`)."""
        last = getattr(self.inner, "last_evaluation", None)
        if callable(last):
            last()

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
