"""Every text made from one kernel record, in one place.

- `item_section`: the "kernelpro" section of the item's pytest report (plain text).
- `terminal_row`: the record's row in the terminal summary table (`gate.report`).
- `reference_summary`: the "Reference analysis" lines of every optimize prompt, from the
  record's roofline (the Benchmarking Agent's part of the prompt).
- `compare_row`: its row in the `kernelpro compare` table (`gate.compare`).
- `roofline_point_label`, `ceiling_label`, `roofline_title`, `not_plotted`, the axis labels:
  the roofline plot's texts (`gate.plot`).
- `comment_row`, `comment_details`: its row and folded details in the pull-request comment
  (`gate.comment`). The comment is rendered from an artifact of a job that ran the pull
  request's code, so every string from a record goes through `literal_text` (an inline code
  span), `literal_block` (a fenced text block) or `html_text` (escaped, inside our own HTML):
  nothing in a record is ever rendered as Markdown or HTML.

The tables' frames (headers, summaries, footers) stay with the report that holds them; the
texts about the session as a whole are in `gate/render_session.py`, those of a search's
summary in `gate/optimize_table.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    bar,
    cross_device,
    format_change,
    format_time,
    record_status,
    roofline_value,
    short_device,
    stat,
)
from pytest_kernelpro.measure.ceilings import format_rate
from pytest_kernelpro.measure.peak_paths import SHORT_UNIT, attainable_path, price_measured
from pytest_kernelpro.record import KernelRecord, RooflinePart, StatsPart

BOUNDS = ("memory", "compute", "mixed", "latency")  # bound words the comment shows as ours


# ---- the item's report section ----------------------------------------------------------


def item_section(record: KernelRecord) -> str:
    """The per-item "kernelpro" report section (pytest's report sections), plain text."""
    lines = [f"{record.name} on {record.device or record.device_kind} ({record.language})"]
    c = record.correctness
    if c:
        tol = c.tolerance
        lines.append(
            f"correctness: {'passed' if c.passed else 'FAILED'} over {c.trials_run} "
            f"trials; max abs err {c.max_abs_err or 0:.3g}, max rel err "
            f"{c.max_rel_err or 0:.3g} (rtol {tol.rtol if tol else None}, atol "
            f"{tol.atol if tol else None}, {tol.source if tol else None})"
        )
    t = record.timing
    if t:
        s = t.stats or StatsPart()
        lines.append(
            f"timing: median {format_time(s.median_s)}, IQR "
            f"{format_time(s.iqr_s)}, 95% CI [{format_time(s.ci_low_s)}, "
            f"{format_time(s.ci_high_s)}], n={s.n}, {t.method}, "
            f"stop: {t.stop_reason}, throttled samples: {t.throttled_samples}"
        )
    r = record.roofline
    if r:
        eff = f"{record.efficiency:.1%}" if record.efficiency is not None else "-"
        lines.append(
            f"roofline: {r.flops or 0:.4g} FLOP, {r.min_bytes or 0:.4g} B minimal "
            f"({r.unfused_bytes or 0:.4g} B unfused), intensity {r.intensity or 0:.3g} "
            f"FLOP/B vs ridge {r.ridge or 0:.3g} -> {r.bound}-bound; peak "
            f"{r.peak_name}; roofline time {format_time(r.roofline_time_s)}; "
            f"reaches {eff}"
        )
        if record.peak_used and record.peak_used.get("note"):
            lines.append(f"peak used for this kernel: {record.peak_used['note']}")
    if record.gate:
        lines.append(f"gate: {record.gate.status}: {record.gate.message}")
    profile_text = record.extra.get("profile_text")
    if profile_text:
        lines.append(profile_text)
    if record.guidance:
        lines.append(record.guidance)
    optimize_text = record.extra.get("optimize_text")
    if optimize_text:
        lines.append(optimize_text)
    return "\n".join(lines)


# ---- the terminal summary table ---------------------------------------------------------


def terminal_row(
    record: KernelRecord, *, show_device: bool, narrow: bool, bar_width: int, color: bool
) -> list[Any]:
    """One row of the terminal summary table (`gate.report.render_terminal_table`): kernel,
    [device,] median ±IQR/2, [roofline time,] % of roofline with a bar, bound, verdict."""
    from rich.text import Text

    text, style = _verdict_cell(record)
    # Text, not str: a name like "k[/bold]" is a kernel's name, not rich markup.
    row: list[Any] = [Text(record.name)]
    if show_device:
        row.append(Text(short_device(record.device)))
    row.append(_median_cell(record))
    if not narrow:
        row.append(format_time(roofline_value(record, "roofline_time_s")))
    row += [
        _bar_cell(record, bar_width),
        _bound_cell(record),
        Text(text, style=style if color else ""),
    ]
    return row


def peak_used_words(record: KernelRecord) -> str | None:
    """ "3xTF32, inferred" / "above every ceiling" when the kernel ran faster than its
    op-level peak allows (`measure.peak_paths`), from our own words only."""
    used = record.peak_used
    if not isinstance(used, Mapping) or not used.get("note"):
        return None
    if used.get("problem"):
        return "above every ceiling"
    unit = SHORT_UNIT.get(str(used.get("key")))
    return f"{unit}, inferred" if unit and used.get("inferred") else None


def _bound_cell(record: KernelRecord) -> str:
    bound = str(roofline_value(record, "bound") or "–")
    words = peak_used_words(record)
    return f"{bound} ({words})" if words else bound


def _median_cell(record: KernelRecord) -> str:
    med = stat(record, "median_s")
    if med is None:
        return "–"
    q1, q3 = stat(record, "q1_s"), stat(record, "q3_s")
    if q1 is None or q3 is None or med <= 0:
        return format_time(med)
    return f"{format_time(med)} ±{(q3 - q1) / 2 / med:.1%}"


def _bar_cell(record: KernelRecord, bar_width: int) -> str:
    eff = record.efficiency
    if eff is None:
        return "–"
    return f"{bar(eff, bar_width)} {eff:4.0%}"


def _verdict_cell(record: KernelRecord) -> tuple[str, str]:
    status = record_status(record)
    _, word, style = STATUS_STYLE.get(status, ("", status, ""))
    change = record.gate.change if record.gate else None
    text = word
    if change is not None and status not in ("new", "unmeasured"):
        text = f"{word} {format_change(change)}"
        if cross_device(record):
            text += "*"
    return text, style


# ---- the pull-request comment -----------------------------------------------------------


def literal_text(value: Any, *, limit: int = 300, table: bool = True) -> str:
    """Any string from the report, shown as literal text: an inline code span.

    The report is an artifact of a job that ran the pull request's code, so every string in it
    may be hostile. Inside a code span GitHub renders no Markdown, HTML, link, image, mention
    or issue reference, and a `</details>` is text. The fence is one backtick longer than the
    longest run inside; line breaks and control characters become spaces (a code span is
    one line); in a table a pipe is escaped (GFM splits cells before it parses code spans).
    """
    text = "".join(" " if (ord(c) < 32 or 0x7F <= ord(c) < 0xA0) else c for c in str(value))
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text:
        return "–"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    if table:
        text = text.replace("|", "\\|")
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def literal_block(value: Any, *, limit: int = 20_000) -> str:
    """A multi-line string from the report as a fenced text block (never rendered)."""
    text = "".join(c if (c in "\n\t" or ord(c) >= 32) else " " for c in str(value)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    longest = max((len(run) for run in re.findall(r"`{3,}|~{3,}", text)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


_HTML_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    '"': "&quot;",
    # GitHub turns @name and #123 into mentions and links after rendering: break them.
    "@": "&#64;\u200b",
    "#": "&#35;\u200b",
}


def html_text(value: Any, limit: int = 200) -> str:
    """A string from the artifact inside our own HTML: escaped, mentions and links broken."""
    text = " ".join(str(value).split())[:limit]
    return "".join(_HTML_ESCAPES.get(c, c) for c in text)


def _number_text(value: Any) -> str:
    return f"{float(value):.3g}" if isinstance(value, (int, float)) else "–"


def _pct_or_dash(value: Any) -> str:
    return f"{float(value):.1%}" if isinstance(value, (int, float)) else "–"


def status_emoji(status: str) -> str:
    """The emoji of a status word (❔ for one we do not know)."""
    return STATUS_STYLE.get(status, ("❔", status, ""))[0]


def status_label(status: str) -> str:
    """A status word: ours as plain text, an unknown one (from the artifact) as literal text."""
    if status in STATUS_STYLE:
        return status.replace("-", " ")
    return "unknown status " + literal_text(status, limit=40)


def _comment_bar(eff: float | None) -> str:
    if eff is None:
        return "–"
    return f"`{bar(eff, 8)}` {eff:.0%}"


COMMENT_HEADER = (
    "| Kernel | Baseline | Now | Change | % of roofline | Bound | Verdict |\n"
    "|:--|--:|--:|--:|:--|:--|:--|"
)


def comment_row(record: KernelRecord) -> str:
    """One row of the comment's kernel table (`COMMENT_HEADER`); strings from the artifact as
    literal text, a bound word ours only when it is a known one."""
    gate = record.gate
    status = record_status(record)
    cross = cross_device(record)
    base = gate.baseline_median_s if gate else None
    now = stat(record, "median_s")
    change = gate.change if gate and status not in ("new", "unmeasured") else None
    change_text = format_change(change) + ("\\*" if cross and change is not None else "")
    if change is not None and status in ("regressed", "improved"):
        change_text = f"**{change_text}**"
    bound = record.roofline.bound if record.roofline else None
    cells = [
        literal_text(record.name),
        format_time(base) if base else "–",
        format_time(now),
        change_text,
        _comment_bar(record.efficiency),
        (bound if bound in BOUNDS else literal_text(bound) if bound else "–")
        + (f" ({peak_used_words(record)})" if peak_used_words(record) else ""),
        f"{status_emoji(status)} {status_label(status)}",
    ]
    return "| " + " | ".join(cells) + " |"


def comment_details(record: KernelRecord, with_guidance: bool) -> str:
    """The folded details of a kernel that needs attention: the numbers behind its verdict."""
    gate = record.gate
    status = record_status(record)
    conf = (gate.confirmation if gate else None) or {}
    # HTML only around our own words: a name inside <summary> is an HTML-escaped <code>.
    summary = (
        f"<details><summary>{status_emoji(status)} <code>{html_text(record.name)}</code>: "
        f"{html_text(status.replace('-', ' ') if status in STATUS_STYLE else 'unknown status')}"
    )
    if not gate:
        lines = [f"{summary}</summary>", ""]
        lines.append(
            f"- **Failure:** {literal_text(record.message or 'see the test log', limit=1000, table=False)}"
        )
        lines += ["", "</details>"]
        return "\n".join(lines)
    lines = [
        f"{summary} {format_change(gate.change)}</summary>",
        "",
        "| | Baseline | Now | Re-measured |",
        "|:--|--:|--:|--:|",
        f"| Median | {format_time(gate.baseline_median_s)} | "
        f"{format_time(stat(record, 'median_s'))} | {format_time(conf.get('current_median_s'))} |",
        f"| Samples | {gate.n_baseline or '–'} | {gate.n_current or '–'} | "
        f"{conf.get('n') or '–'} |",
        f"| % of roofline | {_pct_or_dash(gate.baseline_efficiency)} | "
        f"{_pct_or_dash(record.efficiency)} | |",
        f"| Device | {literal_text(short_device(gate.baseline_device))} | "
        f"{literal_text(short_device(record.device))} | |",
        "",
    ]
    lines.append(
        f"- **Basis:** {literal_text(gate.basis, table=False)}; "
        f"tolerance {_pct_or_dash(gate.tolerance)}"
    )
    if isinstance(record.peak_used, Mapping) and record.peak_used.get("note"):
        lines.append(
            f"- **Peak used:** {literal_text(record.peak_used['note'], limit=500, table=False)}"
        )
    if gate.p_value is not None:
        lines.append(
            f"- **Mann-Whitney U:** one-sided p = {float(gate.p_value):.2g} "
            f"(alpha {_number_text(gate.alpha)})"
        )
    if conf:
        done = "reproduced" if conf.get("reproduced") else "**not reproduced**"
        p_text = f", p = {float(conf['p_value']):.2g}" if conf.get("p_value") is not None else ""
        lines.append(
            f"- **Confirmation re-measurement:** {done} "
            f"({format_change(conf.get('change'))}{p_text})"
        )
    why = gate.reason or gate.message or ""
    lines.append(f"- **Why:** {literal_text(why, limit=1000, table=False)}")
    if record.outcome in ("failed", "error") and record.message and not gate.failed:
        lines.append(f"- **Test failure:** {literal_text(record.message, limit=1000, table=False)}")
    if with_guidance and record.guidance:
        # Written by the job that ran the PR's code: shown as text, never rendered.
        lines += [
            "",
            "Bottleneck analysis (from the report, verbatim):",
            "",
            literal_block(record.guidance),
        ]
    lines += ["", "</details>"]
    return "\n".join(lines)


# ---- the prompt's reference analysis ----------------------------------------------------


BOUND_ADVICE = {  # what a bound means for the Programmer
    "memory": "memory-bound: the roofline is set by bytes moved; fuse, read each input once, "
    "vectorize, and do not spend effort on tensor cores",
    "compute": "compute-bound: the roofline is set by FLOP/s; use the tensor-core "
    "instructions listed for this GPU and keep them fed",
    "mixed": "between the two ceilings: both data movement and arithmetic throughput matter",
}


def seconds_text(value: float) -> str:
    """Seconds in the prompts' style: 3 significant digits, s / ms / us."""
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def reference_summary(
    roofline: RooflinePart,
    *,
    reference_s: float | None = None,
    current_s: float | None = None,
    validation: Mapping[str, Any] | None = None,
) -> str:
    """The ReferenceAnalysis section of every prompt, from a record's roofline: the bound,
    the peak that sets it, the % of the roofline the reference and the current kernel reach,
    the headroom left, and the ncu validation of the class (Stage 1 on the reference)."""
    bound = str(roofline.bound or "unknown")
    t = roofline.roofline_time_s
    lines = [f"## Reference analysis (Benchmarking Agent, {roofline.device or 'this device'})"]
    lines.append(
        f"- Bound: **{bound}** ({BOUND_ADVICE.get(bound, bound)}); arithmetic intensity "
        f"{float(roofline.intensity or 0):.3g} FLOP/B vs ridge "
        f"{float(roofline.ridge or 0):.3g} FLOP/B."
    )
    peak = roofline.peak_name
    if peak:
        lines.append(
            f"- Peak that sets the roofline: {peak} "
            f"({format_rate(float(roofline.peak_flops or 0), 'FLOP/s')}) and "
            f"{format_rate(float(roofline.bandwidth_Bps or 0), 'B/s')} DRAM; work "
            f"{format_rate(float(roofline.flops or 0), 'FLOP')}, minimal traffic "
            f"{format_rate(float(roofline.min_bytes or 0), 'B')}."
        )
    faster = attainable_path(roofline)
    if t and faster is None:
        parts = [f"- Roofline time {seconds_text(float(t))}"]
        if reference_s:
            parts.append(
                f"the reference takes {seconds_text(reference_s)} ({float(t) / reference_s:.1%} of roofline)"
            )
        priced = price_measured(roofline, current_s) if current_s else None
        if current_s and priced is not None and priced.note:
            parts.append(
                f"the current kernel {seconds_text(current_s)} ({priced.efficiency:.1%} of "
                f"roofline; {priced.note})"
            )
        elif current_s:
            parts.append(
                f"the current kernel {seconds_text(current_s)} ({float(t) / current_s:.1%} of "
                f"roofline): headroom at most {current_s / float(t):.3g}x"
            )
        lines.append("; ".join(parts) + ".")
    elif t and faster is not None:
        lines += _headroom_lines(roofline, faster, reference_s, current_s)
    if validation:
        lines.append(
            f"- ncu validation of the class on the reference: measured "
            f"{validation.get('measured') or 'n/a'} (SM {_pct(validation.get('sm_pct'))}, "
            f"memory {_pct(validation.get('memory_pct'))} of peak) vs theoretical "
            f"{validation.get('theoretical') or 'n/a'}: Stage 1 says "
            f"{validation.get('cls') or 'unknown'} (confidence {validation.get('confidence')})."
        )
    return "\n".join(lines) + "\n"


def _headroom_lines(
    roofline: RooflinePart,
    faster: Mapping[str, Any],
    reference_s: float | None,
    current_s: float | None,
) -> list[str]:
    """The roofline lines when the work has a faster path at the reference's accuracy (fp32
    GEMM/conv with TF32 off: 3xTF32 on the tensor cores): the share of the op-level roofline
    the reference reaches, and the headroom against the faster ceiling, named."""
    t, ta = float(roofline.roofline_time_s or 0), float(faster["roofline_time_s"])
    rule = (roofline.paths or [{}])[0]
    unit, fast_unit = rule.get("unit") or "op-level", faster.get("unit") or faster.get("key")
    parts = [f"- Roofline time {seconds_text(t)} at the {unit} peak"]
    if reference_s:
        parts.append(
            f"the reference takes {seconds_text(reference_s)} ({t / reference_s:.1%} of the "
            f"{unit} roofline)"
        )
    if current_s and current_s >= t:
        parts.append(f"the current kernel {seconds_text(current_s)} ({t / current_s:.1%} of it)")
    elif current_s:
        parts.append(
            f"the current kernel {seconds_text(current_s)} is faster than that roofline allows: "
            f"it does not run on the {unit}s alone"
        )
    rate = format_rate(float(faster.get("peak_flops") or 0), "FLOP/s")
    second = [
        f"- At {faster.get('accuracy', 'the same')} accuracy the work can run faster, at the "
        f"{fast_unit} peak ({rate}): roofline time {seconds_text(ta)}"
    ]
    if reference_s:
        second.append(f"the reference reaches {ta / reference_s:.1%} of it")
    if current_s and current_s > ta:
        second.append(
            f"the current kernel {ta / current_s:.1%}: headroom at most {current_s / ta:.3g}x "
            "against this ceiling"
        )
    elif current_s:
        second.append(
            f"the current kernel is already faster than this ceiling ({ta / current_s:.1%} "
            "of it): it runs at lower accuracy, or a FLOP count is wrong"
        )
    return ["; ".join(parts) + ".", "; ".join(second) + "."]


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.0f}%"


# ---- the `kernelpro compare` table --------------------------------------------------------


def compare_row(record: KernelRecord, base_s: float | None) -> tuple[str, str, str, str, str, str]:
    """Its cells against the base run's median `base_s`: kernel, baseline, head, speedup
    (baseline / head), verdict with the change; and the verdict's style."""
    head_s = record.median_s
    speedup = f"{base_s / head_s:.2f}×" if base_s and head_s else "–"
    gate = record.gate
    status = str((gate.status if gate else None) or record.outcome)
    _, word, style = STATUS_STYLE.get(status, ("", status, ""))
    change = gate.change if gate else None
    verdict = word if change is None else f"{word} {format_change(change)}"
    return record.name, format_time(base_s), format_time(head_s), speedup, verdict, style


# ---- the roofline plot --------------------------------------------------------------------

PLOT_X_LABEL = "arithmetic intensity (FLOP / byte, minimal bytes)"
PLOT_Y_LABEL = "achieved FLOP/s (FLOPs / median time)"
# The legend entry of each verdict that gets its own marker (`gate.plot`).
VERDICT_LEGEND = {
    "regressed": "regressed",
    "below-roofline": "below min_roofline",
    "suspect": "suspect (not failed)",
    "improved": "improved",
}


def roofline_point_label(
    name: str, share: float, *, status: str, change: float | None, flagged: bool
) -> str:
    """'name (76%)', or 'name (1%, suspect +94.2%)' when the verdict needs attention
    (`flagged`); `share` is the achieved FLOP/s over the roof at its intensity."""
    text = f"{name} ({share:.0%}"
    if flagged:
        change_text = format_change(change)
        text += f", {status}" + (f" {change_text}" if change_text != "–" else "")
    return text + ")"


def ceiling_label(device: str, peak_name: str, peak: float, bw: float) -> str:
    """A ceiling's legend entry. Peak names often carry their value ("FP32 CUDA core
    (measured 50.9 TFLOP/s)"): it is not said twice."""
    flops = "" if "FLOP/s" in peak_name else f": {peak / 1e12:.3g} TFLOP/s"
    return f"{device} {peak_name}{flops}, {bw / 1e9:.4g} GB/s"


def roofline_title(devices: list[str], count: int) -> str:
    return f"Roofline on {', '.join(devices)}: {count} kernel{'s' * (count > 1)}"


NOT_PLOTTED = {
    "untimed": "not timed",
    "no_flops": "0 FLOPs: no point on a log axis",
    "no_ceilings": "no roofline ceilings",
}


def not_plotted(name: str, why: str) -> str:
    """A kernel left off the plot, and why (a key of NOT_PLOTTED)."""
    return f"{name} ({NOT_PLOTTED[why]})"


def not_shown_note(skipped: list[str]) -> str:
    """The plot's footnote naming the kernels left off it."""
    return "not shown: " + "; ".join(skipped)[:300]
