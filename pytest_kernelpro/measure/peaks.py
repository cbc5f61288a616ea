"""Which ceiling rate an op's peak key runs at (`resolve_peak`: a missing key's stand-in, with
a note) and the names reports give a peak (`peak_label`, `peak_name`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.ceilings import Ceilings, format_rate
from pytest_kernelpro.measure.flops import TF32X3_KEY, TF32X3_MMAS

# When a key is not in the ceilings, the next one that is stands in (noted in the analysis).
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp64": ("fp64_tensor", "fp32"),
    "fp64_tensor": ("fp64", "fp32"),
    "tf32_tensor": ("fp32",),
    TF32X3_KEY: ("fp32",),
    "fp16_tensor": ("bf16_tensor", "fp16", "bf16", "tf32_tensor", "fp32"),
    "bf16_tensor": ("fp16_tensor", "bf16", "fp16", "tf32_tensor", "fp32"),
    "fp8_tensor": ("int8_tensor", "bf16_tensor", "fp16_tensor", "bf16", "fp32"),
    "int8_tensor": ("fp8_tensor", "bf16_tensor", "fp16_tensor", "bf16", "fp32"),
    "fp16": ("bf16", "fp32"),
    "bf16": ("fp16", "fp32"),
    "fp32": ("tf32_tensor", "fp64"),
}
_LABELS = {
    "fp64": "FP64 CUDA core",
    "fp64_tensor": "FP64 tensor core (DMMA)",
    "fp32": "FP32 CUDA core",
    "tf32_tensor": "TF32 tensor core",
    TF32X3_KEY: "3xTF32 tensor core (fp32 as three TF32 MMAs)",
    "bf16_tensor": "BF16 tensor core",
    "fp16_tensor": "FP16 tensor core",
    "fp8_tensor": "FP8 tensor core",
    "int8_tensor": "INT8 tensor core",
}


def peak_label(key: str, device_type: str) -> str:
    """Human name of a peak key: "tf32_tensor" -> "TF32 tensor core"."""
    if device_type != "cuda":
        return f"CPU {key.upper()} (torch.matmul rate)"
    return _LABELS.get(key, key)


def resolve_peak(ceilings: Ceilings, key: str) -> tuple[str, float, str | None]:
    """(key used, FLOP/s, note) for `key`, falling back along _FALLBACK when it is missing."""
    if key in ceilings.flops:
        return key, ceilings.flops[key], None
    if key == TF32X3_KEY and "tf32_tensor" in ceilings.flops:
        return key, ceilings.flops["tf32_tensor"] / TF32X3_MMAS, None
    for other in _FALLBACK.get(key, ("fp32",)):
        if other in ceilings.flops:
            note = (
                f"no {key!r} ceiling for {ceilings.device}; used {other!r} "
                f"({format_rate(ceilings.flops[other], 'FLOP/s')}) instead"
            )
            return other, ceilings.flops[other], note
    raise KernelproError(
        f"ceilings of {ceilings.device} have no {key!r} rate nor a stand-in "
        f"(have {sorted(ceilings.flops)}); run `kernelpro calibrate` or add a device spec"
    )


def peak_origin(ceilings: Ceilings, key: str) -> str:
    if key == TF32X3_KEY:
        return f"{ceilings.origin('tf32_tensor')} TF32 rate / {TF32X3_MMAS} ="
    return ceilings.origin(key)


def peak_name(
    per_key: Mapping[str, float],
    rates: Mapping[str, tuple[float, str]],
    peak: float,
    device_type: str,
) -> str:
    def one(key: str) -> str:
        rate, origin = rates[key]
        return f"{peak_label(key, device_type)} ({origin} {format_rate(rate, 'FLOP/s')})"

    if len(per_key) == 1:
        return one(next(iter(per_key)))
    total = sum(per_key.values())
    parts = sorted(per_key, key=lambda k: -per_key[k])
    shares = ", ".join(f"{per_key[k] / total:.0%} on {one(k)}" for k in parts)
    return f"mixed, effective {format_rate(peak, 'FLOP/s')}: {shares}"
