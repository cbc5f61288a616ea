"""Check the device model, measured ceilings and roofline analysis on a real GPU.

    python bench/ceilings_roofline.py --out $OUT

1. Measures the ceilings twice (full sizes) and once quick: copy bandwidth and GEMM rate per
   dtype, against the datasheet of the device's spec; the two full runs give repeatability.
2. Analyzes references of several kinds (GEMM bf16 / TF32 / fp32, softmax, add, layer norm,
   conv, SDPA) with the measured ceilings, times each with CUDA events (median, an L2-sized
   write between samples) and reports roofline time, measured time and efficiency.
3. Writes ceilings_run1.json, ceilings_run2.json, analyses.json, summary.txt under --out and
   prints the summary last. On a machine without a GPU it does the same on the CPU (quick).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pytest_kernelpro.measure.ceilings import Ceilings, format_rate, measure_ceilings
from pytest_kernelpro.measure.devices import find_device_spec
from pytest_kernelpro.measure.roofline import analyze_reference


def _time(fn: Any, device: str, reps: int = 30) -> float:
    """Median seconds of `fn`, with a 256 MiB write before each sample to flush the L2."""
    if device == "cpu":
        fn()
        times = []
        for _ in range(max(3, reps // 5)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _cases(device: str, small: bool) -> list[tuple[str, Any, tuple, dict[str, bool]]]:
    s = 8 if small else 1  # shrink everything on the CPU
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    n = 8192 // s
    ln = torch.nn.LayerNorm(4096 // s, device=device)
    conv = torch.nn.Conv2d(64, 128, 3, padding=1, device=device)
    return [
        (
            "gemm_bf16",
            torch.mm,
            (randn(n, n, dtype=torch.bfloat16), randn(n, n, dtype=torch.bfloat16)),
            {},
        ),
        (
            "gemm_fp32_tf32",
            torch.mm,
            (randn(n // 2, n // 2), randn(n // 2, n // 2)),
            {"tf32": True},
        ),
        (
            "gemm_fp32_ieee",
            torch.mm,
            (randn(n // 2, n // 2), randn(n // 2, n // 2)),
            {"tf32": False},
        ),
        ("softmax_fp32", lambda x: torch.softmax(x, -1), (randn(8192 // s, 4096 // s),), {}),
        (
            "add_fp32",
            torch.add,
            (randn(1 << (28 - 2 * (s > 1) * 3)), randn(1 << (28 - 2 * (s > 1) * 3))),
            {},
        ),
        ("layernorm_fp32", ln, (randn(8192 // s, 4096 // s),), {}),
        ("conv_fp32", conv, (randn(32 // s, 64, 56, 56),), {}),
        (
            "sdpa_bf16",
            F.scaled_dot_product_attention,
            tuple(randn(4, 16, 4096 // s, 128, dtype=torch.bfloat16) for _ in range(3)),
            {},
        ),
    ]


def _set_tf32(enabled: bool) -> None:
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32" if enabled else "ieee"
    else:
        matmul.allow_tf32 = enabled


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    lines: list[str] = []
    wall0 = time.perf_counter()

    runs: list[Ceilings] = []
    for i in (1, 2):
        c = measure_ceilings(device, quick=not gpu)
        runs.append(c)
        (args.out / f"ceilings_run{i}.json").write_text(json.dumps(c.to_dict(), indent=2))
    quick = measure_ceilings(device, quick=True)
    c1, c2 = runs
    spec = find_device_spec(c1.device) if gpu else None
    lines.append(
        f"device: {c1.device}  torch {torch.__version__}  spec: {spec.name if spec else None}"
    )
    lines.append(
        f"{'ceiling':<12} {'run1':>14} {'run2':>14} {'diff':>7} {'quick':>14} {'datasheet':>14} {'of sheet':>8}"
    )
    rows = [
        (
            "bandwidth",
            c1.bandwidth_Bps,
            c2.bandwidth_Bps,
            quick.bandwidth_Bps,
            spec.dram_bandwidth_Bps if spec else None,
            "B/s",
        )
    ]
    for key in sorted(c1.flops):
        if c1.origin(key) != "measured":
            continue
        sheet = spec.peak_flops.get(key) if spec else None
        rows.append(
            (
                key,
                c1.flops[key],
                c2.flops.get(key, float("nan")),
                quick.flops.get(key, float("nan")),
                sheet,
                "FLOP/s",
            )
        )
    for key, a, b, q, sheet, unit in rows:
        diff = abs(a - b) / a
        lines.append(
            f"{key:<12} {format_rate(a, unit):>14} {format_rate(b, unit):>14} {diff:>7.2%} "
            f"{format_rate(q, unit):>14} {format_rate(sheet, unit) if sheet else '-':>14} "
            f"{(a / sheet if sheet else float('nan')):>8.1%}"
        )

    analyses: dict[str, Any] = {}
    lines.append("")
    lines.append(
        f"{'kernel':<16} {'GFLOP':>9} {'min MB':>9} {'unf MB':>9} {'bound':>8} {'roof us':>9} {'meas us':>9} {'eff':>6}  peak"
    )
    for name, fn, inputs, flags in _cases(device, small=not gpu):
        if "tf32" in flags:
            _set_tf32(flags["tf32"])
        try:
            with torch.no_grad():
                a = analyze_reference(fn, inputs, ceilings=c1, spec=spec)
                measured = _time(lambda fn=fn, inputs=inputs: fn(*inputs), device)
        except Exception as exc:  # one case's failure must not lose the others
            lines.append(f"{name:<16} FAILED {type(exc).__name__}: {exc}")
            continue
        finally:
            _set_tf32(False)
        analyses[name] = {
            **a.to_dict(),
            "measured_s": measured,
            "efficiency": a.efficiency(measured),
        }
        lines.append(
            f"{name:<16} {a.flops / 1e9:>9.2f} {a.min_bytes / 1e6:>9.1f} {a.unfused_bytes / 1e6:>9.1f} "
            f"{a.bound:>8} {a.roofline_time_s * 1e6:>9.1f} {measured * 1e6:>9.1f} {a.efficiency(measured):>6.1%}  {a.peak_name}"
        )
    (args.out / "analyses.json").write_text(json.dumps(analyses, indent=2))
    lines.append(f"\nwall time {time.perf_counter() - wall0:.1f} s")
    summary = "\n".join(lines)
    (args.out / "summary.txt").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
