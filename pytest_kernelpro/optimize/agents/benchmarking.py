"""The Benchmarking Agent: the reference's roofline, as prompt text for the Programmer.

A thin wrapper over `measure.roofline.analyze_reference` (which counts the reference's FLOPs
and bytes once, op by op, and places it on the device's ceilings). No model call: the
analysis is deterministic; `render_reference_analysis` turns it into the "Reference
analysis" section (op list, FLOPs, bytes, intensity vs ridge, bound, roofline time). The
section made from a kernel's record (`gate.prompt_reference.reference_summary`) is the record's text,
rendered with the rest of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.measure.ceilings import format_rate
from pytest_kernelpro.optimize.agents.prompt_reference import BOUND_ADVICE as _BOUND_ADVICE
from pytest_kernelpro.optimize.agents.prompt_reference import attainable_path
from pytest_kernelpro.optimize.agents.prompt_reference import seconds_text as _seconds

if TYPE_CHECKING:
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.measure.roofline import ReferenceAnalysis


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
    faster = attainable_path(analysis)
    if faster is not None:
        rate = format_rate(float(faster["peak_flops"]), "FLOP/s")
        lines.append(
            f"- At {faster['accuracy']} accuracy the work can run faster, at the "
            f"{faster['unit']} peak ({rate}): roofline time "
            f"{_seconds(float(faster['roofline_time_s']))}."
        )
    if measured_s:
        line = (
            f"- The reference takes {_seconds(measured_s)}: "
            f"{analysis.efficiency(measured_s):.1%} of the roofline"
        )
        if faster is not None:
            line += f", {float(faster['roofline_time_s']) / measured_s:.1%} of the faster one"
        lines.append(line + ".")
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
