"""The outcome of one search as the user reads it: the ranked candidates (speedup over the
current kernel and over the reference, % of roofline before and after, strategy, outcome),
a patch per ranked candidate plus `best.patch`, and the tools' guidance that led there.

`best.patch` is written only for the winner of a finished search's ranking. While the search
runs (and when it is interrupted) the patches are `interim-N.patch`: single measurements,
not re-measured, so no file named "best" may claim more. Every write leaves the patches
folder holding exactly the patches the summary lists (`sync_patches`): an interim patch the
ranking did not confirm, or a patch of an earlier run resumed here, is removed.

At the end of a search the speedups are the re-measured ones of `search.ranking`
(`final_candidates`); while it runs, and when it is interrupted, they come from the search's
single measurements (`rank_nodes`, marked "not re-measured"): the current kernel is evaluated
in the sandbox like a candidate (`current_speedup`: its speedup over the reference there),
and a candidate's speedup over it is the ratio of the two. % of roofline after is the
kernel's measured % of roofline times the speedup over the current kernel, or, where the
caller gives `efficiency_of`, the candidate's time priced on the roofline (a candidate faster
than the op-level peak allows is priced at the peak its rate implies).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.fileio import atomic_write_text

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.loop.patch import KernelSite
    from pytest_kernelpro.optimize.search.tree import SearchNode

MAX_RANKED = 5  # candidates listed, each with its patch
BEST_PATCH = "best.patch"  # the ranked winner's patch, and only that
CANDIDATE_PREFIX = "candidate-"  # a ranked candidate of a finished search
INTERIM_PREFIX = "interim-"  # a candidate of a search still running or interrupted
_SEVERITY = {"critical": 0, "high": 1, "medium": 2, "low": 3}


def guidance_of(node: SearchNode, limit: int = 3) -> list[str]:
    """One line per finding of `node`'s evaluation, most severe first."""
    ev = node.evaluation
    if ev is None:
        return []
    findings = sorted(
        (f for f in ev.findings if isinstance(f, dict)),
        key=lambda f: _SEVERITY.get(str(f.get("severity", "")).lower(), 9),
    )
    lines = []
    for finding in findings[:limit]:
        title = str(finding.get("title") or finding.get("tool") or "finding")
        severity = str(finding.get("severity") or "").lower()
        lines.append(f"[{severity}] {title}" if severity else title)
    return lines


def lineage_guidance(node: SearchNode) -> list[dict[str, Any]]:
    """The guidance each ancestor's profile gave the prompt that led to `node`, root first."""
    steps = []
    for ancestor in node.path()[1:-1]:
        lines = guidance_of(ancestor)
        if lines:
            steps.append({"node_id": ancestor.id, "guidance": lines})
    return steps


def rank_nodes(
    nodes: list[SearchNode],
    *,
    current_speedup: float | None,
    efficiency_before: float | None,
    efficiency_of: Callable[[float], float | None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(ranked correct candidates, count of every outcome) from the search tree."""
    outcomes = Counter(n.evaluation.status for n in nodes if n.evaluation is not None)
    seen: set[str] = set()
    ranked = []
    correct = [n for n in nodes if n.speedup is not None and n.candidate is not None]
    for node in sorted(correct, key=lambda n: (-(n.speedup or 0.0), n.id)):
        assert node.candidate is not None
        if node.candidate.code in seen:
            continue
        seen.add(node.candidate.code)
        vs_current = node.speedup / current_speedup if current_speedup and node.speedup else None
        ranked.append(
            {
                "rank": len(ranked) + 1,
                "node_id": node.id,
                "mode": node.mode,
                "depth": node.depth,
                "strategy": node.candidate.strategy,
                "status": "correct",
                "search_speedup": node.speedup,
                "speedup_vs_reference": node.speedup,
                "speedup_vs_current": vs_current,
                "efficiency_after": _efficiency_after(efficiency_before, vs_current, efficiency_of),
                "verdict": "not re-measured",
                "guidance": guidance_of(node),
                "lineage_guidance": lineage_guidance(node),
                "lineage": [n.id for n in node.path()[1:]],
            }
        )
        if len(ranked) >= MAX_RANKED:
            break
    return ranked, dict(outcomes)


def _efficiency_after(
    before: float | None,
    vs_current: float | None,
    efficiency_of: Callable[[float], float | None] | None,
) -> float | None:
    """A candidate's share of the roofline: `efficiency_of(vs_current)` where the caller can
    price it (a candidate faster than the op-level peak allows is priced at the peak its rate
    implies, `measure.roofline`), else the current kernel's share times the speedup."""
    if vs_current is None:
        return None
    if efficiency_of is not None:
        return efficiency_of(vs_current)
    return None if before is None else before * vs_current


def final_candidates(
    ranking: Any,
    nodes: list[SearchNode],
    *,
    current_speedup: float | None,
    efficiency_before: float | None,
    efficiency_of: Callable[[float], float | None] | None = None,
) -> list[dict[str, Any]]:
    """The ranked candidates of a finished search (`search.ranking.SearchRanking`: the
    re-measured contenders first, in rank order), as entries like `rank_nodes` makes, with
    their code under "code"."""
    by_id = {n.id: n for n in nodes}
    out = []
    for c in list(ranking.candidates)[:MAX_RANKED]:
        vs_current = c.speedup_vs_current
        if vs_current is None and c.search_speedup and current_speedup:
            vs_current = c.search_speedup / current_speedup
        node = by_id.get(c.node_id)
        steps = lineage_guidance(node) if node is not None else []
        if not steps:
            steps = [
                {"node_id": i, "guidance": [_first_line(text)]}
                for i, text in zip(c.lineage, c.guidance, strict=False)
                if _first_line(text)
            ]
        out.append(
            {
                "rank": c.rank,
                "node_id": c.node_id,
                "mode": c.mode,
                "depth": c.depth,
                "strategy": c.strategy,
                "status": "correct",
                "search_speedup": c.search_speedup,
                "speedup_vs_reference": (
                    c.speedup_vs_reference
                    if c.speedup_vs_reference is not None
                    else c.search_speedup
                ),
                "speedup_vs_current": vs_current,
                "efficiency_after": _efficiency_after(efficiency_before, vs_current, efficiency_of),
                "verdict": c.verdict,
                "reason": c.reason,
                "p_value": c.p_value,
                "guidance": guidance_of(node) if node is not None else [],
                "lineage_guidance": steps,
                "lineage": list(c.lineage),
                "code": c.code,
            }
        )
    return out


def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        line = line.strip(" #*-")
        if line and not line.lower().startswith("automated bottleneck"):
            return line[:120]
    return ""


def write_patches(
    ranked: list[dict[str, Any]],
    codes: dict[int, str],
    site: KernelSite,
    root: Path,
    folder: Path,
    *,
    kernel: str,
    best: int | None,
    interim: bool = False,
) -> dict[str, Any]:
    """Write a patch for every ranked candidate: `candidate-N.patch` plus `best.patch` for
    node `best` once the search is ranked, `interim-N.patch` while it runs (`interim`; then
    `best` is the top candidate so far and its path goes under "interim_best_patch", never
    "best_patch"). Every other `.patch` file in `folder` is removed, so the folder and the
    summary agree. Returns {"best_patch", "interim_best_patch", "errors"}; the paths go into
    the ranked entries."""
    from pytest_kernelpro.optimize.loop.patch import PatchError, build_patch

    result: dict[str, Any] = {"best_patch": None, "interim_best_patch": None, "errors": []}
    prefix = INTERIM_PREFIX if interim else CANDIDATE_PREFIX
    written: set[Path] = set()
    for entry in ranked:
        code = codes[entry["node_id"]]
        node_id = entry["node_id"]
        vs_current = entry.get("speedup_vs_current")
        vs_reference = entry.get("speedup_vs_reference")
        if vs_current is not None:
            speed = f"{vs_current:.2f}x the current kernel"
        elif vs_reference is not None:
            speed = f"{vs_reference:.2f}x the reference"
        else:
            speed = "speed not measured"
        subject = f"kernelpro: {kernel} candidate {node_id} ({speed})"
        message = _message(entry, kernel, speed)
        try:
            patch = build_patch(
                site,
                code,
                root=root,
                subject=subject,
                message=message,
                header=f"{subject}\nstrategy: {entry.get('strategy') or '-'}",
                note=f"candidate {node_id} of the search, {speed}",
            )
        except PatchError as exc:
            result["errors"].append(f"candidate {node_id}: {exc}")
            continue
        path = atomic_write_text(folder / f"{prefix}{node_id}.patch", patch.text)
        written.add(path)
        entry["patch"] = str(path)
        entry["files"] = [patch.new_file, patch.changed_file]
        if node_id == best and interim:
            result["interim_best_patch"] = str(path)
        elif node_id == best:
            best_path = atomic_write_text(folder / BEST_PATCH, patch.text)
            written.add(best_path)
            result["best_patch"] = str(best_path)
    sync_patches(folder, keep=written)
    return result


def sync_patches(folder: Path, *, keep: set[Path]) -> list[Path]:
    """Remove every `.patch` file in `folder` but those in `keep` (the ones the summary about
    to be written lists); returns the removed paths."""
    removed = []
    if not folder.is_dir():
        return removed
    kept = {p.resolve() for p in keep}
    for path in sorted(folder.glob("*.patch")):
        if path.resolve() not in kept:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _message(entry: dict[str, Any], kernel: str, speed: str) -> str:
    measured = (
        "one measurement in the sandbox, not re-measured"
        if entry.get("verdict") in (None, "not re-measured")
        else f"re-measured against the current kernel: {entry.get('verdict')}"
        + (f", {entry['reason']}" if entry.get("reason") else "")
    )
    lines = [
        f"The search of pytest --kernelpro-optimize found this candidate for {kernel}: {speed}"
        f" ({measured}).",
        "",
        f"Strategy: {entry.get('strategy') or '-'}",
    ]
    steps = entry.get("lineage_guidance") or []
    if steps:
        lines += ["", "Profiler guidance on the way here:"]
        for step in steps:
            lines += [f"- node {step['node_id']}: " + "; ".join(step["guidance"])]
    lines += [
        "",
        "The candidate's source is in the new file; the marked kernel calls it. Check it with",
        f"pytest --kernelpro-check -k {kernel}",
    ]
    return "\n".join(lines)
