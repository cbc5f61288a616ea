"""CPU timing at 1 and 2 torch threads, with and without a CPU-heavy process beside it.

Why the CPU thread policy (measure/timing/cpu.py) times with one thread by default. Run:
`python bench/trials/cpu_threads.py [--out bench/results/raw/cpu-threads.json]`. Each case times a
256x1024 fp32 softmax and a 256^3 matmul with the plugin's CPU timer (0.5 s budget) and
records the median, the sample count and the CPU load the timer measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from pytest_kernelpro.measure.timing import TimingBudget, time_kernel  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    x = torch.randn(256, 1024)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    kernels = {"softmax 256x1024": lambda: torch.softmax(x, -1), "matmul 256^3": lambda: a @ b}
    budget = TimingBudget(max_time_s=0.5, warmup_ms=20)
    rows = []
    for hog in (False, True):
        proc = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if hog else None
        time.sleep(0.5 if hog else 0.0)
        try:
            for threads in (1, 2, 1, 2):
                torch.set_num_threads(threads)
                for name, fn in kernels.items():
                    r = time_kernel(fn, device="cpu", budget=budget)
                    load = r.cpu_load or {}
                    rows.append({"hog": hog, "threads": threads, "kernel": name,
                                 "median_s": r.median_s, "n": r.stats.n,
                                 "others_cores": load.get("others_cores"),
                                 "oversubscribed": load.get("oversubscribed")})  # fmt: skip
                    print(
                        f"hog={hog!s:5} threads={threads} {name:18} median "
                        f"{r.median_s * 1e6:9.0f} us  n={r.stats.n:4}  others "
                        f"{load.get('others_cores')} cores  oversubscribed={load.get('oversubscribed')}"
                    )
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {os.cpu_count()} CPUs", "torch": torch.__version__,
            "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
