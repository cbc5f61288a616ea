"""The Benchmarking Agent: the reference's roofline, as prompt text for the Programmer.

A thin wrapper over `measure.roofline.analyze_reference` (which counts the reference's FLOPs
and bytes once, op by op, and places it on the device's ceilings). No model call: the
analysis is deterministic; `render_reference_analysis` turns it into the "Reference
analysis" section (op list, FLOPs, bytes, intensity vs ridge, bound, roofline time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.measure.ceilings import format_rate

if TYPE_CHECKING:
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.measure.roofline import ReferenceAnalysis

_BOUND_ADVICE = {
    "memory": "memory-bound: the roofline is set by bytes moved; fuse, read each input once, "
    "vectorize, and do not spend effort on tensor cores",
    "compute": "compute-bound: the roofline is set by FLOP/s; use the tensor-core "
    "instructions listed for this GPU and keep them fed",
    "mixed": "between the two ceilings: both data movement and arithmetic throughput matter",
}


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def render_reference_analysis(
    analysis: ReferenceAnalysis, *, max_ops: int = 8, measured_s: float | None = None
) -> str:
    """The "Reference analysis (roofline)" Markdown section for a prompt."""
    lines = [
        f"## Reference analysis (roofline on {analysis.device or 'this device'})",
        f"- Work: {format_rate(analysis.flops, 'FLOP')} ({analysis.flops_source}); minimal "
        f"traffic {format_rate(analysis.min_bytes, 'B')} ({analysis.bytes_source}), "
        f"unfused {format_rate(analysis.unfused_bytes, 'B')}.",
        f"- Arithmetic intensity {analysis.intensity:.3g} FLOP/B vs ridge "
        f"{analysis.ridge:.3g} FLOP/B at {analysis.peak_name} and "
        f"{format_rate(analysis.bandwidth_Bps, 'B/s')}: "
        f"{_BOUND_ADVICE.get(analysis.bound, analysis.bound)}.",
        f"- Roofline time {_seconds(analysis.roofline_time_s)} (compute "
        f"{_seconds(analysis.compute_time_s)}, memory {_seconds(analysis.memory_time_s)}); "
        f"dominant op category: {analysis.dominant_category}.",
    ]
    if measured_s:
        lines.append(
            f"- The reference takes {_seconds(measured_s)}: "
            f"{analysis.efficiency(measured_s):.1%} of the roofline."
        )
    if analysis.unfused_bytes > analysis.min_bytes * 1.5:
        lines.append(
            f"- Unfused, the ops move {analysis.unfused_bytes / max(analysis.min_bytes, 1):.1f}x "
            "the minimal bytes: fusion has room."
        )
    ops = sorted(analysis.ops, key=lambda op: op.flops + op.bytes_unfused, reverse=True)
    if ops:
        lines += [
            "",
            "| op | category | calls | FLOPs | bytes (unfused) | dtype |",
            "|---|---|---|---|---|---|",
        ]
        for op in ops[:max_ops]:
            lines.append(
                f"| `{op.op}` | {op.category} | {op.count} | {format_rate(op.flops, '')} | "
                f"{format_rate(op.bytes_unfused, 'B')} | {op.dtype} |"
            )
        if len(ops) > max_ops:
            lines.append(f"| ... {len(ops) - max_ops} more op(s) | | | | | |")
    lines += [f"- Note: {note}" for note in analysis.notes]
    return "\n".join(lines) + "\n"


class BenchmarkingAgent:
    """Runs the roofline analysis of a reference once and renders it for prompts."""

    def __init__(
        self,
        ceilings: Ceilings,
        *,
        spec: DeviceSpec | None = None,
        bound_band: tuple[float, float] = (0.5, 2.0),
    ) -> None:
        self.ceilings = ceilings
        self.spec = spec
        self.bound_band = bound_band

    def analyze(
        self,
        reference: Callable[..., Any],
        inputs: Sequence[Any],
        *,
        flops: float | None = None,
        bytes: float | None = None,
    ) -> ReferenceAnalysis:
        """`analyze_reference` on this agent's ceilings (KernelproError if the reference fails)."""
        from pytest_kernelpro.measure.roofline import analyze_reference

        return analyze_reference(
            reference,
            inputs,
            ceilings=self.ceilings,
            flops=flops,
            bytes=bytes,
            bound_band=self.bound_band,
            spec=self.spec,
        )

    def prompt_text(
        self,
        reference: Callable[..., Any],
        inputs: Sequence[Any],
        *,
        measured_s: float | None = None,
        **overrides: float | None,
    ) -> str:
        """Analyze and render in one step."""
        analysis = self.analyze(reference, inputs, **overrides)
        return render_reference_analysis(analysis, measured_s=measured_s)


def render_reference_summary(
    roofline: Mapping[str, Any],
    *,
    reference_s: float | None = None,
    current_s: float | None = None,
    validation: Mapping[str, Any] | None = None,
) -> str:
    """The ReferenceAnalysis section of every prompt, from a record's roofline dict: the bound,
    the peak that sets it, the % of the roofline the reference and the current kernel reach,
    the headroom left, and the ncu validation of the class (Stage 1 on the reference)."""
    bound = str(roofline.get("bound") or "unknown")
    t = roofline.get("roofline_time_s")
    lines = [
        f"## Reference analysis (Benchmarking Agent, {roofline.get('device') or 'this device'})"
    ]
    lines.append(
        f"- Bound: **{bound}** ({_BOUND_ADVICE.get(bound, bound)}); arithmetic intensity "
        f"{float(roofline.get('intensity') or 0):.3g} FLOP/B vs ridge "
        f"{float(roofline.get('ridge') or 0):.3g} FLOP/B."
    )
    peak = roofline.get("peak_name")
    if peak:
        lines.append(
            f"- Peak that sets the roofline: {peak} "
            f"({format_rate(float(roofline.get('peak_flops') or 0), 'FLOP/s')}) and "
            f"{format_rate(float(roofline.get('bandwidth_Bps') or 0), 'B/s')} DRAM; work "
            f"{format_rate(float(roofline.get('flops') or 0), 'FLOP')}, minimal traffic "
            f"{format_rate(float(roofline.get('min_bytes') or 0), 'B')}."
        )
    if t:
        parts = [f"- Roofline time {_seconds(float(t))}"]
        if reference_s:
            parts.append(
                f"the reference takes {_seconds(reference_s)} ({float(t) / reference_s:.1%} of roofline)"
            )
        if current_s:
            parts.append(
                f"the current kernel {_seconds(current_s)} ({float(t) / current_s:.1%} of "
                f"roofline): headroom at most {current_s / float(t):.3g}x"
            )
        lines.append("; ".join(parts) + ".")
    if validation:
        lines.append(
            f"- ncu validation of the class on the reference: measured "
            f"{validation.get('measured') or 'n/a'} (SM {_pct(validation.get('sm_pct'))}, "
            f"memory {_pct(validation.get('memory_pct'))} of peak) vs theoretical "
            f"{validation.get('theoretical') or 'n/a'}: Stage 1 says "
            f"{validation.get('cls') or 'unknown'} (confidence {validation.get('confidence')})."
        )
    return "\n".join(lines) + "\n"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.0f}%"
