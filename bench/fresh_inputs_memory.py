"""Host memory the honest timing's fresh inputs hold, in copies of one call's inputs (I) and
output (O), on a CPU softmax: the mix's setup (`fresh_inputs.fresh_inputs`) and the timing
(`measure.timing.time_kernel` with those fresh inputs, every call checked or the default rate).

    python bench/fresh_inputs_memory.py --rows 2048 --cols 32768      # 256 MiB in, 256 out

One process, the peak resident set (VmHWM) reset before each phase (`/proc/self/clear_refs`),
less the resident set as the phase starts (the timed inputs and the interpreter included
there): the extra bytes each phase held at its peak, over I (= O for a softmax). The kernel
and the reference are `torch.softmax` (no temporary but their output), the check the gate's
(`CorrectnessRule.timed_check`). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _status(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Reset VmHWM to VmRSS, the freed heap glibc kept given back first (not a phase's)."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as handle:
        handle.write("5")
    return _status("VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=32768)
    parser.add_argument("--budget-s", type=float, default=2.0)
    args = parser.parse_args()

    import torch

    from pytest_kernelpro.measure.output_rule import CorrectnessRule
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
    from pytest_kernelpro.measure.timing.cpu import steady_allocator
    from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs

    steady_allocator()  # as the CPU timer does before its first timing
    torch.set_num_threads(1)

    def draw(seed: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return [torch.randn(args.rows, args.cols, generator=gen)]

    def softmax(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

    # The gate's check of a timed output (in chunks: no temporary of the output's size).
    check = CorrectnessRule(rtol=1e-5, atol=1e-6).timed_check(torch)

    inputs = draw(1)
    nbytes = inputs[0].numel() * inputs[0].element_size()
    with torch.no_grad():
        start = _reset_peak()
        began = time.perf_counter()
        fresh = fresh_inputs(
            torch, softmax, inputs, device="cpu", make_draw=draw, reference=softmax,
            check=check,
        )  # fmt: skip
        setup_s = time.perf_counter() - began
        setup_peak = _status("VmHWM") - start
        kept = _status("VmRSS") - start
        start = _reset_peak()
        began = time.perf_counter()
        budget = TimingBudget(warmup_ms=0.0, max_time_s=args.budget_s, min_samples=10)
        result = time_kernel(None, device="cpu", budget=budget, fresh=fresh)  # type: ignore[arg-type]
        timing_s = time.perf_counter() - began
        timing_peak = _status("VmHWM") - start
    honesty = result.honesty or {}
    print(
        json.dumps(
            {
                "shape": [args.rows, args.cols],
                "input_mib": nbytes / 2**20,
                "mode": fresh.mode,
                "setup_peak_copies": round(setup_peak / nbytes, 2),
                "kept_after_setup_copies": round(kept / nbytes, 2),
                "timing_peak_copies_above_kept": round(timing_peak / nbytes, 2),
                "setup_s": round(setup_s, 3),
                "timing_s": round(timing_s, 3),
                "samples": len(result.samples_s),
                "median_ms": round(result.median_s * 1e3, 3),
                "checked_calls": honesty.get("checked_calls"),
                "refill_per_call_ms": round(1e3 * float(honesty.get("refill_per_call_s", 0)), 3),
                "check_s": honesty.get("check_s"),
                "load": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
