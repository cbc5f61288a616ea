"""Is the CPU copy probe an upper bound on what an honest kernel moves after a flush?

The impossible-time rule (pytest_kernelpro/measure/roofline.py) fails a kernel whose
compulsory bytes (inputs read once, outputs written once) beat the trusted bandwidth ceiling
by more than a margin, when the inputs came from memory (the cache flushed before each
sample). This bench times honest streaming kernels the way the CPU timer does (inputs refilled,
then the flush the timer writes, then the call, in on-CPU time) at working sets from 256 KiB to
64 MiB, and divides their compulsory-byte rate by the ceiling probe's copy rate (the 256 MiB
`copy_` of `measure.ceilings.measure_cpu`, best of 5). A ratio above 1 + margin on an honest
kernel is a false "impossible time".

    python bench/cpu_bandwidth_bound.py [--reps N] [--busy K]

`--busy K` starts K spinning processes first (the loaded machine CI runs on).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import statistics
import time

import numpy as np
import torch

from pytest_kernelpro.measure.timing.cpu_cache import cpu_cache_levels, cpu_flush_bytes


def spin() -> None:
    while True:
        pass


def on_cpu() -> float:
    return time.thread_time()


def copy_probe(nbytes: int, reps: int) -> float:
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(reps))
    return 2 * nbytes / best


def _timed(call) -> float:
    start = on_cpu()
    call()
    return on_cpu() - start


KERNELS = {
    "scale x*w": (lambda x, w: x * w, 2),  # read x, write out
    "add x+x": (lambda x, w: x + x, 2),
    "copy clone": (lambda x, w: x.clone(), 2),
    "sum rows": (lambda x, w: x.sum(1), 1),  # read x (output negligible)
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--busy", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workers = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for w in workers:
        w.start()
    flush = np.ones(cpu_flush_bytes(), dtype=np.uint8)
    ceiling = copy_probe(256 << 20, 5)
    print(
        f"caches {cpu_cache_levels()}, flush {flush.nbytes >> 20} MiB, busy {args.busy}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"ceiling probe (256 MiB copy_, best of 5, on-CPU): {ceiling / 1e9:.2f} GB/s")
    print(
        f"{'kernel':<12} {'working set':>11} {'median GB/s':>11} {'best GB/s':>9} "
        f"{'median/ceil':>11} {'best/ceil':>9}"
    )
    worst = 0.0
    for name, (kernel, passes) in KERNELS.items():
        for kib in (256, 1024, 4096, 16384, 65536):
            x = torch.randn(kib * 256 // 64, 64)
            w = torch.ones(64)
            moved = passes * x.nbytes
            times = []
            for _ in range(args.reps if kib <= 4096 else max(20, args.reps // 10)):
                x.uniform_()  # the refill: fresh content, written just before the flush
                np.add(flush, 1, out=flush)
                times.append(_timed(functools.partial(kernel, x, w)))
            median = moved / statistics.median(times) / ceiling
            best = moved / min(times) / ceiling
            worst = max(worst, median)
            print(
                f"{name:<12} {kib:>7} KiB {moved / statistics.median(times) / 1e9:>11.2f} "
                f"{moved / min(times) / 1e9:>9.2f} {median:>11.2f} {best:>9.2f}"
            )
    print(f"highest median/ceiling: {worst:.2f}")
    # What the rule must still catch: the same kernel on inputs left in cache (no flush).
    x, w = torch.randn(4096, 64), torch.ones(64)
    times = []
    for _ in range(args.reps):
        x.uniform_()
        times.append(_timed(functools.partial(torch.mul, x, w)))
    cached = 2 * x.nbytes / statistics.median(times) / ceiling
    print(f"scale x*w 1024 KiB, inputs left in cache (no flush): median/ceiling {cached:.2f}")
    for w in workers:
        w.terminate()


if __name__ == "__main__":
    main()
