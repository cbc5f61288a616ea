"""One evaluation's memory on the CPU, candidate by candidate, with no run timeout in the way:
the five replayed candidates of `optimizer_handles.py` (four correct PyTorch forms, one wrong)
evaluated one after the other by the sandbox's evaluator itself (`SandboxEvaluator`: the
sandboxed worker, the judge beside it, the outputs handed over by handle), not through the
optimize session.

    python bench/evaluation_peaks.py --rows 4096 --cols 32768 --out OUT.jsonl

Why beside `optimizer_handles.py`: on a loaded machine a large evaluation there passes the
sandbox's default run timeout (120 s) and is killed before its timing phase, so its peak is
not the evaluation's. Here the run timeout is `--run-timeout` and the timing budget short (the
peaks are the copies held, not the samples taken). Per candidate: its status, wall, the
watchdog's peak of the worker and the judge together (`both_peak_mb`) against the problem's
footprint (input + output of one call), where that peak was (`both_peak_at`) and each
process's own peak. One JSON line per candidate goes to OUT; a table is printed.

Beside the watchdog's resident sums, a sampler of its own (`--pss-every`, seconds; 0: off)
reads every process under this one: its resident set (`VmRSS`) and its proportional set size
(`Pss` of `/proc/PID/smaps_rollup`: a page mapped by k processes counts 1/k, so the torch
library pages the worker and the judge both map count once between them). Per sample it
sums the two largest processes (at an evaluation's peak, the worker and the judge; idle
standbys and wrappers are far smaller), and keeps the largest resident sum with the
proportional sum of that moment, and the largest proportional sum (`top2_*`). A reading, not
a rule: the watchdog's limits and refusals read resident sets. A process whose smaps_rollup
cannot be read counts its resident set as its Pss (`pss_unread` counts them). One
smaps_rollup read of a 2.3 GB process took 77 ms here: the sampler is slow by design.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from optimizer_handles import PROBLEM, REPLIES  # noqa: E402


def _kib_field(path: str, name: str) -> float | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProportionalSampler(threading.Thread):
    """The module doc's sampler: every `every_s`, each process under this one, its resident
    set and proportional set size (MiB); the largest two processes' sums kept."""

    def __init__(self, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.done = threading.Event()
        self.reset()

    def reset(self) -> None:
        self.rss_peak, self.pss_at_rss_peak, self.pss_peak, self.pss_unread = 0.0, 0.0, 0.0, 0
        self.samples = 0

    def sample(self) -> None:
        from pytest_kernelpro.optimize.sandbox.processes import children

        found, todo = [], children(os.getpid())
        while todo:
            pid = todo.pop()
            todo += children(pid)
            rss = _kib_field(f"/proc/{pid}/status", "VmRSS")
            if rss is None:
                continue
            pss = _kib_field(f"/proc/{pid}/smaps_rollup", "Pss")
            if pss is None:
                self.pss_unread += 1
            found.append((rss, rss if pss is None else pss))
        top = sorted(found, reverse=True)[:2]
        rss_sum, pss_sum = sum(r for r, _ in top), sum(p for _, p in top)
        if rss_sum > self.rss_peak:
            self.rss_peak, self.pss_at_rss_peak = rss_sum, pss_sum
        self.pss_peak = max(self.pss_peak, pss_sum)
        self.samples += 1

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            self.sample()


def candidate_source(body: str) -> str:
    return (
        "import torch\nfrom torch import nn\n\n\nclass ModelNew(nn.Module):\n"
        f"    def forward(self, x):\n        {body}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=32768)
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("--max-time", type=float, default=0.5, help="timing budget, seconds")
    parser.add_argument("--label", default="")
    parser.add_argument("--pss-every", type=float, default=1.0, help="seconds; 0: no sampler")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--memory-limit-mb", type=int, default=None, help="default: the sandbox's")
    parser.add_argument("--first", type=int, default=len(REPLIES), help="candidates evaluated")
    args = parser.parse_args()

    from pytest_kernelpro.optimize.sandbox.evaluator import (
        KernelBenchTask,
        SandboxEvaluator,
        SandboxLimits,
    )
    from pytest_kernelpro.optimize.search.interfaces import Candidate

    footprint_mb = 2 * args.rows * args.cols * 4 / 2**20  # input + output, fp32
    task = KernelBenchTask(
        PROBLEM.format(rows=args.rows, cols=args.cols),
        name=f"softmax_{args.rows}x{args.cols}",
        device="cpu",
        timing={"max_time_s": args.max_time},
        cpu_threads=1,
    )
    limits = SandboxLimits(build_timeout_s=600.0, run_timeout_s=args.run_timeout)
    if args.memory_limit_mb:  # the size needs more than half this machine's memory
        limits = dataclasses.replace(limits, memory_limit_mb=args.memory_limit_mb)
    evaluator = SandboxEvaluator(task, limits)
    rows: list[dict[str, Any]] = []
    sampler = ProportionalSampler(args.pss_every) if args.pss_every > 0 else None
    if sampler is not None:
        sampler.start()
    try:
        for strategy, body in REPLIES[: args.first]:
            if sampler is not None:
                sampler.reset()
            load_before = os.getloadavg()
            started = time.perf_counter()
            ev = evaluator.evaluate(Candidate(candidate_source(body)))
            wall = time.perf_counter() - started
            metrics = ev.metrics
            row = {
                "label": args.label,
                "shape": [args.rows, args.cols],
                "footprint_mb": footprint_mb,
                "strategy": strategy,
                "status": ev.status,
                "reason": (ev.reason or "")[:200],
                "wall_s": round(wall, 2),
                "both_peak_mb": metrics.get("both_peak_mb"),
                "both_x_footprint": round(
                    float(metrics.get("both_peak_mb") or 0) / footprint_mb, 3
                ),
                "both_peak_at": metrics.get("both_peak_at"),
                "worker_peak_mb": metrics.get("worker_peak_mb"),
                "judge_peak_mb": metrics.get("judge_peak_mb"),
                "top2_rss_peak_mb": round(sampler.rss_peak, 1) if sampler else None,
                "top2_pss_at_rss_peak_mb": round(sampler.pss_at_rss_peak, 1) if sampler else None,
                "top2_pss_peak_mb": round(sampler.pss_peak, 1) if sampler else None,
                "top2_pss_peak_x_footprint": (
                    round(sampler.pss_peak / footprint_mb, 3) if sampler else None
                ),
                "pss_samples": sampler.samples if sampler else 0,
                "pss_unread": sampler.pss_unread if sampler else 0,
                "wall_split": metrics.get("wall_split"),
                "phases": metrics.get("phases"),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
            rows.append(row)
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            at = row["both_peak_at"] or {}
            print(
                f"{strategy[:40]:40} {row['status']:8} {wall:7.1f} s  both {row['both_peak_mb']} MiB "
                f"({row['both_x_footprint']}x) at {at.get('worker_phase')}: "
                f"{at.get('worker_mb')} + {at.get('judge_mb')}  load {row['load_before'][0]}; "
                f"sampled top two: RSS {row['top2_rss_peak_mb']} (PSS then "
                f"{row['top2_pss_at_rss_peak_mb']}), PSS peak {row['top2_pss_peak_mb']} "
                f"({row['top2_pss_peak_x_footprint']}x), {row['pss_unread']} unread",
                flush=True,
            )
    finally:
        if sampler is not None:
            sampler.done.set()
        evaluator.close()


if __name__ == "__main__":
    main()
