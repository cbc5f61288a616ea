"""The roofline of fp32 matrix work moved to each faster unit of a GPU in turn (`matrix_paths`):
the FP32 CUDA cores, 3xTF32 and TF32 on the tensor cores. Imported by
`roofline.analyze_reference` for a CUDA reference only (a CPU has one unit for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kernelpro.measure.ceilings import (
    Ceilings,
    peak_label,
    peak_name,
    peak_origin,
    resolve_peak,
)
from pytest_kernelpro.measure.flops import TF32X3_KEY, OpCost

# The units fp32 matrix work can run on, slowest first, and the accuracy each keeps: the FP32
# CUDA cores (TF32 off), 3xTF32 on the tensor cores (big*big + big*small + small*big of the
# product's TF32 parts: fp32 accuracy), TF32 (10-bit mantissa).
MATRIX_PATH_ORDER: tuple[str, ...] = ("fp32", TF32X3_KEY, "tf32_tensor")
PATH_ACCURACY: dict[str, str] = {"fp32": "fp32", TF32X3_KEY: "fp32", "tf32_tensor": "tf32"}
_MATRIX_CATEGORIES = ("gemm", "conv", "attention")


def matrix_paths(
    ops: Sequence[OpCost],
    ceilings: Ceilings,
    total_flops: float,
    memory_time_s: float,
    device_type: str,
) -> tuple[dict[str, Any], ...]:
    """The roofline with the fp32 matrix work moved to each faster unit in turn (key,
    accuracy, effective peak and its name, compute and roofline times), the op-level pricing
    first; units without a ceiling here are left out. Empty on a CPU or without such work."""
    if device_type != "cuda":
        return ()
    priced = [op for op in ops if op.flops > 0]
    movable = [
        op
        for op in priced
        if op.category in _MATRIX_CATEGORIES and op.peak_key in MATRIX_PATH_ORDER[:-1]
    ]
    if not movable:
        return ()
    first = min(MATRIX_PATH_ORDER.index(op.peak_key) for op in movable)
    moved = {id(op) for op in movable}
    paths: list[dict[str, Any]] = []
    for level in range(first, len(MATRIX_PATH_ORDER)):
        per_key: dict[str, float] = {}
        rates: dict[str, tuple[float, str]] = {}
        time_counted = 0.0
        accuracy = "fp32"
        usable = True
        for op in priced:
            key = op.peak_key
            if id(op) in moved:
                key = MATRIX_PATH_ORDER[max(level, MATRIX_PATH_ORDER.index(op.peak_key))]
                accuracy = "tf32" if PATH_ACCURACY[key] == "tf32" else accuracy
            used, rate, note = resolve_peak(ceilings, key)
            if note and id(op) in moved:
                usable = False  # no ceiling for this unit here: not a path of this device
                break
            rates[used] = (rate, peak_origin(ceilings, used))
            per_key[used] = per_key.get(used, 0.0) + op.flops
            time_counted += op.flops / rate
        if not usable:
            continue
        peak = sum(per_key.values()) / time_counted
        compute = total_flops / peak
        paths.append(
            {
                "key": MATRIX_PATH_ORDER[level],
                "unit": peak_label(MATRIX_PATH_ORDER[level], device_type),
                "accuracy": accuracy,
                "peak_flops": peak,
                "peak_name": peak_name(per_key, rates, peak, device_type),
                "compute_time_s": compute,
                "roofline_time_s": max(compute, memory_time_s),
            }
        )
    return tuple(paths)
