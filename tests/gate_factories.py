"""Synthetic kernel records for the gate tests: lognormal-ish timing samples with a seed."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from pytest_kernelpro.record import KernelRecord, RooflinePart, TimingPart, VerdictPart


def samples(median_s: float, n: int = 400, noise: float = 0.01, seed: int = 0) -> list[float]:
    """`n` positive samples around `median_s` with relative spread `noise` and a right tail
    (a few slow outliers, like real timings)."""
    rng = np.random.default_rng(seed)
    body = median_s * np.exp(noise * rng.standard_normal(n))
    tail = rng.random(n) < 0.03
    body[tail] *= 1.0 + rng.exponential(0.2, tail.sum())
    return [float(v) for v in body]


def make_record(
    name: str = "softmax[8192x4096]",
    *,
    median_s: float = 50e-6,
    n: int = 400,
    noise: float = 0.01,
    seed: int = 0,
    device: str = "NVIDIA H200",
    roofline_time_s: float | None = 30e-6,
    bound: str = "memory",
    flops: float = 1.7e8,
    min_bytes: float = 2.7e8,
    min_roofline: float | None = None,
    threshold: float = 0.05,
    gate: dict[str, Any] | None = None,
    outcome: str = "passed",
    timed: bool = True,
) -> KernelRecord:
    """A measured KernelRecord with consistent stats, roofline and efficiency."""
    s = samples(median_s, n=n, noise=noise, seed=seed) if timed else []
    timing = None
    efficiency = None
    if timed:
        arr = np.asarray(s)
        med = float(np.median(arr))
        q1, q3 = (float(v) for v in np.quantile(arr, [0.25, 0.75]))
        timing = {
            "samples_s": s,
            "stats": {
                "median_s": med,
                "q1_s": q1,
                "q3_s": q3,
                "iqr_s": q3 - q1,
                "ci_low_s": med * 0.998,
                "ci_high_s": med * 1.002,
                "rel_ci_halfwidth": 0.002,
                "n": n,
            },
            "method": "cuda-events" if device.startswith("NVIDIA") else "perf_counter",
            "device": device,
        }
        if roofline_time_s is not None:
            efficiency = roofline_time_s / med
    roofline = None
    if roofline_time_s is not None:
        roofline = {
            "flops": flops,
            "min_bytes": min_bytes,
            "intensity": flops / min_bytes,
            "ridge": 989e12 / 4.8e12,
            "bound": bound,
            "peak_name": "fp32",
            "roofline_time_s": roofline_time_s,
        }
    kernel = name.split("[")[0]
    return KernelRecord(
        nodeid=f"test_kernels.py::{name}",
        name=name,
        kernel=kernel,
        shape=name[len(kernel) + 1 : -1] if "[" in name else None,
        language="triton",
        device=device,
        device_kind="cuda" if device.startswith("NVIDIA") else "cpu",
        outcome=outcome,
        timing=None if timing is None else msgspec.convert(timing, TimingPart),
        roofline=None if roofline is None else msgspec.convert(roofline, RooflinePart),
        efficiency=efficiency,
        threshold=threshold,
        min_roofline=min_roofline,
        gate=None if gate is None else msgspec.convert(gate, VerdictPart),
    )
