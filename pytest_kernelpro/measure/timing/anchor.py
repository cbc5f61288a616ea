"""The clock anchor: a fixed GEMM timed in the same rounds as a power-capped kernel (opt-in,
`--kernelpro-clock-anchor=on`; why it is not the default: gate/clock_anchor.py).

Under the H200's power cap the SM clock the cap allows moves between measurements (about
1450-1900 MHz for bf16/fp16/TF32 GEMMs and attention), and a compute-bound kernel's time moves
with it: two measurements of the same GEMM differed by 1.9-5.4% (standard deviation), so the
gate could not tell a 3% slowdown from the cap. The NVML mean SM clock of a measurement did
not follow the kernel. What does: a second compute-bound kernel run in the same rounds sees
the same clock, so the time of the kernel relative to it cancels the clock (common mode).
Measured on the capped GEMMs and attention (bench/results/2026-12-01-gate-accuracy-h200.md,
session 4): A/A spread of the kernel / anchor ratio 0.33-0.56% with the anchor after every
sample (probe), 0.7-0.9% with this pass after the samples, against 1.9-5.4% for the time.

So, when on, after the ordinary sampling a measurement whose samples were mostly taken under a clock
limit (the same test as the gate's `ClockFacts.capped_share`) takes an anchored pass:
`ANCHOR_PAIRS` pairs of (flush, kernel, flush, anchor) in one round, each bracketed by events.
The anchor is the plugin's own bf16 GEMM of `ANCHOR_N`^3 on fixed (seeded) data: independent
of the code under test (the item's reference would hide a regression of a kernel that calls
the same library, and is the kernel itself for a KernelBench problem), power-hungry enough to
run at the cap itself, and ~0.2 ms on an H200. The kernel's reported time stays the ordinary
samples'; the pass only adds `TimingResult.anchor`, which the gate uses for clock-limited
comparisons (gate/clock_anchor.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

ANCHOR_N = 4096  # the anchor GEMM: bf16 (ANCHOR_N x ANCHOR_N) @ (ANCHOR_N x ANCHOR_N)
ANCHOR_PAIRS = 20  # kernel/anchor pairs of the anchored pass (the timing's min_samples)
ANCHOR_MIN_PAIRS = 10  # a long kernel gets fewer pairs, never fewer than this
ANCHOR_PASS_S = 0.25  # the anchored pass's planned length (long kernels get fewer pairs)
CAPPED_SHARE = 0.5  # the share of samples under a clock limit that asks for the pass
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


def _anchor_launch(torch: Any, idx: int) -> Callable[[], object]:
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


def wants_anchor(mode: str, throttled: list[bool]) -> bool:
    """True when the anchored pass should run: mode "on" and at least half the samples in
    rounds with a clock limit."""
    return mode == "on" and bool(throttled) and sum(throttled) >= CAPPED_SHARE * len(throttled)


def pair_count(per_call_s: float, anchor_s: float) -> int:
    """Pairs that fit `ANCHOR_PASS_S` (between `ANCHOR_MIN_PAIRS` and `ANCHOR_PAIRS`)."""
    per_pair = max(per_call_s, 0.0) + max(anchor_s, 0.0)
    if per_pair <= 0:
        return ANCHOR_PAIRS
    return max(ANCHOR_MIN_PAIRS, min(ANCHOR_PAIRS, math.floor(ANCHOR_PASS_S / per_pair)))


def summarize_pass(
    name: str, kernel_s: list[float], anchor_s: list[float], reason: str
) -> dict[str, Any]:
    """The `TimingResult.anchor` dict of one pass: both series, their medians and the
    median of the per-pair ratios kernel / anchor."""
    import statistics

    pairs = [(k, a) for k, a in zip(kernel_s, anchor_s, strict=True) if k > 0 and a > 0]
    ratios = [k / a for k, a in pairs]
    return {
        "name": name,
        "reason": reason,
        "pairs": len(pairs),
        "kernel_s": [k for k, _ in pairs],
        "anchor_s": [a for _, a in pairs],
        "ratios": ratios,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "kernel_median_s": statistics.median([k for k, _ in pairs]) if pairs else None,
        "anchor_median_s": statistics.median([a for _, a in pairs]) if pairs else None,
    }


def anchored_pass(
    torch: Any,
    idx: int,
    body: Callable[[], object],
    calls: int,
    flush: Callable[[], None],
    per_call_s: float,
    sleep_cycles_per_s: float,
    host_s: float,
    reason: str,
) -> dict[str, Any]:
    """Time `body` (`calls` kernel calls) and the anchor GEMM alternately in one round."""
    anchor = _anchor_launch(torch, idx)
    event = torch.cuda.Event
    anchor()  # load its module (and cuBLAS's choice for it) outside the pass
    start, end = event(enable_timing=True), event(enable_timing=True)
    start.record()
    anchor()
    end.record()
    end.synchronize()
    anchor_s = start.elapsed_time(end) * 1e-3
    n = pair_count(per_call_s * calls, anchor_s)
    marks = [tuple(event(enable_timing=True) for _ in range(4)) for _ in range(n)]
    # The GPU busy while the CPU enqueues the round (as the sampling rounds do).
    torch.cuda._sleep(int(min(0.05, 3 * n * host_s) * sleep_cycles_per_s))
    for k0, k1, a0, a1 in marks:
        flush()
        k0.record()
        body()
        k1.record()
        flush()
        a0.record()
        anchor()
        a1.record()
    marks[-1][3].synchronize()
    kernel_s = [k0.elapsed_time(k1) * 1e-3 / calls for k0, k1, _, _ in marks]
    anchors_s = [a0.elapsed_time(a1) * 1e-3 for _, _, a0, a1 in marks]
    return summarize_pass(anchor_name(torch), kernel_s, anchors_s, reason)
