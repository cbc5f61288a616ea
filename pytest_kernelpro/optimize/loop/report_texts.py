"""The optimizer's texts: a search's summary (`record.extra["optimize"]`, written by
`optimize/loop/item.py`) as the item section's lines, the terminal's "kernelpro optimize"
section, the PR comment's table and the JUnit properties, handed to the gate as the record's
`SectionPart` (the gate shows them without knowing the optimizer). Strings that come from a
candidate or the model pass `text_safety` here; the comment escapes every cell again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kernelpro.record import SectionPart
from pytest_kernelpro.text_safety import safe_line, safe_text

SECTION_TITLE = "kernelpro optimize"
COMMENT_COLUMNS = (
    "Kernel",
    "Search",
    "Best vs current",
    "vs reference",
    "Roofline before → after",
    "Strategy",
    "Evaluations",
    "Patch",
)
COMMENT_NOTE = (
    "Speedups are single measurements of the search in the sandbox. Apply a patch with "
    "`git apply` from the repository root (it is in the run's artifact)."
)


def section_for(name: str, summary: Mapping[str, Any]) -> SectionPart:
    """The search of kernel item `name` as the record's section."""
    interrupted = " (interrupted)" if summary.get("interrupted") else ""
    text = render_optimize_text(summary)
    return SectionPart(
        title=SECTION_TITLE,
        terminal_lines=(f"{name}{interrupted}", *("  " + line for line in text.splitlines())),
        item_lines=tuple(text.splitlines()),
        comment_columns=COMMENT_COLUMNS,
        comment_rows=(comment_row(name, summary),),
        comment_notes=(COMMENT_NOTE,),
        junit=tuple([key, value] for key, value in junit_properties(summary)),
    )


def _count(n: Any, noun: str) -> str:
    """`n` with its noun, plural unless `n` is 1 ("1 interleaved round")."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _x(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"


def _outcomes(summary: Mapping[str, Any]) -> str:
    counts = summary.get("outcomes") or {}
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"


def render_optimize_text(summary: Mapping[str, Any]) -> str:
    """The search of one kernel as plain text (item section and terminal summary)."""
    lines = [f"optimize: {summary.get('status')}: {summary.get('reason', '')}".rstrip(": ")]
    if summary.get("status") == "not run":
        return "\n".join(lines)
    current = summary.get("current") or {}
    best = summary.get("best") or {}
    if best and summary.get("rounds"):
        vs_ref = best.get("speedup_vs_reference")
        lines.append(
            f"  candidate {best.get('node_id')}: {_x(best.get('speedup_vs_current'))} the "
            f"{summary.get('baseline') or 'current kernel'}"
            + (f" ({_x(vs_ref)} the reference)" if vs_ref else "")
            + f", re-measured in {_count(summary.get('rounds'), 'interleaved round')}: "
            f"{best.get('verdict')}"
            f" ({summary.get('evaluations', 0)} evaluations, stop: {summary.get('stop_reason')})"
        )
    lines.append(
        f"  {summary.get('evaluations', 0)} evaluations (budget {summary.get('budget')}, stop: "
        f"{summary.get('stop_reason') or '-'}), ${float(summary.get('usd') or 0):.2f}, "
        f"{float(summary.get('elapsed_s') or 0):.0f} s; outcomes: {_outcomes(summary)}"
    )
    lines.append(
        f"  current kernel: {_x(current.get('speedup_vs_reference'))} the reference in the "
        f"sandbox, {_pct(current.get('efficiency'))} of roofline"
    )
    candidates = summary.get("candidates") or []
    if candidates:
        lines.append(
            "  rank  node  vs current  vs reference  roofline before -> after  outcome  strategy"
        )
        for c in candidates:
            lines.append(
                f"  {_text(c.get('rank')):>4}  {_text(c.get('node_id')):>4}  {_x(c.get('speedup_vs_current')):>10}  "
                f"{_x(c.get('speedup_vs_reference')):>12}  "
                f"{_pct(current.get('efficiency')):>8} -> {_pct(c.get('efficiency_after')):<8}  "
                f"{_text(c.get('verdict') or c.get('status')):<7}  {safe_line(c.get('strategy') or '-', 60)}"
            )
            if c.get("patch"):
                lines.append(f"        patch: {c['patch']}")
            if c.get("verdict") == "not re-measured" and c.get("reason"):
                lines.append(f"        node {c.get('node_id')}: {c['reason']}")
    cost = (summary.get("ranking") or {}).get("cost") or {}
    if cost:
        lines.append("  " + _cost_line(cost))
    if summary.get("best_patch"):
        lines.append(
            f"  best patch: {summary['best_patch']}  (git apply it from the repository root)"
        )
    elif summary.get("interim_best_patch"):
        lines.append(
            f"  interim patch of the fastest so far (one measurement, not re-measured): "
            f"{summary['interim_best_patch']}"
        )
    for error in summary.get("patch_errors") or []:
        lines.append(f"  patch not written: {error}")
    confirmation = summary.get("confirmation") or {}
    if confirmation.get("status") in ("confirmed", "disagreement", "disqualified"):
        lines.append("  " + _confirmation_line(confirmation))
    guidance = summary.get("guidance") or []
    if guidance:
        lines.append("  guidance that led to the best candidate:")
        for step in guidance:
            lines.append(
                f"    node {step.get('node_id')}: " + "; ".join(step.get("guidance") or [])
            )
    wall = summary.get("wall_s")
    if isinstance(wall, Mapping) and wall:
        lines.append("  wall: " + ", ".join(f"{k} {float(v):.1f} s" for k, v in wall.items()))
    if summary.get("run_dir"):
        resumed = " (resumed)" if summary.get("resumed") else ""
        lines.append(
            f"  run folder: {summary['run_dir']}{resumed}; `kernelpro show {summary['run_dir']}`"
        )
    return "\n".join(lines)


def _cost_line(cost: Mapping[str, Any]) -> str:
    """What the final re-measurement cost (`optimize/sandbox/remeasure.py` RemeasureResult.cost)."""
    plan = cost.get("plan") or {}
    if cost.get("one_at_a_time"):  # one worker fits the GPU: each turn started its own
        turns_s = float(cost.get("turn_start_s") or 0)
        ready = f"one worker at a time, {turns_s:.1f} s starting and stopping workers"
    else:
        ready = f"workers ready after {float(cost.get('start_s') or 0):.1f} s"
    text = (
        f"re-measurement: {float(cost.get('wall_s') or 0):.1f} s ({ready}, "
        f"{cost.get('rounds', 0)} rounds in {float(cost.get('rounds_s') or 0):.1f} s"
    )
    if plan.get("budget_s"):
        text += f" for a {float(plan['budget_s']):g} s timing budget"
    text += ")"
    samples = cost.get("samples") or {}
    if samples:
        text += "; samples: " + ", ".join(f"{k} {v}" for k, v in samples.items())
    if cost.get("stopped"):
        text += f"; {cost['stopped']}"
    return text


def _confirmation_line(conf: Mapping[str, Any]) -> str:
    """The winner's confirmation (`optimize/sandbox/confirm.py`) in one line."""
    text = f"winner {conf.get('status')}"
    fresh, claimed = conf.get("median_s"), conf.get("claimed_median_s")
    if isinstance(fresh, (int, float)) and isinstance(claimed, (int, float)) and claimed > 0:
        text += (
            f": re-timed in a fresh process at {fresh * 1e6:.4g} µs, {fresh / claimed:.2f}x "
            f"the search's {claimed * 1e6:.4g} µs (tolerance {conf.get('tolerance')}x)"
        )
    ncu = conf.get("ncu_gpu_time_s")
    if isinstance(ncu, (int, float)):
        text += f"; ncu's kernels {ncu * 1e6:.4g} µs per call"
    if conf.get("status") in ("disqualified", "disagreement"):
        text += f"; {conf.get('reason')}"
    return text


def comment_row(name: str, summary: Mapping[str, Any]) -> list[str]:
    """The search's row of the PR comment's table (the comment escapes each cell)."""
    best = (summary.get("candidates") or [{}])[0] if summary.get("candidates") else {}
    current = summary.get("current") or {}
    status = str(summary.get("status", "")) + (
        " (interrupted)" if summary.get("interrupted") else ""
    )
    return [
        name,
        status,
        _x(best.get("speedup_vs_current")),
        _x(best.get("speedup_vs_reference")),
        f"{_pct(current.get('efficiency'))} → {_pct(best.get('efficiency_after'))}",
        safe_line(best.get("strategy") or "-", 80),
        f"{int(summary.get('evaluations') or 0)} ({_outcomes(summary)})",
        _patch_name(summary.get("best_patch")),
    ]


def junit_properties(summary: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name suffix, value) pairs of the search for the JUnit file."""
    best = (summary.get("candidates") or [{}])[0] if summary.get("candidates") else {}
    return [
        ("optimize.status", summary.get("status")),
        ("optimize.interrupted", "true" if summary.get("interrupted") else None),
        ("optimize.evaluations", summary.get("evaluations")),
        ("optimize.best_node", best.get("node_id")),
        ("optimize.best_speedup_vs_current", best.get("speedup_vs_current")),
        ("optimize.best_speedup_vs_reference", best.get("speedup_vs_reference")),
        ("optimize.efficiency_before", (summary.get("current") or {}).get("efficiency")),
        ("optimize.efficiency_after", best.get("efficiency_after")),
        ("optimize.strategy", best.get("strategy") or None),
        ("optimize.best_patch", summary.get("best_patch")),
        ("optimize.run_dir", summary.get("run_dir")),
    ]


def _text(value: Any) -> str:
    # Candidate and model text reaches the terminal, the PR comment and JUnit from here.
    return "-" if value is None else safe_text(str(value))


def _patch_name(path: Any) -> str:
    if not path:
        return "-"
    parts = str(path).replace("\\", "/").split("/")
    return "/".join(parts[-4:])  # kernel/run/patches/best.patch: enough to find it
