"""The per-item "kernelpro" report section, as plain text."""

from __future__ import annotations

from ..gate.format import format_time
from ..results import KernelRecord


def render_item_section(record: KernelRecord) -> str:
    lines = [f"{record.name} on {record.device or record.device_kind} ({record.language})"]
    if record.correctness:
        c = record.correctness
        tol = c.get("tolerance") or {}
        lines.append(
            f"correctness: {'passed' if c.get('passed') else 'FAILED'} over {c.get('trials_run')} "
            f"trials; max abs err {c.get('max_abs_err', 0):.3g}, max rel err "
            f"{c.get('max_rel_err', 0):.3g} (rtol {tol.get('rtol')}, atol {tol.get('atol')}, "
            f"{tol.get('source')})"
        )
    if record.timing:
        t = record.timing
        s = t.get("stats", {})
        lines.append(
            f"timing: median {format_time(s.get('median_s'))}, IQR "
            f"{format_time(s.get('iqr_s'))}, 95% CI [{format_time(s.get('ci_low_s'))}, "
            f"{format_time(s.get('ci_high_s'))}], n={s.get('n')}, {t.get('method')}, "
            f"stop: {t.get('stop_reason')}, throttled samples: {t.get('throttled_samples')}"
        )
    if record.roofline:
        r = record.roofline
        eff = f"{record.efficiency:.1%}" if record.efficiency is not None else "-"
        lines.append(
            f"roofline: {r.get('flops', 0):.4g} FLOP, {r.get('min_bytes', 0):.4g} B minimal "
            f"({r.get('unfused_bytes', 0):.4g} B unfused), intensity {r.get('intensity', 0):.3g} "
            f"FLOP/B vs ridge {r.get('ridge', 0):.3g} -> {r.get('bound')}-bound; peak "
            f"{r.get('peak_name')}; roofline time {format_time(r.get('roofline_time_s'))}; "
            f"reaches {eff}"
        )
    if record.gate:
        lines.append(f"gate: {record.gate.get('status')}: {record.gate.get('message')}")
    profile_text = record.extra.get("profile_text")
    if profile_text:
        lines.append(profile_text)
    if record.guidance:
        lines.append(record.guidance)
    optimize_text = record.extra.get("optimize_text")
    if optimize_text:
        lines.append(optimize_text)
    return "\n".join(lines)
