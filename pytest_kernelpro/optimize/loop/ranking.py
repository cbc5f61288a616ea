"""The end of a search: every correct candidate ranked, the contenders re-measured
interleaved with the current kernel and the reference (`search.remeasure`) and ranked with the
gate's rule (`search.ranking`), then the winner re-timed once more in a fresh sandboxed
worker (`confirm_winner`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_kernelpro.optimize.loop.shims import REFERENCE_AS_CANDIDATE

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.loop.clock import WallClock
    from pytest_kernelpro.optimize.search.ranking import SearchRanking
    from pytest_kernelpro.optimize.search.tree import SearchNode, SearchResult

REMEASURE_ROUNDS = 5


def guidance_chain(node: SearchNode) -> tuple[str, ...]:
    """The profiler guidance each optimize prompt on the way to `node` carried (root first):
    the guidance of every correct ancestor whose child on this path was an optimization."""
    out = []
    for step in node.path()[1:]:
        parent = step.parent
        if step.mode == "optimize" and parent is not None and parent.evaluation is not None:
            metrics = parent.evaluation.metrics
            out.append(str(metrics.get("guidance_md") or metrics.get("raw_guidance_md") or ""))
    return tuple(out)


def ranked_candidates(result: SearchResult) -> list[Any]:
    """Every correct node of the search as a `RankedCandidate` (not re-measured yet)."""
    from pytest_kernelpro.optimize.search.ranking import RankedCandidate

    out = []
    for node in result.nodes:
        if node.speedup is None or node.candidate is None:
            continue
        profile = (node.evaluation.metrics.get("profile") or {}) if node.evaluation else {}
        out.append(
            RankedCandidate(
                node_id=node.id,
                code=node.candidate.code,
                strategy=node.candidate.strategy,
                mode=str(node.mode or ""),
                depth=node.depth,
                lineage=tuple(n.id for n in node.path()[1:]),
                search_speedup=node.speedup,
                guidance=guidance_chain(node),
                profile_s=profile.get("profile_s"),
            )
        )
    return out


def final_ranking(
    kernel: str,
    result: SearchResult,
    *,
    sandbox_source: str,
    current_code: str,
    current_speedup: float | None,
    device: str,
    timing: dict[str, Any],
    threshold: float,
    env: dict[str, str] | None,
    clock: WallClock,
    atol: float | None = None,
    rtol: float | None = None,
    rounds: int = REMEASURE_ROUNDS,
    timeout_s: float = 600.0,
    caches: Any = None,
    current_is_reference: bool = False,
    budget_s: float | None = None,
    cpu_threads: int | None = None,
    truth: dict[str, Any] | None = None,
) -> SearchRanking:
    """Re-measure the contenders with the current kernel and the reference; rank them. The
    caller counts the whole of it as the wall split's `remeasure` (the statistics' imports
    and the contenders' builds are part of it). The rounds' timing is bounded by `budget_s`
    (None: `search.ranking.RANKING_BUDGET_S`); candidates far slower than the current kernel
    in the search are not re-measured (`search.ranking.drop_far_slower`); a current kernel
    that is the reference is timed once for both."""
    from dataclasses import replace

    from pytest_kernelpro.optimize.sandbox.remeasure import remeasure, workers_that_fit
    from pytest_kernelpro.optimize.search.ranking import (
        FAR_SLOWER,
        RANKING_BUDGET_S,
        SearchRanking,
        drop_far_slower,
        pick_contenders,
        rank,
    )

    search = {
        "evaluations": result.evaluations,
        "stop_reason": result.stop_reason,
        "usd": result.usd,
    }
    candidates = ranked_candidates(result)
    if not candidates:
        return SearchRanking(
            kernel=kernel,
            status="no correct candidate",
            reason="the search produced no correct candidate; the current kernel stays",
            **search,
            wall_s=clock.totals(),
        )
    picked = pick_contenders(candidates, current_speedup=current_speedup)
    # The bar is the current kernel's speed in the sandbox, the reference's where unknown.
    bar = "current kernel" if current_speedup else "reference"
    # The 2x margin rests on the GPU's spread between processes (14% at most on the H200); a
    # shared CPU's single measurements swing by more than that, so there every pick is
    # re-measured (CPU kernels are cheap to time).
    far_slower = FAR_SLOWER if device.startswith("cuda") else 0.0
    contenders, dropped = drop_far_slower(
        picked, current_speedup=current_speedup, baseline=bar, ratio=far_slower
    )
    chosen = {c.node_id for c in picked}
    others = dropped + [c for c in candidates if c.node_id not in chosen]
    if not contenders:
        return SearchRanking(
            kernel=kernel,
            status="no improvement found",
            reason=(
                f"every correct candidate was far slower than the {bar} in the search "
                f"({dropped[0].reason}); none re-measured, the current kernel stays"
            ),
            candidates=tuple(others),
            **search,
            wall_s=clock.totals(),
        )
    room = workers_that_fit(sandbox_source, device)
    with_reference = not current_is_reference
    one_at_a_time = False
    if room is not None and room.workers < 1 + with_reference + len(contenders):
        # All contenders' workers stay alive through every round: fewer of them, the
        # reference first (it is there to be shown, not ranked), then the slowest picks.
        # Where fewer than two fit, the current kernel and the fastest pick take turns, each
        # turn in a worker of its own (the evaluations' workers, as large, ran one at a time).
        one_at_a_time = room.workers < 2
        with_reference = False
        kept = contenders[: max(1, room.workers - 1)]
        others = [
            replace(c, verdict="not re-measured", reason=f"no room {room.where}: {room.describe()}")
            for c in contenders[len(kept) :]
        ] + others
        contenders = kept
    entries = [("current", current_code)]
    if with_reference:
        entries.append(("reference", REFERENCE_AS_CANDIDATE))
    entries += [(f"node{c.node_id}", c.code) for c in contenders]
    measured = remeasure(
        sandbox_source,
        entries,
        device=device,
        rounds=rounds,
        timing=timing,
        env=env,
        timeout_s=timeout_s,
        atol=atol,
        rtol=rtol,
        caches=caches,
        budget_s=RANKING_BUDGET_S if budget_s is None else budget_s,
        cpu_threads=cpu_threads,
        one_at_a_time=one_at_a_time,
        truth=truth,
    )
    baseline, base_label = "current", "current kernel"
    if "current" not in measured.samples:
        baseline, base_label = "reference", "reference"
    if baseline not in measured.samples:
        return SearchRanking.not_run(
            kernel,
            "the final re-measurement failed for both the current kernel and the reference: "
            + "; ".join(f"{k}: {v}" for k, v in measured.errors.items()),
            **search,
            wall_s=clock.totals(),
        )
    ranking = rank(
        kernel,
        [(c, measured.samples.get(f"node{c.node_id}", [])) for c in contenders],
        measured.samples[baseline],
        rounds=measured.rounds,
        reference_samples=measured.samples.get(
            "current" if current_is_reference else "reference", []
        ),
        others=others,
        threshold=threshold,
        device=measured.device,
        baseline=base_label,
        errors={
            c.node_id: measured.errors[f"node{c.node_id}"]
            for c in contenders
            if f"node{c.node_id}" in measured.errors
        },
        **search,
        wall_s=clock.totals(),
        cost=measured.cost(),
    )
    return ranking


# Winners confirmed at most this many times: a disqualified winner's place goes to the next
# clear winner, which is confirmed in turn (each confirmation is a fresh worker).
MAX_CONFIRMATIONS = 3


def confirm_winner(ranking: Any, result: Any, sandbox: Any) -> tuple[Any, dict[str, Any]]:
    """The winner's time once more, in a fresh sandboxed worker whose clocks its code cannot
    patch (`SandboxEvaluator.confirm`); a time that does not hold up takes the win away, and
    the next clearly faster candidate (if any) becomes the winner and is confirmed in turn, so
    an honest winner is never lost to a disqualified one."""
    details: dict[str, Any] = {"status": "no winner to confirm"}
    disqualified: list[dict[str, Any]] = []
    for _ in range(MAX_CONFIRMATIONS):
        winner = ranking.winner
        if winner is None:
            break
        node = next((n for n in result.nodes if n.id == winner.node_id), None)
        if node is None or node.evaluation is None:
            details = {"status": "winner not found in the search"}
            break
        confirmed = sandbox.confirm(node.candidate, node.evaluation)
        if confirmed.status == "correct":
            retimed = dict(confirmed.timing.get("confirmed") or {})
            # Outside the tolerance in the fast direction: a disagreement, never "confirmed".
            details = {"status": str(retimed.get("agreement") or "confirmed"), **retimed}
            break
        ranking = _without_winner(ranking, winner, confirmed.reason)
        disqualified.append({
            "node": winner.node_id,
            "reason": confirmed.reason,
            **dict(confirmed.timing.get("confirmation") or {}),
        })  # fmt: skip
        details = {"status": "disqualified", **disqualified[-1]}
    if disqualified:
        details["disqualified"] = disqualified
    return ranking, details


def _without_winner(ranking: Any, winner: Any, why: str | None) -> Any:
    """The ranking with its winner disqualified (out of the ranking, so no patch is written
    for it): the next clear winner leads, or "no improvement found"."""
    import dataclasses

    reason = f"the winner (node {winner.node_id}) was disqualified: {why}"
    out = dataclasses.replace(winner, rank=None, verdict="failed", reason=reason)
    ranked = [c for c in ranking.candidates if c.rank is not None and c is not winner]
    ranked = [dataclasses.replace(c, rank=i) for i, c in enumerate(ranked, 1)]
    rest = [c for c in ranking.candidates if c.rank is None and c is not winner]
    candidates = tuple([*ranked, out, *rest])
    if ranked and ranked[0].clear:
        best = ranked[0]
        status = "improved"
        reason = (
            f"candidate {best.node_id} is {best.speedup_vs_current:.3g}x the {ranking.baseline} "
            f"({best.reason}); {reason}"
        )
    else:
        status = "no improvement found"
    return dataclasses.replace(ranking, status=status, reason=reason, candidates=candidates)
