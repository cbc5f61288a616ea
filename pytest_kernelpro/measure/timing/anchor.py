"""The clock anchor: a fixed GEMM timed right after every sample of a power-capped kernel.

Under a GPU's power cap the SM clock the cap allows moves between measurements, and a
compute-bound kernel's time moves with it by more than the slowdowns the gate must see; the
NVML mean SM clock of a measurement does not follow the kernel. A second compute-bound kernel
run right after each sample sees the same clock, so the kernel / anchor ratio cancels it
(common mode): per pair it spreads several times less between measurements than the time
does, and less than a pass of pairs after the samples would
(bench/results/2026-12-01-gate-accuracy-h200.md).

When on (`TimingBudget.clock_anchor="on"`, the plugin's default), the timer decides from the
warm-up whether the kernel runs under a clock limit (`warmup_capped`: the sampling rounds'
per-reading throttle test on the warm-up's NVML readings). If it does, every sample is a pair
(flush, kernel, flush, anchor, each bracketed by events), at least `ANCHOR_MIN_PAIRS` of them,
and the timing stops on the CI of the ratios, not of the kernel's own time (noisier in paired
rounds). A kernel at a steady clock pays nothing: there the anchor would only add its noise.

The anchor is the plugin's own bf16 GEMM of `ANCHOR_N`^3 on fixed (seeded) data: independent
of the code under test (the item's reference would hide a regression of a kernel that calls
the same library, and is the kernel itself for a KernelBench problem) and power-hungry enough
to run at the cap itself. The kernel's reported time stays its own samples'; the pairs add
`TimingResult.anchor`, which the gate compares for capped comparisons (gate/verdict_basis.py).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pytest_kernelpro.measure import bound

ANCHOR_N = 4096  # the anchor GEMM: bf16 (ANCHOR_N x ANCHOR_N) @ (ANCHOR_N x ANCHOR_N)
# An anchored measurement takes at least this many pairs: within one measurement the per-pair
# ratio of the capped GEMMs scattered by 0.6-1.1% (probe), so the median of 40 moves by about
# 0.2% and the change between two measurements by about 0.3% from sampling alone.
ANCHOR_MIN_PAIRS = 40
CAPPED_SHARE = 0.5  # the share of the warm-up's readings under a clock limit that anchors
LAYOUT = "per-sample"  # the anchor after every sample in the same round (this module)
# Per device index: (a, b, out) of the anchor GEMM, kept for the process like the flush
# buffer, so its data (and the power it draws) is the same for every kernel and every run.
_ANCHOR_BUFFERS: dict[int, tuple[Any, Any, Any]] = {}


def anchor_name(torch: Any) -> str:
    """The anchor's identity: a baseline's ratios are comparable only under the same one
    (another torch or CUDA build may choose another GEMM kernel for it)."""
    return (
        f"bf16 matmul {ANCHOR_N}x{ANCHOR_N}x{ANCHOR_N} "
        f"(torch {torch.__version__}, CUDA {torch.version.cuda})"
    )


def anchor_buffers_bytes() -> int:
    """Bytes the session keeps for the anchor (an item's memory report leaves them out)."""
    return sum(
        int(t.numel()) * int(t.element_size()) for bufs in _ANCHOR_BUFFERS.values() for t in bufs
    )


def anchor_launch(torch: Any, idx: int) -> Callable[[], object]:
    """A zero-argument launch of the anchor GEMM on device `idx` (buffers made once)."""
    if idx not in _ANCHOR_BUFFERS:
        gen = torch.Generator(device=f"cuda:{idx}").manual_seed(20261201)
        shape = (ANCHOR_N, ANCHOR_N)
        a, b = (
            torch.randn(shape, generator=gen, device=f"cuda:{idx}", dtype=torch.bfloat16)
            for _ in range(2)
        )
        _ANCHOR_BUFFERS[idx] = (a, b, torch.empty_like(a))
    a, b, out = _ANCHOR_BUFFERS[idx]
    return lambda: torch.matmul(a, b, out=out)


def warmup_capped(mode: str, throttled: Sequence[bool]) -> bool:
    """True when the samples should be anchored: mode "on" and at least half of the NVML
    readings taken while the warm-up ran had a clock-lowering reason (`throttled`, one flag
    per reading). No readings (no NVML): False, the kernel is timed alone."""
    return mode == "on" and bool(throttled) and sum(throttled) >= CAPPED_SHARE * len(throttled)


def anchored_min_samples(min_samples: int, max_samples: int) -> int:
    """The sample count an anchored measurement takes at least (within `max_samples`)."""
    return min(max_samples, max(min_samples, ANCHOR_MIN_PAIRS))


def summarize_pairs(
    name: str,
    kernel_s: Sequence[float],
    anchor_s: Sequence[float],
    reason: str,
    *,
    throttled: Sequence[bool] | None = None,
    flush_s: float = 0.0,
) -> dict[str, Any]:
    """The `TimingResult.anchor` dict: the anchor's times (the kernel's are the samples), both
    medians, the per-pair ratios kernel / anchor and their median, how many pairs ran in throttled rounds, and the GPU
    time the anchor added (its own time plus its flush, per pair)."""
    flags = list(throttled) if throttled is not None else [False] * len(kernel_s)
    kept = [(k, a, t) for k, a, t in zip(kernel_s, anchor_s, flags, strict=True) if k > 0 and a > 0]
    ratios = [k / a for k, a, _ in kept]
    anchors = [a for _, a, _ in kept]
    return {
        "name": name,
        "layout": LAYOUT,
        "reason": reason,
        "pairs": len(kept),
        "throttled_pairs": sum(t for _, _, t in kept),
        "anchor_s": anchors,
        "ratios": ratios,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "kernel_median_s": statistics.median([k for k, _, _ in kept]) if kept else None,
        "anchor_median_s": statistics.median(anchors) if anchors else None,
        "added_gpu_s": sum(anchors) + max(flush_s, 0.0) * len(kept),
    }


bound.keep_module(sys.modules[__name__])
