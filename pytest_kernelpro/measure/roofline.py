"""Roofline analysis of a kernel's reference, and a measured kernel priced on it: the peak the
kernel really ran at, and a time faster than the roofline allows failed as impossible.

The reference runs once under a TorchDispatchMode that sees every aten op: per op its
category, FLOPs (`flops`), unfused bytes and peak; per graph the minimal bytes (inputs read
once, outputs written once), the intensity against the ridge, the bound and the roofline time
max(FLOPs / P, bytes / BW). Work the dispatcher never sees counts nothing; the marker's
`flops=`/`bytes=` or the op-cost hook fill it in; ops without a formula are `unpriced_ops`.

fp32 matrix work may beat its FP32 CUDA-core roof on the tensor cores (3xTF32 keeps fp32
accuracy; bench/results/ has one at 145% of it): `matrix_paths.py` prices each rate, and
`price_measured` prices a kernel clearly above the op-level peak (beyond `CEILING_MARGIN`) at
the lowest path its rate does not exceed. A FLOP rate above every path is reported, not failed
(an algebraic rewrite does less arithmetic). Only the displayed efficiency moves; baselines
and the verdict keep the op-level roofline time.

Only physics makes a time impossible (`impossible_failure`): a kernel must move its call's
inputs and outputs once (`compulsory_bytes`: not the module's weights; of a gathered input,
the rows selected; the marker's `bytes=`). Moving them faster than a trusted bandwidth ceiling
(`Ceilings.trusted`) by more than `impossible_margin`, with inputs read from memory, fails the
item.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import msgspec

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.ceilings import (
    Ceilings,
    format_rate,
    peak_name,
    peak_origin,
    resolve_peak,
)
from pytest_kernelpro.measure.flops import (
    CATEGORIES,
    OpCost,
    OpCostHook,
    aggregate,
    iter_tensors,
    make_recorder,
    price_upcasts_at_io_dtype,
    select_peak_key,
    storage_key,
    tensor_bytes,
    tf32_flags,
    view_key,
)

if TYPE_CHECKING:
    from pytest_kernelpro.measure.devices import DeviceSpec


def classify_bound(intensity: float, ridge: float, band: tuple[float, float] = (0.5, 2.0)) -> str:
    """ "memory" if intensity/ridge < band[0], "compute" if > band[1], else "mixed"."""
    low, high = band
    if not 0 < low <= high:
        raise KernelproError(f"bound band {band!r} must satisfy 0 < low <= high, e.g. (0.5, 2.0)")
    ratio = intensity / ridge
    return "memory" if ratio < low else "compute" if ratio > high else "mixed"


@dataclass(frozen=True)
class ReferenceAnalysis:
    """FLOPs, bytes, bound and roofline time of one reference on one device's ceilings."""

    ops: tuple[OpCost, ...]
    flops: float
    min_bytes: float
    unfused_bytes: float
    intensity: float
    ridge: float
    bound: str
    dominant_category: str
    peak_flops: float
    peak_name: str
    bandwidth_Bps: float
    compute_time_s: float
    memory_time_s: float
    roofline_time_s: float
    flops_source: str
    bytes_source: str
    notes: tuple[str, ...] = ()
    device: str = ""
    bound_band: tuple[float, float] = (0.5, 2.0)
    peak_mix: Mapping[str, float] = field(default_factory=dict)  # key -> share of FLOPs
    paths: tuple[Mapping[str, Any], ...] = ()  # `matrix_paths`: the first is the op-level's
    compulsory_bytes: float = 0.0  # the floor of `impossible_failure`
    unpriced_ops: tuple[str, ...] = ()

    def efficiency(self, measured_s: float) -> float:
        """Fraction of the roofline reached: roofline time / measured time (1.0 = at the roof)."""
        if _positive(measured_s) is None:
            raise KernelproError(
                f"measured time {measured_s!r} s must be a positive finite number to compare "
                "with the roofline"
            )
        return self.roofline_time_s / measured_s

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; infinities (nothing to divide by) become None."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = None if isinstance(value, float) and not math.isfinite(value) else value
        return {
            **out,
            "ops": [asdict(op) for op in self.ops],
            "unpriced_ops": list(self.unpriced_ops),
            "notes": list(self.notes),
            "bound_band": list(self.bound_band),
            "peak_mix": dict(self.peak_mix),
            "paths": [dict(p) for p in self.paths],
        }


def needed_bytes(
    tensors: Sequence[Any], gathered: Mapping[Any, float], read_whole: set[Any]
) -> float:
    """`graph_bytes` of tensors the reference reads, a tensor it only gathers from counting
    at most the bytes its gathers need (the selected rows of a table, not the table)."""
    whole: list[Any] = []
    partial: dict[Any, list[Any]] = {}
    for t in tensors:
        key = storage_key(t)
        if key in gathered and key not in read_whole:
            partial.setdefault(key, []).append(t)
        else:
            whole.append(t)
    return graph_bytes(whole) + sum(
        min(graph_bytes(group), gathered[key]) for key, group in partial.items()
    )


def graph_bytes(tensors: Sequence[Any]) -> float:
    """Bytes of a set of tensors, each storage once: several views of one storage count the
    union of the element ranges they span."""
    by_storage: dict[Any, dict[Any, Any]] = {}
    for t in tensors:
        if t.numel() > 0:
            by_storage.setdefault(storage_key(t), {})[view_key(t)] = t
    total = 0
    for views in by_storage.values():
        group = list(views.values())
        if len(group) == 1:
            total += tensor_bytes(group[0])
            continue
        spans = []
        for t in group:
            start = t.storage_offset() * t.element_size()
            length = (
                1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True))
            ) * t.element_size()
            spans.append((start, start + length))
        spans.sort()
        covered, end = 0, -1
        for lo, hi in spans:
            if hi > end:
                covered += hi - max(lo, end)
                end = hi
        total += covered
    return float(total)


def analyze_reference(
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    ceilings: Ceilings,
    flops: float | None = None,
    bytes: float | None = None,
    op_cost_hook: OpCostHook | None = None,
    bound_band: tuple[float, float] = (0.5, 2.0),
    spec: DeviceSpec | None = None,
) -> ReferenceAnalysis:
    """Count the reference's FLOPs and bytes once and place it on the ceilings' roofline;
    the marker's `flops`/`bytes` replace the counts, `op_cost_hook`'s answers the formulas."""
    for name, value in (("flops", flops), ("bytes", bytes)):
        if value is not None and not (
            isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
        ):
            raise KernelproError(f"marker {name}={value!r} must be a finite number >= 0")
    allow_tf32, allow_cudnn_tf32 = tf32_flags()
    recorder, output = _recorded_call(
        reference, inputs, make_recorder(op_cost_hook, allow_tf32, allow_cudnn_tf32, spec)
    )
    notes = list(dict.fromkeys(recorder.notes))
    ops = aggregate(recorder.costs)
    if not ops:
        notes.append(
            "no aten op recorded (a kernel launched outside torch ops?); give flops=/bytes="
        )
    unknown = sorted({op.category for op in ops} - set(CATEGORIES))
    if unknown:
        notes.append(f"op-cost hook used categories outside {CATEGORIES}: {unknown}")
    read, counted_min_bytes, counted_compulsory = _counted_bytes(
        reference, inputs, output, recorder
    )
    unpriced = tuple(dict.fromkeys(recorder.unpriced))
    if unpriced and flops is None:
        notes.append(
            f"unpriced: {', '.join(unpriced)} (no FLOP formula): the FLOP count leaves their "
            "work out; give the marker flops= or answer the pytest_kernelpro_op_cost hook"
        )
    unfused = float(sum(op.bytes_unfused for op in ops))

    device_type = next((str(t.device.type) for t in read), ceilings.device_type)
    ops = price_upcasts_at_io_dtype(
        ops, inputs, output, device_type, allow_tf32, allow_cudnn_tf32, spec, notes
    )
    peak, per_key, op_rate, peak_name = _priced_peak(
        ops, read, ceilings, device_type, (allow_tf32, allow_cudnn_tf32), spec, notes,
        marker_flops=flops,
    )  # fmt: skip
    counted_flops = float(sum(per_key.values()))
    total_flops = float(flops) if flops is not None else counted_flops
    min_bytes = float(bytes) if bytes is not None else counted_min_bytes
    flops_source = "marker" if flops is not None else ("hook" if recorder.hooked else "counted")
    bytes_source = "marker" if bytes is not None else "counted"
    bandwidth = ceilings.bandwidth_Bps
    ridge = peak / bandwidth
    intensity = total_flops / min_bytes if min_bytes > 0 else (math.inf if total_flops > 0 else 0.0)
    compute_time = total_flops / peak
    memory_time = min_bytes / bandwidth
    mix = {k: (v / counted_flops if counted_flops else 0.0) for k, v in per_key.items()}
    paths: tuple[dict[str, Any], ...] = ()
    if device_type == "cuda":
        from pytest_kernelpro.measure.matrix_paths import matrix_paths

        paths = matrix_paths(ops, ceilings, total_flops, memory_time, device_type)
    return ReferenceAnalysis(
        ops=ops,
        flops=total_flops,
        min_bytes=min_bytes,
        unfused_bytes=unfused,
        intensity=intensity,
        ridge=ridge,
        bound=classify_bound(intensity, ridge, bound_band),
        dominant_category=_dominant(ops, op_rate, bandwidth),
        peak_flops=peak,
        peak_name=peak_name,
        bandwidth_Bps=bandwidth,
        compute_time_s=compute_time,
        memory_time_s=memory_time,
        roofline_time_s=max(compute_time, memory_time),
        flops_source=flops_source,
        bytes_source=bytes_source,
        notes=tuple(dict.fromkeys(notes)),
        device=ceilings.device,
        bound_band=tuple(bound_band),  # type: ignore[arg-type]
        peak_mix=mix,
        paths=paths,
        compulsory_bytes=float(bytes) if bytes is not None else counted_compulsory,
        unpriced_ops=() if flops is not None else unpriced,
    )


def _recorded_call(
    reference: Callable[..., Any], inputs: Sequence[Any], recorder: Any
) -> tuple[Any, Any]:
    """One call of the reference under the op recorder: (the recorder, the output). A failing
    op-cost hook or reference is a `KernelproError` naming which and what to fix."""
    import torch

    try:
        with torch.no_grad(), recorder:
            output = reference(*inputs)
    except Exception as exc:
        if recorder.hook_error is not None:
            raise KernelproError(
                f"op-cost hook failed: {recorder.hook_error!r}"
            ) from recorder.hook_error
        raise KernelproError(
            f"reference raised {type(exc).__name__}: {exc} while its FLOPs and bytes were "
            "counted; fix the reference or its inputs"
        ) from exc
    if recorder.hook_error is not None:
        raise KernelproError(
            f"op-cost hook failed: {recorder.hook_error!r}; fix the pytest_kernelpro_op_cost "
            "implementation"
        ) from recorder.hook_error
    return recorder, output


def _counted_bytes(
    reference: Callable[..., Any], inputs: Sequence[Any], output: Any, recorder: Any
) -> tuple[list[Any], float, float]:
    """(the tensors the reference read, its minimum bytes, the call's compulsory bytes).
    Minimum: the graph's inputs (with a module's parameters and buffers, and any other tensor
    an op read that no op produced) once, outputs once. Compulsory: the call's own inputs and
    outputs, what a kernel must move whatever it folds."""
    import torch

    call_inputs = iter_tensors(list(inputs))
    read = [*call_inputs]
    # A module, or the module of a bound method such as model.forward.
    module = (
        reference
        if isinstance(reference, torch.nn.Module)
        else getattr(reference, "__self__", None)
    )
    if isinstance(module, torch.nn.Module):
        read += [*module.parameters(), *module.buffers()]
    read += list(recorder.external.values())
    output_bytes = graph_bytes(iter_tensors(output))
    min_bytes = needed_bytes(read, recorder.gathered, recorder.read_whole) + output_bytes
    compulsory = needed_bytes(call_inputs, recorder.gathered, recorder.read_whole) + output_bytes
    return read, min_bytes, compulsory


def _priced_peak(
    ops: Sequence[OpCost],
    read: Sequence[Any],
    ceilings: Ceilings,
    device_type: str,
    tf32: tuple[bool, bool],
    spec: DeviceSpec | None,
    notes: list[str],
    *,
    marker_flops: float | None,
) -> tuple[float, dict[str, float], dict[str, float], str]:
    """The reference's peak: the FLOP-weighted harmonic mean of the rates of the units its
    ops run on; with no op carrying FLOPs, the elementwise rate of its first floating input's
    dtype. (peak, FLOPs per ceiling key used, each op's key -> its rate, the peak's name);
    where a rate came from is appended to `notes`."""
    per_key: dict[str, float] = {}
    rates: dict[str, tuple[float, str]] = {}
    op_rate: dict[str, float] = {}  # the op's own key -> the rate it is priced at
    compute_time_counted = 0.0
    for op in ops:
        if op.flops <= 0:
            continue
        used, rate, note = resolve_peak(ceilings, op.peak_key)
        if note:
            notes.append(note)
        op_rate[op.peak_key] = rate
        rates[used] = (rate, peak_origin(ceilings, used))
        per_key[used] = per_key.get(used, 0.0) + op.flops
        compute_time_counted += op.flops / rate
    counted_flops = float(sum(per_key.values()))
    if counted_flops > 0:
        peak = counted_flops / compute_time_counted
    else:
        dtype = next(
            (str(t.dtype).removeprefix("torch.") for t in read if t.dtype.is_floating_point),
            "float32",
        )
        key = select_peak_key("elementwise", dtype, device_type, *tf32, spec)
        used, peak, note = resolve_peak(ceilings, key)
        if note:
            notes.append(note)
        rates[used] = (peak, peak_origin(ceilings, used))
        per_key[used] = 0.0
        if marker_flops:
            notes.append(f"no counted op carries FLOPs: the marker's flops priced at {used!r}")
    return peak, per_key, op_rate, peak_name(per_key, rates, peak, device_type)


def _dominant(ops: Sequence[OpCost], op_rate: Mapping[str, float], bandwidth: float) -> str:
    """The category with the largest estimated time, max(FLOPs/P, unfused bytes/BW) per op."""
    if not ops:
        return "other"
    per_category: dict[str, float] = {}
    for op in ops:
        rate = op_rate.get(op.peak_key, 0.0)
        compute = op.flops / rate if rate > 0 else 0.0
        estimate = max(compute, op.bytes_unfused / bandwidth)
        per_category[op.category] = per_category.get(op.category, 0.0) + estimate
    return max(per_category, key=lambda c: per_category[c])


# How far a measured rate may exceed a measured ceiling (one library kernel's rate, not the
# unit's limit) before it counts as exceeded (bench/results/2026-12-01-peak-paths-h200.md).
CEILING_MARGIN = 0.10

# How far CPU compulsory bytes may beat the one-thread `copy_` probe before the time is
# impossible: honest flushed kernels reach 1.4x it, cached ones 3-4x
# (bench/results/2026-12-05-cpu-bandwidth-bound-cpu.md).
CPU_BANDWIDTH_MARGIN = 1.0

# What a FLOP rate above every compute ceiling says (reported, never failed).
FEWER_FLOPS = "does less arithmetic than the reference (an algebraic rewrite, or pass flops=)"

# Short unit names for table cells (the paths' full names are in their peak_name).
SHORT_UNIT = {"fp32": "FP32", "tf32x3_tensor": "3xTF32", "tf32_tensor": "TF32"}


def roofline_fields(roofline: Any) -> Mapping[str, Any]:
    """A roofline as a mapping: a RooflinePart, a ReferenceAnalysis or its dict form."""
    if roofline is None:
        return {}
    if isinstance(roofline, Mapping):
        return roofline
    if isinstance(roofline, msgspec.Struct):  # the record's part: its fields by name
        return msgspec.structs.asdict(roofline)
    to_dict = getattr(roofline, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) and out > 0 else None


def timed_paths(r: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        p
        for p in r.get("paths") or ()
        if isinstance(p, Mapping)
        and _positive(p.get("compute_time_s"))
        and _positive(p.get("roofline_time_s"))
    ]


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
    # "flops": above every compute ceiling (reported); "bytes": compulsory bytes above the
    # bandwidth ceiling (impossible on trusted ceilings); or "bytes+flops".
    problem: str | None = None
    note: str | None = None
    bandwidth_ratio: float | None = None

    def short(self) -> str | None:
        """A few words for a table cell ("3xTF32, inferred")."""
        return problem_words(self.problem) or (
            f"{SHORT_UNIT.get(str(self.key), str(self.key))}, inferred" if self.inferred else None
        )


def problem_words(problem: Any) -> str | None:
    """A table cell's words for a pricing problem (bytes before flops), or None."""
    found = set(str(problem or "").split("+"))
    if "bytes" in found:
        return "above the bandwidth ceiling"
    if "flops" in found:
        return "fewer FLOPs than the reference"
    return None


def price_measured(roofline: Any, median_s: float) -> MeasuredPeak | None:
    """The roofline share of a kernel timed at `median_s`, re-priced when it ran faster than
    the op-level peak allows; None without a roofline time."""
    r = roofline_fields(roofline)
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
    paths = timed_paths(r)
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
                + f" on the reference's FLOP count ({r.get('flops_source') or 'counted'}): "
                f"{FEWER_FLOPS}; its % of roofline is on the reference's FLOPs, so above 100%"
            )
    elif compute > median and rate is not None:
        notes.append(
            f"{format_rate(rate, 'FLOP/s')} measured, {compute / median - 1:.1%} above the "
            f"{rule}: within the {CEILING_MARGIN:.0%} a measured ceiling leaves (one library "
            "GEMM's rate, not the unit's limit), so priced at it"
        )
    compulsory_time = _price_bytes(r, median, allowed, memory, problems, notes)
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
        problem="+".join(sorted(problems)) or None,
        note="; ".join(notes) or None,
        bandwidth_ratio=compulsory_time / median if compulsory_time else None,
    )


def _price_bytes(
    r: Mapping[str, Any],
    median: float,
    allowed: float,
    memory: float,
    problems: list[str],
    notes: list[str],
) -> float:
    """`price_measured`'s bytes side: the compulsory bytes' time at the bandwidth ceiling, and
    what a rate above that ceiling says, appended to `problems` and `notes`."""
    bandwidth = _positive(r.get("bandwidth_Bps"))
    min_bytes = _positive(r.get("min_bytes")) or 0.0
    byte_rate = min_bytes / median
    dram = f"DRAM ceiling {format_rate(bandwidth, 'B/s')}" if bandwidth else "DRAM ceiling"
    # The call's own inputs and outputs (older records: the minimal bytes).
    compulsory = _positive(r.get("compulsory_bytes"))
    compulsory = min_bytes if compulsory is None else compulsory
    compulsory_time = compulsory / bandwidth if bandwidth else 0.0
    device_type = "cpu" if str(r.get("device") or "").startswith("cpu") else "cuda"
    # Beyond the slack but within the impossible-time margin (the CPU's is wider).
    if allowed < compulsory_time <= median * (1.0 + impossible_margin(device_type)):
        problems.append("bytes")
        notes.append(
            f"moved its compulsory bytes ({compulsory:.4g} B) at "
            f"{format_rate(compulsory / median, 'B/s')}, {compulsory_time / median:.2f}x the "
            f"{dram}: within the {CPU_BANDWIDTH_MARGIN:.0%} a CPU copy probe leaves (honest "
            "kernels reach 1.4x it), so not impossible"
        )
    elif compulsory_time > allowed:
        problems.append("bytes")
        notes.append(
            f"moved its compulsory bytes (each input read once, each output written once: "
            f"{compulsory:.4g} B) at {format_rate(compulsory / median, 'B/s')}, above the "
            f"{dram} by more than its {CEILING_MARGIN:.0%} margin: its data stayed in cache "
            "between calls, or a byte-count problem (bytes "
            f"{r.get('bytes_source') or 'counted'}; give the marker bytes= if the count is wrong)"
        )
    elif memory > allowed:
        notes.append(
            f"moved the reference's minimal bytes at {format_rate(byte_rate, 'B/s')}, above the "
            f"{dram}, but its own inputs and outputs within it: weights that stayed in cache or "
            "were folded at construction (not impossible)"
        )
    elif memory > median:
        notes.append(
            f"moved its minimal bytes at {format_rate(byte_rate, 'B/s')}, "
            f"{memory / median - 1:.1%} above the {dram}: within the {CEILING_MARGIN:.0%} a "
            "measured ceiling leaves, so priced at it"
        )
    return compulsory_time


def _unit_rate(path: Mapping[str, Any]) -> str:
    """ "3xTF32 tensor core (fp32 as three TF32 MMAs), 136 TFLOP/s" (effective)."""
    rate = _positive(path.get("peak_flops"))
    unit = path.get("unit") or path.get("key")
    return f"{unit}, {format_rate(rate, 'FLOP/s')}" if rate else str(unit)


def record_pricing(roofline: Any, median_s: float) -> tuple[float | None, dict[str, Any] | None]:
    """(efficiency, peak_used) as a kernel record keeps them: peak_used only when the
    op-level peak did not hold."""
    priced = price_measured(roofline, median_s)
    if priced is None:
        return None, None
    return priced.efficiency, (asdict(priced) if priced.note else None)


def kernel_efficiency(roofline: Any, median_s: float | None) -> float | None:
    """The efficiency reports show for a kernel timed at `median_s` (`price_measured`)."""
    if median_s is None:
        return None
    priced = price_measured(roofline, median_s)
    return None if priced is None else priced.efficiency


def inputs_from_memory(timing: Any) -> bool:
    """True when every sample read its inputs from memory (cache flushed, or exceeded)."""
    if timing is None:
        return False
    if getattr(timing, "flushed_l2", None):
        return True
    return "exceed" in str(getattr(timing, "flush_reason", "") or "")


def impossible_margin(device_type: str | None) -> float:
    """How far compulsory bytes may beat the bandwidth ceiling before a time is impossible."""
    return CPU_BANDWIDTH_MARGIN if device_type == "cpu" else CEILING_MARGIN


def could_be_impossible(
    peak_used: Mapping[str, Any] | None, timing: Any, device_type: str | None
) -> bool:
    """True when `impossible_failure` would fail this pricing on trusted ceilings (only then
    is re-probing untrusted ones worth its time)."""
    used = peak_used or {}
    if "bytes" not in str(used.get("problem") or "").split("+"):
        return False
    ratio = used.get("bandwidth_ratio")
    if isinstance(ratio, (int, float)) and ratio <= 1.0 + impossible_margin(device_type):
        return False
    return inputs_from_memory(timing)


def impossible_failure(
    peak_used: Mapping[str, Any] | None,
    *,
    ceilings: Ceilings,
    median_s: float,
    timing: Any = None,
) -> str | None:
    """Why the kernel's time is impossible, or None: only its compulsory bytes beyond a
    trusted bandwidth ceiling, with inputs from memory (never a FLOP rate)."""
    device_type = ceilings.device_type
    if not (peak_used and could_be_impossible(peak_used, timing, device_type) and ceilings.trusted):
        return None
    trust = ceilings.trust_reason()
    margin = impossible_margin(device_type)
    return (
        f"impossible time: its median {median_s * 1e6:.3g} us is faster than physics allows "
        f"(its compulsory bytes beyond the bandwidth ceiling, at "
        f"{peak_used.get('bandwidth_ratio', 0):.2f}x it, by more than its {margin:.0%} margin "
        "on this device: "
        f"{peak_used.get('note') or 'no detail'}; ceilings {trust}; inputs read from memory). "
        "This is not a result and is neither reported as improved nor saved in a baseline. "
        "Likely causes: device work outside the timed stream, a result cached between calls, "
        "or a wrong byte count (pass bytes= in the marker if the count is wrong)"
    )
