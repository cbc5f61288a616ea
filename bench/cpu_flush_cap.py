"""How much cache flush a CPU sample needs: the time of a sum over inputs of W MiB after
writing F MiB (F from none to twice the LLC), median of 40 samples each, one thread.

The question behind the flush cap (measure/timing/cpu.py `cpu_flush_bytes`): does a flush of
the L2 plus only part of the last-level cache make small inputs as cold as a whole-cache one,
and what does each flush cost? Prints a Markdown table.

    python bench/cpu_flush_cap.py [--samples 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from pytest_kernelpro.measure.timing.cpu import cpu_cache_levels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    levels = cpu_cache_levels()
    l2, llc = levels[sorted(levels)[-2]], levels[max(levels)]
    mib = 2**20
    flushes = {
        "none": 0,
        "L2 + LLC/4": l2 + llc // 4,
        "L2 + LLC/2": l2 + llc // 2,
        "L2 + LLC": l2 + llc,
        "2x (L2 + LLC)": 2 * (l2 + llc),
    }
    buffers = {name: np.ones(max(n, 1), dtype=np.uint8) for name, n in flushes.items()}
    print(f"L2 {l2 // 1024} KiB, LLC {llc // mib} MiB, torch threads 1")
    print()
    print("| inputs | " + " | ".join(f"{k} ({v / mib:.0f} MiB)" for k, v in flushes.items()) + " |")
    print("|---|" + "---|" * len(flushes))
    flush_cost = {}
    for inputs_mib in (0.5, 2, 8, 16, 24):
        x = torch.rand(int(inputs_mib * mib / 4))
        row = []
        for name, n in flushes.items():
            buf, fill = buffers[name], 0
            times, costs = [], []
            for _ in range(args.samples):
                if n:
                    fill = (fill + 1) & 0xFF
                    f0 = time.perf_counter()
                    buf.fill(fill)
                    costs.append(time.perf_counter() - f0)
                t0 = time.perf_counter()
                x.sum()
                times.append(time.perf_counter() - t0)
            if costs:
                flush_cost[name] = statistics.median(costs)
            row.append(f"{statistics.median(times) * 1e6:.0f} us")
        print(f"| {inputs_mib:g} MiB | " + " | ".join(row) + " |")
    print()
    print("| flush | " + " | ".join(flush_cost) + " |")
    print("|---|" + "---|" * len(flush_cost))
    print("| ms per flush | " + " | ".join(f"{v * 1e3:.2f}" for v in flush_cost.values()) + " |")


if __name__ == "__main__":
    main()
