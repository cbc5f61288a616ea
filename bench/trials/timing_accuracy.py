"""Timing accuracy of `time_kernel` on an H200 (dry-runnable on a CPU).

For each kernel of `KERNELS` (memory-bound, softmax, fp32 GEMM with and without TF32, bf16
tensor-core GEMM, a Triton kernel, a launch-bound tiny kernel in events and graph mode):

  * our median (pass A) against `triton.testing.do_bench(fn, return_mode="median")` (or
    `do_bench_cudagraph` for graph mode) in the same process: the ratio;
  * a second, independent measurement of our median (pass B, after every other kernel and
    do_bench ran in between): the relative difference (target < 1%, aim 0.5%);
  * the same pair with `sync_per_sample=True` (KernelBench-style: synchronize after every
    sample) to compare the two GPU sampling schemes;
  * wall seconds time_kernel spent, stop reason, samples, throttled samples, SM clock.

Writes timing.json to --out and prints a table last.

    python bench/trials/timing_accuracy.py --out $OUT [--budget 2.0] [--no-sync-variant]

Importable: `KERNELS` is a list of (name, kind, build) where build(device) returns
(fn, flops, bytes) with inputs already built on `device`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from pytest_kernelpro.measure.timing import TimingBudget, time_kernel  # noqa: E402

Built = tuple[Callable[[], object], float, float]  # fn, FLOPs, minimal bytes


def _gpu(device: str) -> bool:
    return device.startswith("cuda")


def _set_fp32_matmul(tf32: bool) -> None:
    """TF32 on/off for fp32 matmuls, through the newer API when this torch has it."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
    else:
        matmul.allow_tf32 = tf32


def build_copy(device: str) -> Built:
    """Device copy of 1 GiB (256 Mi fp32): 1 GiB read + 1 GiB written."""
    n = (1 << 28) if _gpu(device) else (1 << 22)
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    return (lambda: y.copy_(x)), 0.0, 2.0 * 4 * n


def build_add(device: str) -> Built:
    """c = a + b over 128 Mi fp32 (512 MiB each): 1.5 GiB moved, one FLOP per element."""
    n = (1 << 27) if _gpu(device) else (1 << 21)
    a, b = torch.randn(n, device=device), torch.randn(n, device=device)
    c = torch.empty_like(a)
    return (lambda: torch.add(a, b, out=c)), float(n), 3.0 * 4 * n


def build_softmax(device: str) -> Built:
    """Row softmax of 8192x4096 fp32: ~5 FLOP per element (max, sub, exp, sum, div)."""
    rows, cols = (8192, 4096) if _gpu(device) else (512, 1024)
    x = torch.randn(rows, cols, device=device)
    return (lambda: torch.softmax(x, -1)), 5.0 * rows * cols, 2.0 * 4 * rows * cols


def _build_sgemm(device: str, tf32: bool) -> Built:
    n = 4096 if _gpu(device) else 256
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    c = torch.empty(n, n, device=device)

    def fn() -> object:
        if _gpu(device):
            _set_fp32_matmul(tf32)  # a global flag: set on every call so the two rows differ
        return torch.mm(a, b, out=c)

    return fn, 2.0 * n**3, 3.0 * 4 * n * n


def build_sgemm_fp32(device: str) -> Built:
    """fp32 GEMM 4096^3 on CUDA cores (TF32 off)."""
    return _build_sgemm(device, tf32=False)


def build_sgemm_tf32(device: str) -> Built:
    """fp32 GEMM 4096^3 on TF32 tensor cores."""
    return _build_sgemm(device, tf32=True)


def build_bf16_gemm(device: str) -> Built:
    """bf16 GEMM 8192^3 on tensor cores (fp32 accumulation in cuBLAS)."""
    n = 8192 if _gpu(device) else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    return (lambda: torch.mm(a, b, out=c)), 2.0 * n**3, 3.0 * 2 * n * n


def build_triton_add(device: str) -> Built:
    """A Triton vector add over 64 Mi fp32 (768 MiB moved)."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    if not _gpu(device):
        raise RuntimeError("Triton kernels need a CUDA device")
    n = 1 << 26
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    out = torch.empty_like(x)
    grid = (triton.cdiv(n, 1024),)
    return (lambda: add_kernel[grid](x, y, out, n, BLOCK=1024)), float(n), 3.0 * 4 * n


def build_tiny_add(device: str) -> Built:
    """x + x over 1024 fp32: pure launch overhead."""
    x = torch.randn(1024, device=device)
    return (lambda: x + x), 1024.0, 2.0 * 4 * 1024


KERNELS: list[tuple[str, str, Callable[[str], Built]]] = [
    ("copy_1GiB", "memory-bound", build_copy),
    ("add_3x512MiB", "memory-bound", build_add),
    ("softmax_8192x4096", "memory-bound", build_softmax),
    ("sgemm_4096_fp32", "compute-bound", build_sgemm_fp32),
    ("sgemm_4096_tf32", "tensor-core", build_sgemm_tf32),
    ("bf16_gemm_8192", "tensor-core", build_bf16_gemm),
    ("triton_add_64M", "memory-bound", build_triton_add),
    ("tiny_add_1k", "launch-bound", build_tiny_add),
]


def _do_bench(fn: Callable[[], object], graph: bool) -> float | None:
    """triton's median in seconds, or None where triton/CUDA is missing."""
    try:
        import triton.testing as tt
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if graph:
        with torch.cuda.stream(torch.cuda.Stream()):
            return tt.do_bench_cudagraph(fn, return_mode="median") * 1e-3
    return tt.do_bench(fn, return_mode="median") * 1e-3


def _measure(
    fn: Callable[[], object], device: str, budget: TimingBudget, keep_samples: bool = False
) -> dict[str, Any]:
    r = time_kernel(fn, device=device, budget=budget)
    clocks = r.clocks or {}
    extra = {"samples_us": [round(x * 1e6, 4) for x in r.samples_s]} if keep_samples else {}
    return {
        **extra,
        "median_s": r.median_s,
        "rel_ci": r.stats.rel_ci_halfwidth,
        "iqr_s": r.stats.iqr_s,
        "n": r.stats.n,
        "stop": r.stop_reason,
        "wall_s": r.wall_s,
        "rounds": r.rounds,
        "calls_per_sample": r.calls_per_sample,
        "throttled": r.throttled_samples,
        "sm_mhz_mean": clocks.get("sm_mhz_mean"),
        "reasons": clocks.get("reasons_seen"),
        "device": r.device,
        "method": r.method,
        "flush_bytes": r.flush_bytes,
    }


def _rel_diff(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (a > 0 and b > 0):
        return None
    return abs(a - b) / ((a + b) / 2)


def run(out: Path, budget_s: float, sync_variant: bool) -> dict[str, Any]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict[str, Any]] = []
    fns: dict[str, Callable[[], object]] = {}
    for name, kind, build in KERNELS:
        modes = ["events", "graph"] if kind == "launch-bound" and _gpu(device) else ["events"]
        try:
            fn, flops, nbytes = build(device)
            fn()  # compile / load now, so no pass pays it
        except Exception as exc:  # e.g. no triton on this machine
            rows.append({"name": name, "kind": kind, "mode": "events", "skipped": repr(exc)[:200]})
            continue
        for mode in modes:
            key = f"{name}/{mode}"
            fns[key] = fn
            rows.append(
                {
                    "name": name,
                    "kind": kind,
                    "mode": mode,
                    "flops": flops,
                    "bytes": nbytes,
                    "key": key,
                }
            )
    if _gpu(device):
        torch.cuda.synchronize()
    live = [r for r in rows if "key" in r]

    def budget(row: dict[str, Any], sync: bool) -> TimingBudget:
        return TimingBudget(
            max_time_s=budget_s, cuda_graph=row["mode"] == "graph", sync_per_sample=sync
        )

    passes = [("A", False), ("dobench1", None), ("B", False), ("dobench2", None)]
    if sync_variant and _gpu(device):
        passes += [("syncA", True), ("syncB", True)]
    for label, sync in passes:
        for row in live:
            fn = fns[row["key"]]
            if sync is None:
                row[label] = _do_bench(fn, row["mode"] == "graph")
            else:
                row[label] = _measure(fn, device, budget(row, sync), keep_samples=label == "A")
    for row in live:
        a, b = row["A"]["median_s"], row["B"]["median_s"]
        row["ratio_vs_do_bench"] = a / row["dobench1"] if row.get("dobench1") else None
        row["rel_diff_AB"] = _rel_diff(a, b)
        row["rel_diff_do_bench"] = _rel_diff(row.get("dobench1"), row.get("dobench2"))
        if "syncA" in row:
            row["rel_diff_sync"] = _rel_diff(row["syncA"]["median_s"], row["syncB"]["median_s"])
            row["sync_vs_batched"] = row["syncA"]["median_s"] / a
        med = statistics.mean([a, b])
        row["achieved_tflops"] = row["flops"] / med / 1e12 if row["flops"] else None
        row["achieved_gbps"] = row["bytes"] / med / 1e9
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    result = {
        "device": torch.cuda.get_device_name(0) if _gpu(device) else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "budget_s": budget_s,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    return result


def _fmt(value: float | None, spec: str) -> str:
    """`format(value, spec)`, or a right-aligned "-" of the same width for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return format("-", ">" + spec.split(".")[0])
    return format(value, spec)


def print_table(result: dict[str, Any]) -> None:
    print(f"device: {result['device']}  torch {result['torch']}  budget {result['budget_s']} s")
    head = f"{'kernel':<20}{'mode':<7}{'median us':>11}{'do_bench':>10}{'ratio':>7}{'A-B %':>7}{'db %':>6}{'sync %':>7}{'s/b':>6}{'n':>6} {'stop':<11}{'wall s':>7}{'thr':>5}{'TF/s':>7}{'GB/s':>7}"
    print(head)
    for row in result["rows"]:
        if "skipped" in row:
            print(f"{row['name']:<20}{row['mode']:<7} skipped: {row['skipped'][:80]}")
            continue
        a = row["A"]
        print(
            f"{row['name']:<20}{row['mode']:<7}{a['median_s'] * 1e6:>11.2f}"
            f"{_fmt(row.get('dobench1') and row['dobench1'] * 1e6, '10.2f')}"
            f"{_fmt(row['ratio_vs_do_bench'], '7.3f')}{_fmt(row['rel_diff_AB'] and row['rel_diff_AB'] * 100, '7.2f')}"
            f"{_fmt(row['rel_diff_do_bench'] and row['rel_diff_do_bench'] * 100, '6.2f')}"
            f"{_fmt(row.get('rel_diff_sync') and row['rel_diff_sync'] * 100, '7.2f')}"
            f"{_fmt(row.get('sync_vs_batched'), '6.3f')}{a['n']:>6} {a['stop']:<11}{a['wall_s']:>7.2f}"
            f"{a['throttled']:>5}{_fmt(row['achieved_tflops'], '7.1f')}{row['achieved_gbps']:>7.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--budget", type=float, default=2.0, help="max_time_s per measurement")
    parser.add_argument(
        "--no-sync-variant", action="store_true", help="skip the sync_per_sample passes"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = run(args.out, args.budget, not args.no_sync_variant)
    print_table(result)
    print(f"total {time.perf_counter() - started:.1f} s; wrote {args.out / 'timing.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
