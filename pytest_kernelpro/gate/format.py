"""The text shown for a kernel item and in the tables: formatting helpers shared by the
terminal table and the PR comment, one record's row, the item's "kernelpro" report section and
the note a session's condition is said in. Pure functions over records."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.measure.roofline import SHORT_UNIT, problem_words
from pytest_kernelpro.record import CorrectnessPart, KernelRecord, StatsPart

_EIGHTHS = " ▏▎▍▌▋▊▉"

# status -> (emoji for Markdown, word for terminals, rich style), in the order comments and
# tables list kernels: what needs attention first.
STATUS_STYLE: dict[str, tuple[str, str, str]] = {
    "failed": ("❌", "FAILED", "bold red"),
    "error": ("❌", "ERROR", "bold red"),
    "regressed": ("🔴", "REGRESSED", "bold red"),
    "below-roofline": ("🟥", "BELOW ROOFLINE", "bold red"),
    "suspect": ("🟡", "suspect", "yellow"),
    "unresolved": ("🟠", "unresolved", "yellow"),
    "incomparable": ("⚫", "incomparable", "magenta"),
    "improved": ("🟢", "improved", "green"),
    "new": ("🆕", "new", "cyan"),
    "ok": ("⚪", "ok", ""),
    "passed": ("✅", "passed", "green"),
    "unmeasured": ("➖", "not timed", "dim"),
    "skipped": ("⏭️", "skipped", "dim"),
}
STATUS_ORDER = {status: i for i, status in enumerate(STATUS_STYLE)}


def format_time(seconds: float | None) -> str:
    """Seconds with the unit that reads best, 3 significant digits, trailing zeros kept:
    '812 ns', '52.1 µs', '50.0 µs', '3.20 ms', '1.05 s'."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    mag = abs(seconds)
    unit, scale = "ns", 1e-9
    for name, factor in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if mag >= factor:
            unit, scale = name, factor
            break
    value = seconds / scale
    if round(abs(value), 1) >= 1000 and unit != "s":  # 999.96 µs rounds up: next unit
        return format_time(round(seconds / scale, 0) * scale * (1 + 1e-12))
    decimals = 0 if abs(value) >= 99.95 else 1 if abs(value) >= 9.995 else 2
    return f"{value:.{decimals}f} {unit}"


def format_change(change: float | None) -> str:
    """'+7.2%' / '−3.0%' (a real minus sign, so columns line up in proportional fonts)."""
    if change is None or not math.isfinite(change):
        return "–"
    text = f"{change * 100:+.1f}%"
    return text.replace("-", "−")


def bar(fraction: float | None, width: int = 8) -> str:
    """A unicode bar of `width` cells for a fraction 0..1 (clipped), in eighths of a cell."""
    if fraction is None or not math.isfinite(fraction):
        return " " * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[rest] if rest else "")
    return text + " " * (width - len(text))


def short_device(name: str | None) -> str:
    """'NVIDIA H200' -> 'H200', 'NVIDIA GeForce RTX 4090' -> 'RTX 4090',
    'cpu (AMD EPYC)' -> 'AMD EPYC'; anything else stays."""
    if not name:
        return "–"
    for prefix in ("NVIDIA GeForce ", "NVIDIA "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    if name.startswith("cpu (") and name.endswith(")"):  # "cpu (AMD EPYC)" -> "AMD EPYC"
        return name[5:-1] or "cpu"
    return name


def record_status(record: KernelRecord) -> str:
    """The status that describes a record: its gate verdict, else its pytest outcome."""
    if record.outcome in ("failed", "error") and not (record.gate and record.gate.failed):
        # failed for another reason (wrong result, crash): that is the news
        return record.outcome
    if record.gate and record.gate.status:
        return str(record.gate.status)
    return record.outcome or "pending"


def stat(record: KernelRecord, key: str) -> float | None:
    """A float from the timing's statistics, e.g. "median_s" (None when absent)."""
    stats = record.timing.stats if record.timing else None
    return finite_float(getattr(stats, key) if stats is not None else None)


def cross_device(record: KernelRecord) -> bool:
    """The verdict compared efficiency with a baseline from another device."""
    return bool(record.gate) and str(record.gate.basis or "").startswith("efficiency")


def roofline_value(record: KernelRecord, key: str) -> Any:
    """A field of the roofline, e.g. "roofline_time_s" (None when absent)."""
    return getattr(record.roofline, key) if record.roofline is not None else None


def finite_float(value: Any) -> float | None:
    """`value` as a finite float, None for None, non-numbers, NaN and infinities (records and
    baseline files are read from disk: anything may be there)."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def sort_key(record: KernelRecord) -> tuple[int, float, str]:
    """Attention first, then the largest slowdown, then by name."""
    status = record_status(record)
    change = finite_float(record.gate.change if record.gate else None) or 0.0
    return (STATUS_ORDER.get(status, len(STATUS_ORDER)), -change, record.name)


def peak_used_words(record: KernelRecord) -> str | None:
    """ "3xTF32, inferred", "fewer FLOPs than the reference", ...: why the kernel beat its
    op-level peak (`measure.roofline.price_measured`), in our own words only."""
    used = record.peak_used
    if not isinstance(used, Mapping) or not used.get("note"):
        return None
    if used.get("problem"):
        return problem_words(used.get("problem")) or "above every ceiling"
    unit = SHORT_UNIT.get(str(used.get("key")))
    return f"{unit}, inferred" if unit and used.get("inferred") else None


# The number shown is the number gated: where a verdict compared another time than the wall
# median (on-CPU, anchor-scaled, a fresh process's), the tables show that time
# and its baseline side by side, labelled, and the wall time second.
WALL = "wall"


def gated_times(record: KernelRecord) -> tuple[str, float, float] | None:
    """(label, baseline, now) of the time the verdict compared (else the wall medians), or None."""
    gate = record.gate
    if gate is None:
        return None
    label = gate.gated_label
    now, base = finite_float(gate.gated_now_s), finite_float(gate.gated_baseline_s)
    if label and now is not None and base is not None:
        return str(label), base, now
    wall_now, wall_base = stat(record, "median_s"), finite_float(gate.baseline_median_s)
    if wall_now is None or wall_base is None:
        return None
    return WALL, wall_base, wall_now


def gated_elsewhere(record: KernelRecord) -> bool:
    """True when the verdict compared another time than the wall median."""
    times = gated_times(record)
    return times is not None and times[0] != WALL


def gated_cell(record: KernelRecord) -> str:
    """ "on-CPU 2.05 ms → 1.95 ms": the compared time, baseline first; "–" without one."""
    times = gated_times(record)
    if times is None:
        return "–"
    label, base, now = times
    return f"{label} {format_time(base)} → {format_time(now)}"


def terminal_row(
    record: KernelRecord,
    *,
    show_device: bool,
    narrow: bool,
    bar_width: int,
    color: bool,
    show_gated: bool = False,
) -> list[Any]:
    """One row of the terminal summary table (`gate.render_session.render_terminal_table`)."""
    from rich.text import Text

    text, style = _verdict_cell(record)
    # Text, not str: a name like "k[/bold]" is a kernel's name, not rich markup.
    row: list[Any] = [Text(record.name)]
    if show_device:
        row.append(Text(short_device(record.device)))
    if show_gated:
        row.append(gated_cell(record))
    row.append(_median_cell(record))
    if not narrow:
        row.append(format_time(roofline_value(record, "roofline_time_s")))
    row += [
        _bar_cell(record, bar_width),
        _bound_cell(record),
        Text(text, style=style if color else ""),
    ]
    return row


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
    if status == "unresolved" and record.gate is not None:
        # Its tolerance, not its change: the change says nothing inside so wide a tolerance.
        return f"{word} ±{record.gate.tolerance:.0%}", style
    if change is not None and status not in ("new", "unmeasured"):
        text = f"{word} {format_change(change)}"
        if cross_device(record):
            text += "*"
    return text, style


# The "kernelpro" section of a kernel item's pytest report: one record as plain text (pytest
# shows it with the item's report; `plugin.pytest_runtest_makereport` adds it).


def _number(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


def _rule_text(c: CorrectnessPart) -> str:
    """Which rule decided, both errors against the truth, and the truth's cost."""
    text = str(c.rule)
    truth = c.truth or {}
    if c.kernel_error is not None:
        text += (
            f"; normwise error against the {truth.get('precision')} truth: kernel "
            f"{_number(c.kernel_error)}, reference {_number(c.reference_error)}"
        )
    if truth.get("seconds") is not None:
        cost = f"{truth['seconds'] * 1e3:.1f} ms"
        if truth.get("peak_bytes") is not None:  # a GPU truth's (measure.gpu_memory)
            from pytest_kernelpro.measure.gpu_memory import format_bytes

            bound = "" if truth.get("peak_exact", True) else "at most "
            cost += f", {bound}{format_bytes(truth['peak_bytes'])} peak"
        text += f"; truth re-run {cost}"
    return text


def autotune_line(choice: Mapping[str, Any]) -> str:
    """'autotune: _layer_norm_fwd (key 4096, torch.float16): num_warps=8, ... (tuned)'."""
    kernel = str(choice.get("kernel", "?")).rsplit(".", 1)[-1]
    key = choice.get("key")
    at = "" if not isinstance(key, list) else f" (key {', '.join(str(v) for v in key)})"
    config = ", ".join(f"{k}={v}" for k, v in (choice.get("config") or {}).items())
    return f"autotune: {kernel}{at}: {config} ({choice.get('source', '?')})"


def item_section(record: KernelRecord) -> str:
    """The per-item "kernelpro" report section (pytest's report sections), plain text."""
    lines = [f"{record.name} on {record.device or record.device_kind} ({record.language})"]
    c = record.correctness
    if c and not c.passed and c.worst_index is None and not c.max_abs_err:
        # It failed before any output value was compared (it raised, or an output had the
        # wrong shape or dtype): errors of 0 would read as a match.
        reason = (c.failure or c.exception or "no output was compared").strip().splitlines()[0]
        lines.append(
            f"correctness: FAILED on trial {c.trials_run} of {c.trials} before any value was "
            f"compared: {reason[:300]}"
        )
    elif c:
        tol = c.tolerance
        tolerance = (
            f"rtol {_number(tol.rtol) if tol else None}, atol {_number(tol.atol) if tol else None}, "
            f"{tol.source if tol else None}"
        )
        trials = f"{c.trials_run} trial{'' if c.trials_run == 1 else 's'}"
        if not c.passed and _non_finite(c.worst_ratio):
            # A NaN or an infinity where a number was expected: the errors are computed over
            # the elements that are numbers on both sides, and their 0 would read as a match.
            reason = (c.failure or "a NaN or infinite output").strip().splitlines()[0]
            lines.append(f"correctness: FAILED over {trials} ({tolerance}): {reason[:500]}")
        else:
            lines.append(
                f"correctness: {'passed' if c.passed else 'FAILED'} over {trials}; max abs "
                f"err {c.max_abs_err or 0:.3g}, max rel err {c.max_rel_err or 0:.3g} "
                f"({tolerance})"
            )
    if c and c.rule:
        lines.append(f"correctness rule: {_rule_text(c)}")
    if c and c.kernelbench:
        kb = c.kernelbench
        lines.append(
            f"KernelBench's own check (allclose, atol={kb.get('atol')}, rtol={kb.get('rtol')}): "
            f"{'passed' if kb.get('passed') else 'FAILED'}, max abs err "
            f"{_number(kb.get('max_abs_err'))}"
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
    for choice in record.autotune.choices if record.autotune else ():
        lines.append(autotune_line(choice))
    if record.gate:
        lines.append(f"gate: {record.gate.status}: {record.gate.message}")
    profile_text = record.extra.get("profile_text")
    if profile_text:
        lines.append(profile_text)
    if record.guidance:
        lines.append(record.guidance)
    for section in record.sections:
        lines.extend(section.item_lines)
    return "\n".join(lines)


def _non_finite(value: float | str | None) -> bool:
    """A record's error field that is an infinity or NaN (a float, or "inf"/"nan" from JSON)."""
    try:
        return value is not None and not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# -- a session's condition as a note (render_session.py, condition_notes.py, baseline_save.py) --


def kernel_names(records: Sequence[KernelRecord], limit: int = 5) -> str:
    """The first `limit` kernels' names, and how many more."""
    names = [r.name for r in records[:limit]]
    return ", ".join(names) + (f" and {len(records) - limit} more" if len(records) > limit else "")


# A note's terminal line, after the "kernelpro: " it is printed with, stays under 100
# characters: one line per condition in an 80-100 column terminal or a CI log.
NOTE_WIDTH = 88


@dataclass(frozen=True)
class Note:
    """One condition of the session. `short`: its terminal line (under NOTE_WIDTH
    characters, naming the setting or step that changes it); `full`: the whole text, shown
    under -v and kept in the JSON report and the PR comment's details; `normal`: the
    machine's normal state (said only in the full text)."""

    short: str
    full: str
    normal: bool = False


def fit(text: str, width: int = NOTE_WIDTH) -> str:
    """`text` cut to `width` characters at a word, with an ellipsis when cut."""
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + "…"


def names_line(head: str, records: Sequence[KernelRecord], tail: str) -> str:
    """`head (names)tail` within NOTE_WIDTH: the names give way first (`tail` names the
    setting, so it is never cut)."""
    for limit in (3, 2, 1):
        text = f"{head} ({kernel_names(records, limit)}){tail}"
        if len(text) <= NOTE_WIDTH:
            return text
    return fit(f"{head}{tail}")


def plain_note(text: str) -> Note:
    """A note another part of the session gave as one string: cut to one line that says -v
    has the rest, keeping a closing "(what to do)" of up to 45 characters, which is where
    these notes name their fix ("(`kernelpro calibrate` on a quiet machine)")."""
    if len(text) <= NOTE_WIDTH:
        return Note(text, text)
    fix = re.search(r" \(([^()]{1,43})\)$", text)
    tail = fix.group(0) if fix else " (-v)"
    return Note(fit(text[: fix.start()] if fix else text, NOTE_WIDTH - len(tail)) + tail, text)
