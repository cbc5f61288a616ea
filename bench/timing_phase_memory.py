"""One-off: the device memory of the gate's honest timing (fresh inputs, checked timed
outputs) of KernelBench 23_Softmax in one process, as a sandbox worker's timing phase runs it
(`optimize/sandbox/harness._Pipeline.time`: `measurement.fresh_calls` then `time_call`).

Prints, in copies of one call's input (6 GiB for 4096x393216 float32), the allocator's peak
allocated and reserved bytes after the inputs are drawn, after the fresh inputs' setup and
after the timing (its peaks reset after the setup), and the device's used memory (the
driver's count).

    python bench/timing_phase_memory.py [--rows 4096] [--cols 393216] [--device cuda]
"""

from __future__ import annotations

import argparse
import json

import torch

from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=393216)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = args.device
    copy = args.rows * args.cols * 4

    def draw(seed: int) -> list[torch.Tensor]:
        generator = torch.Generator(device=device).manual_seed(seed)
        return [torch.rand(args.rows, args.cols, device=device, generator=generator)]

    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

    def check(got: torch.Tensor, expected: torch.Tensor) -> str | None:
        return None if torch.allclose(got, expected, rtol=1e-4, atol=1e-6) else "differs"

    rows: list[dict[str, object]] = []

    def stats(moment: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        rows.append(
            {
                "moment": moment,
                "allocated": round(torch.cuda.memory_allocated() / copy, 2),
                "peak_allocated": round(torch.cuda.max_memory_allocated() / copy, 2),
                "peak_reserved": round(torch.cuda.max_memory_reserved() / copy, 2),
                "device_used": round((total - free) / copy, 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    torch.cuda.init()
    stats("context")
    inputs = draw(1)
    stats("inputs drawn")
    with torch.no_grad():
        fresh = fresh_inputs(
            torch, model, inputs, device=device, make_draw=draw, reference=model, check=check
        )
        stats("fresh inputs set up")
        torch.cuda.reset_peak_memory_stats()  # the timing's own peaks from here
        result = time_kernel(None, device=device, budget=TimingBudget(), fresh=fresh)
        stats("timed")
    print(json.dumps({"copy_bytes": copy, "samples": len(result.samples_s),
                      "median_s": result.median_s}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
