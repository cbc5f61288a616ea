"""Is the CPU timer's time budget honoured? wall time of `time_kernel` / `max_time_s`.

Kernels of about 20 µs, 0.3 ms and 3 ms per call (busy-spins, so the per-call time does not
depend on the cache), each with the flush on and off, at budgets of 0.1, 0.5, 1 and 2 s.
The flushed cases pay the real flush (last-level cache plus L2 of this CPU) before every
sample. Prints one row per case and writes JSON.

    python bench/trials/cpu_budget.py --out bench/results/raw/2026-12-01-cpu-budget-v2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_kernelpro.measure.timing import TimingBudget, cpu_flush_bytes, time_kernel  # noqa: E402


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print(f"flush bytes {cpu_flush_bytes() / 2**20:.1f} MiB")
    # The flush buffer is allocated once per process, outside the budget (its page faults
    # would otherwise land on the first kernel only): allocate it before the cases, and
    # report what that took.
    t0 = time.perf_counter()
    time_kernel(lambda: None, device="cpu", budget=TimingBudget(max_time_s=0.01, cpu_flush="on"))
    alloc_s = time.perf_counter() - t0
    print(f"first flushed timing in this process (buffer allocation included): {alloc_s:.3f} s")
    for budget_s in (0.1, 0.5, 1.0, 2.0):
        for call_s in (20e-6, 3e-4, 3e-3):
            for flush in ("on", "off"):
                budget = TimingBudget(max_time_s=budget_s, warmup_ms=300.0, cpu_flush=flush)
                r = time_kernel(lambda c=call_s: spin(c), device="cpu", budget=budget)
                row = {"budget_s": budget_s, "call_s": call_s, "flush": flush,
                       "wall_s": r.wall_s, "ratio": r.wall_s / budget_s, "n": r.stats.n,
                       "stop": r.stop_reason, "warmup_runs": r.warmup_runs,
                       "oversubscribed": r.oversubscribed, "budget_note": r.budget_note}  # fmt: skip
                rows.append(row)
                print(f"budget {budget_s:4.1f} s  call {call_s * 1e6:6.0f} us  flush {flush:3}  "
                      f"wall {r.wall_s:6.3f} s  ratio {row['ratio']:5.2f}  n={r.stats.n:5}  "
                      f"{r.stop_reason}  oversubscribed={r.oversubscribed}")  # fmt: skip
    worst = max(r["ratio"] for r in rows)
    print(f"worst wall/budget {worst:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {os.cpu_count()} CPUs",
            "flush_bytes": cpu_flush_bytes(), "first_flushed_timing_s": alloc_s,
            "loadavg": os.getloadavg(), "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
