"""Why does an 8192^3 bf16 GEMM time differently in different processes? (H200)

Runs N fresh processes; each builds the same inputs, records which cuBLAS kernel runs
(torch.profiler), times it with the plugin (`time_kernel`) and with do_bench, and reads the
NVML clocks/throttle summary the plugin records. Prints one row per process.

    python bench/trials/gemm_repeatability.py [--processes 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, torch
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
torch.manual_seed(0)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
fn = lambda: torch.mm(a, b)
fn(); torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    fn(); torch.cuda.synchronize()
names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
res = time_kernel(fn, device="cuda", budget=TimingBudget(max_time_s=2.0, warmup_ms=WARMUP_MS, min_samples=MIN_SAMPLES))
from triton.testing import do_bench
db = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e-3
print("RESULT", json.dumps({"kernels": names, "median_s": res.stats.median_s, "n": res.stats.n,
    "rel_ci": res.stats.rel_ci_halfwidth, "do_bench_s": db, "clocks": res.clocks,
    "throttled": res.throttled_samples}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--min-samples", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for i in range(args.processes):
        child = CHILD.replace("WARMUP_MS", repr(args.warmup_ms))
        child = child.replace("MIN_SAMPLES", repr(args.min_samples))
        proc = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=300
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            rows.append({"process": i, "error": proc.stderr[-800:]})
            continue
        row = json.loads(line[len("RESULT ") :])
        row["process"] = i
        rows.append(row)
        clocks = row.get("clocks") or {}
        print(
            f"process {i}: median {row['median_s'] * 1e6:8.1f} us (n={row['n']}, ci {row['rel_ci']:.2%}), "
            f"do_bench {row['do_bench_s'] * 1e6:8.1f} us, throttled samples {row['throttled']}, "
            f"kernel {row['kernels']}, clocks {json.dumps(clocks)[:300]}"
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gemm_repeatability.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
