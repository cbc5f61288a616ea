"""The winner's confirmation rule: do a fresh trusted re-timing and ncu agree with the time
the search ranked the candidate by?

`SandboxEvaluator.confirm` (`confirm_winner.py`) re-times the winner in a fresh sandboxed
worker (`worker.retime`: the search's timed call on the gate's timer, fresh inputs and checked
outputs, the clocks kept before the candidate's code runs and verified every sample) and
hands the raw samples here, with ncu's kernel durations from the candidate's profile where
the search profiled it. Two checks, each of which disqualifies:

1. **Re-timing.** The fresh median may be at most `tolerance` times the search's median.
   On a GPU the tolerance is `CUDA_TOLERANCE` (1.25): with the same timer the largest spread
   measured between processes for one kernel on the H200 was 14% (cuBLAS bf16 GEMM 8192³,
   1407-1605 µs over four processes), the others within 2.3%
   (bench/results/2026-11-30-foundation-h200.md). On the CPU it is `CPU_TOLERANCE` (3.0):
   timings on a loaded shared machine move by several times between processes
   (bench/results/2026-12-01-cpu-threads-cpu.md). A fresh time faster than the claim never
   disqualifies (a slower claim helps no cheat), but one faster by more than the same
   tolerance is a *disagreement*, never "confirmed": the two timings do not measure the same
   thing (a CPU softmax winner re-timed at 11.28 µs, 0.05x the search's 234.7 µs, had been
   reported as confirmed within a 3.0x tolerance). The winner stays; its record says
   `agreement: "disagreement"` with both numbers. A re-timing too slow is repeated once in
   another fresh worker before it disqualifies (`confirm_winner.RETIMINGS`).
2. **ncu.** ncu measures each of the candidate's kernels from its own process
   (`gpu__time_duration.sum`, caches flushed, launches serialized). The sum over the
   profiled kernels of one call (`analysis.evaluator.ncu_gpu_time_s`, which the profiling
   evaluator stores in the candidate's `metrics["profile"]["ncu_gpu_time_s"]`) is GPU time that call cannot take less than (it leaves out
   unprofiled kernels and launch gaps), so a claimed or re-timed median below
   sum / `NCU_TOLERANCE` - `NCU_SLACK_S` was not measured on this GPU. The tolerance covers
   ncu's own per-kernel overhead and kernels that overlap on several streams; the slack, the
   microsecond-scale launch bookkeeping of very short kernels.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CUDA_TOLERANCE = 1.25
CPU_TOLERANCE = 3.0
NCU_TOLERANCE = 1.25
NCU_SLACK_S = 2e-6


@dataclass(frozen=True)
class Confirmation:
    """The outcome: `ok`, the reason when not, and what was compared (for the report)."""

    ok: bool
    reason: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    # Refused for a re-timing slower than the tolerance (the case `confirm_winner` repeats).
    too_slow: bool = False


def default_tolerance(device_kind: str) -> float:
    """The re-timing tolerance for a device kind ("cuda" or "cpu"); see the module doc."""
    return CUDA_TOLERANCE if device_kind == "cuda" else CPU_TOLERANCE


def confirm_timing(
    claimed_s: float,
    samples_s: Sequence[float],
    *,
    device_kind: str,
    tolerance: float | None = None,
    ncu_s: float | None = None,
    method: str = "",
) -> Confirmation:
    """Apply both checks of the module doc to one winner's numbers."""
    tol = default_tolerance(device_kind) if tolerance is None else float(tolerance)
    samples = [float(s) for s in samples_s if isinstance(s, (int, float)) and s > 0]
    if not samples or not claimed_s > 0:
        return Confirmation(False, "timing not confirmed: no usable median", {})
    fresh = statistics.median(samples)
    record: dict[str, Any] = {
        "median_s": fresh,
        "samples": len(samples),
        "method": method,
        "claimed_median_s": claimed_s,
        "ratio": fresh / claimed_s,
        "tolerance": tol,
        "ncu_gpu_time_s": ncu_s,
        "ncu_ratio": None if not ncu_s else ncu_s / min(claimed_s, fresh),
        "agreement": "confirmed",
    }
    if fresh > claimed_s * tol:
        return Confirmation(
            False,
            f"timing not confirmed: re-timed in a fresh process at {fresh * 1e6:.4g} µs, "
            f"{fresh / claimed_s:.3g}x the {claimed_s * 1e6:.4g} µs the search measured "
            f"(more than the {tol:g}x allowed on {device_kind}): the search's number was not "
            "real",
            record,
            too_slow=True,
        )
    fastest = min(claimed_s, fresh)
    if ncu_s and fastest * NCU_TOLERANCE + NCU_SLACK_S < ncu_s:
        which = "the search" if claimed_s <= fresh else "the re-timing"
        return Confirmation(
            False,
            f"timing not confirmed: ncu measured the candidate's kernels at {ncu_s * 1e6:.4g} "
            f"µs of GPU time per call, {ncu_s / fastest:.3g}x the {fastest * 1e6:.4g} µs "
            f"{which} measured (a call cannot take less than its kernels; more than the "
            f"{NCU_TOLERANCE:g}x allowed): the number was not real",
            record,
        )
    if fresh * tol < claimed_s:
        record["agreement"] = "disagreement"
        return Confirmation(
            True,
            f"timing disagreement: re-timed in a fresh process at {fresh * 1e6:.4g} µs, "
            f"{fresh / claimed_s:.3g}x the {claimed_s * 1e6:.4g} µs the search measured "
            f"(faster by more than the {tol:g}x allowed on {device_kind}): not confirmed; the "
            "winner stays (a faster re-timing helps no cheat), its time is uncertain",
            record,
        )
    return Confirmation(True, "", record)
