"""The peak a measured kernel really ran at, and the ceiling a candidate can really reach.

The roofline of an item is the reference's (`measure.roofline`): its op-level rule prices fp32
matrix work with TF32 off at the FP32 CUDA-core rate, because that is what cuBLAS and cuDNN
run. A kernel for the same problem may run it on the tensor cores instead, as 3xTF32 (fp32
accuracy from three TF32 MMAs) or TF32, and then it beats that "roof": on the H200 a 3xTF32
Triton GEMM for KernelBench's 12_Gemm_Multiply_LeakyReLU ran at 145% of the FP32 CUDA-core
roofline, and the optimizer had been told "headroom at most 1.01x".

`price_measured` reads the kernel's rate from its measured time: a rate clearly above the
op-level peak (beyond `CEILING_MARGIN`, the slack a measured ceiling leaves) is impossible on
that unit, so the kernel is priced at the lowest of the roofline's `paths` (FP32 CUDA cores ->
3xTF32 -> TF32) its rate does not exceed, and the record says the peak was inferred. A rate above every path (or a byte rate above the DRAM ceiling) stays above
100% and is named as a measurement, FLOP-count or byte-count problem. `attainable_path` is the
fastest path that keeps the reference's accuracy: the headroom the Benchmarking Agent gives.

Only the displayed efficiency moves: the roofline part and its roofline time (what baselines
store and the cross-device verdict divides by) stay the op-level rule's, so the gate compares
what it compared before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_kernelpro.measure.ceilings import format_rate

# The roofline keys `price_measured` reads (what a child process is sent to price a kernel).
PRICING_KEYS = (
    "flops",
    "min_bytes",
    "peak_flops",
    "peak_name",
    "bandwidth_Bps",
    "compute_time_s",
    "memory_time_s",
    "roofline_time_s",
    "flops_source",
    "bytes_source",
    "paths",
)

# How far a measured rate may exceed a measured ceiling before that ceiling counts as
# exceeded. A ceiling is one library kernel's rate at one size, not the unit's limit: in the
# H200 KernelBench sweep cuBLAS fp32 references ran up to 3.4% above the measured FP32 ceiling
# (6_Matmul_with_large_K_dimension_, 52.6 vs 50.9 TFLOP/s) and streaming ones up to 0.14% above
# the measured DRAM bandwidth (bench/results/raw/h200-kernelbench-sweep-run*/sweep.jsonl);
# a 3xTF32 GEMM ran 45% above it. Within the margin the op-level unit holds (and the note
# says by how much the kernel beat its ceiling).
CEILING_MARGIN = 0.10

# Short unit names for table cells (the paths' full names are in their peak_name).
SHORT_UNIT = {"fp32": "FP32", "tf32x3_tensor": "3xTF32", "tf32_tensor": "TF32"}


def _fields(roofline: Any) -> Mapping[str, Any]:
    """A roofline as a mapping: a RooflinePart, a ReferenceAnalysis or its dict form."""
    if roofline is None:
        return {}
    if isinstance(roofline, Mapping):
        return roofline
    to_dict = getattr(roofline, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) and out > 0 else None


def _paths(r: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        p
        for p in r.get("paths") or ()
        if isinstance(p, Mapping)
        and _positive(p.get("compute_time_s"))
        and _positive(p.get("roofline_time_s"))
    ]


def attainable_path(roofline: Any) -> Mapping[str, Any] | None:
    """The fastest path of `roofline` that keeps the accuracy of its op-level pricing, when
    it is faster than that pricing (fp32 GEMM with TF32 off: 3xTF32 on the tensor cores when
    a third of the TF32 rate beats the FP32 CUDA cores); None otherwise."""
    paths = _paths(_fields(roofline))
    if len(paths) < 2:
        return None
    rule = paths[0]
    same = [p for p in paths[1:] if p.get("accuracy") == rule.get("accuracy")]
    best = min(same, key=lambda p: float(p["roofline_time_s"]), default=None)
    if best is None or float(best["roofline_time_s"]) >= float(rule["roofline_time_s"]):
        return None
    return best


@dataclass(frozen=True)
class MeasuredPeak:
    """What a kernel timed at `median_s` reaches, at the peak its rate says it ran at."""

    efficiency: float  # roofline time at the peak used / median
    roofline_time_s: float
    peak_name: str | None
    peak_flops: float | None
    measured_flops_per_s: float | None
    key: str | None = None  # the path's unit when the peak was inferred
    inferred: bool = False
    problem: str | None = None  # "flops" / "bytes" / "flops+bytes": above every ceiling
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def short(self) -> str | None:
        """A few words for a table cell: "3xTF32, inferred", "above every ceiling"."""
        if self.problem:
            return "above every ceiling"
        if self.inferred:
            return f"{SHORT_UNIT.get(str(self.key), str(self.key))}, inferred"
        return None


def price_measured(roofline: Any, median_s: float) -> MeasuredPeak | None:
    """The roofline share of a kernel timed at `median_s`, re-priced when it ran faster than
    the op-level peak allows (see the module doc); None without a roofline time."""
    r = _fields(roofline)
    rule_t = _positive(r.get("roofline_time_s"))
    median = _positive(median_s)
    if rule_t is None or median is None:
        return None
    flops = _positive(r.get("flops"))
    rate = flops / median if flops else None
    peak_name = r.get("peak_name")
    peak_flops = _positive(r.get("peak_flops"))
    if median >= rule_t:
        return MeasuredPeak(rule_t / median, rule_t, peak_name, peak_flops, rate)
    compute = _positive(r.get("compute_time_s")) or 0.0
    memory = _positive(r.get("memory_time_s")) or 0.0
    paths = _paths(r)
    chosen = None
    notes: list[str] = []
    problems: list[str] = []
    # A ceiling is exceeded only beyond the margin: below it the op-level unit still holds.
    allowed = median * (1.0 + CEILING_MARGIN)
    rule = (
        f"{paths[0].get('unit')} peak ({format_rate(float(paths[0]['peak_flops']), 'FLOP/s')})"
        if paths and _positive(paths[0].get("peak_flops"))
        else f"{peak_name or 'op-level'} peak"
    )
    if compute > allowed and rate is not None:
        chosen = next((p for p in paths[1:] if float(p["compute_time_s"]) <= allowed), None)
        if chosen is not None:
            notes.append(
                f"peak: {_unit_rate(chosen)}, inferred: {format_rate(rate, 'FLOP/s')} "
                f"measured exceeds the {rule}"
            )
        else:
            problems.append("flops")
            notes.append(
                f"{format_rate(rate, 'FLOP/s')} measured exceeds the {rule}"
                + (
                    f" and every faster path of this device (the fastest: {_unit_rate(paths[-1])})"
                    if len(paths) > 1
                    else ""
                )
                + ": a measurement or FLOP-count problem (FLOPs "
                f"{r.get('flops_source') or 'counted'}; give the marker flops= if the count is "
                "wrong)"
            )
    elif compute > median and rate is not None:
        notes.append(
            f"{format_rate(rate, 'FLOP/s')} measured, {compute / median - 1:.1%} above the "
            f"{rule}: within the {CEILING_MARGIN:.0%} a measured ceiling leaves (one library "
            "GEMM's rate, not the unit's limit), so priced at it"
        )
    bandwidth = _positive(r.get("bandwidth_Bps"))
    byte_rate = (_positive(r.get("min_bytes")) or 0.0) / median
    dram = f"DRAM ceiling {format_rate(bandwidth, 'B/s')}" if bandwidth else "DRAM ceiling"
    if memory > allowed:
        problems.append("bytes")
        notes.append(
            f"moved its minimal bytes at {format_rate(byte_rate, 'B/s')}, above the {dram}: its "
            "data stayed in cache between calls, or a byte-count problem (bytes "
            f"{r.get('bytes_source') or 'counted'}; give the marker bytes= if the count is wrong)"
        )
    elif memory > median:
        notes.append(
            f"moved its minimal bytes at {format_rate(byte_rate, 'B/s')}, "
            f"{memory / median - 1:.1%} above the {dram}: within the {CEILING_MARGIN:.0%} a "
            "measured ceiling leaves, so priced at it"
        )
    if chosen is not None:
        time_s = max(float(chosen["compute_time_s"]), memory)
        name, flops_rate = chosen.get("peak_name"), _positive(chosen.get("peak_flops"))
    else:
        time_s, name, flops_rate = rule_t, peak_name, peak_flops
    return MeasuredPeak(
        efficiency=time_s / median,
        roofline_time_s=time_s,
        peak_name=name,
        peak_flops=flops_rate,
        measured_flops_per_s=rate,
        key=str(chosen.get("key")) if chosen is not None else None,
        inferred=chosen is not None,
        problem="+".join(problems) or None,
        note="; ".join(notes) or None,
    )


def _unit_rate(path: Mapping[str, Any]) -> str:
    """ "3xTF32 tensor core (fp32 as three TF32 MMAs), 136 TFLOP/s" (effective, with the ops
    that stay on the CUDA cores)."""
    rate = _positive(path.get("peak_flops"))
    unit = path.get("unit") or path.get("key")
    return f"{unit}, {format_rate(rate, 'FLOP/s')}" if rate else str(unit)


def record_pricing(roofline: Any, median_s: float) -> tuple[float | None, dict[str, Any] | None]:
    """(efficiency, peak_used) as a kernel record keeps them (`KernelRecord.efficiency`,
    `KernelRecord.peak_used`): peak_used only when the op-level peak did not hold."""
    priced = price_measured(roofline, median_s)
    if priced is None:
        return None, None
    return priced.efficiency, (priced.to_dict() if priced.note else None)


def kernel_efficiency(roofline: Any, median_s: float | None) -> float | None:
    """The efficiency reports show for a kernel timed at `median_s` (`price_measured`)."""
    if median_s is None:
        return None
    priced = price_measured(roofline, median_s)
    return None if priced is None else priced.efficiency
