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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from optimizer_handles import PROBLEM, REPLIES  # noqa: E402


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
    parser.add_argument("--out", required=True, type=Path)
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
    evaluator = SandboxEvaluator(task, limits)
    rows: list[dict[str, Any]] = []
    try:
        for strategy, body in REPLIES:
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
                f"{at.get('worker_mb')} + {at.get('judge_mb')}  load {row['load_before'][0]}",
                flush=True,
            )
    finally:
        evaluator.close()


if __name__ == "__main__":
    main()
