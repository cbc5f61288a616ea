"""One-off: where a sandbox evaluation of KernelBench 23_Softmax holds its GPU memory.

Runs, each in a fresh process, the package's own code of two moments an H100 search showed
above 3x the footprint (per-process `nvidia-smi`): the judge's first output with its float64
truth (`judge._Reference.output`), and the worker's timing phase (`harness._Pipeline.time`,
the candidate being the reference itself). Prints, in copies of one call's input (6 GiB),
the allocator's peak allocated and reserved bytes and the driver's used memory, under the
default allocator and under `expandable_segments`; for the worker's timing under the default
allocator, the live allocations at the allocated peak by where they were made.

    python bench/gpu_memory_phases.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REFERENCE = Path(__file__).with_name("kernelbench_level1") / "23_Softmax.py"


def task() -> dict[str, object]:
    source = REFERENCE.read_text(encoding="utf-8")
    return {
        "reference": source,
        "candidate": source + "\n\nclass ModelNew(Model):\n    pass\n",
        "seed": 42,
        "device": "cuda",
        "timing": {"max_time_s": 0.5, "warmup_ms": 50},
        "correct_trials": 3,
    }


def stats(torch: object, copy: int, moment: str) -> dict[str, object]:
    import torch as t

    t.cuda.synchronize()
    free, total = t.cuda.mem_get_info()
    row = {
        "moment": moment,
        "allocated": round(t.cuda.memory_allocated() / copy, 2),
        "peak_allocated": round(t.cuda.max_memory_allocated() / copy, 2),
        "peak_reserved": round(t.cuda.max_memory_reserved() / copy, 2),
        "device_used": round((total - free) / copy, 2),
    }
    print(json.dumps(row), flush=True)
    return row


def live_at_peak(snapshot: dict, copy: int) -> list[dict[str, object]]:
    """Replay the allocator's trace: the live blocks at the largest allocated moment, by the
    innermost frame of the package (or the bench) that made them."""
    trace = snapshot["device_traces"][0]
    live: dict[int, tuple[int, str]] = {}
    used = best = 0
    best_live: dict[int, tuple[int, str]] = {}
    for event in trace:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            frames = event.get("frames") or []
            where = next(
                (
                    f"{Path(f['filename']).name}:{f['line']} {f['name']}"
                    for f in frames
                    if "pytest_kernelpro" in f["filename"] or "bench" in f["filename"]
                ),
                "?",
            )
            live[addr] = (size, where)
            used += size
            if used > best:
                best, best_live = used, dict(live)
        elif action in ("free_completed",) and addr in live:
            used -= live.pop(addr)[0]
    grouped: dict[str, float] = {}
    for size, where in best_live.values():
        grouped[where] = grouped.get(where, 0.0) + size / copy
    return [
        {"where": k, "copies": round(v, 3)}
        for k, v in sorted(grouped.items(), key=lambda kv: -kv[1])
        if v >= 0.01
    ]


def phase(which: str, out: Path) -> None:
    import torch

    from pytest_kernelpro.optimize.sandbox.harness import _Pipeline
    from pytest_kernelpro.optimize.sandbox.judge import _Reference

    copy = 4096 * 393216 * 4
    torch.cuda.init()
    stats(torch, copy, f"{which}: context")
    record = which == "worker_timing" and "expandable" not in os.environ.get(
        "PYTORCH_CUDA_ALLOC_CONF", ""
    )
    if which == "judge_truth":
        ref = _Reference(task())
        ref.truth_first = True
        kept = ref.output(ref.seed + 1)
        stats(torch, copy, "judge: first output and its truth made")
        del kept
    else:
        pipeline = _Pipeline(task(), lambda phase: None)
        pipeline.build()
        stats(torch, copy, "worker: built")
        torch.cuda.reset_peak_memory_stats()
        if record:
            torch.cuda.memory._record_memory_history(max_entries=500000)
        pipeline.time()
        stats(torch, copy, "worker: timed (the call after timing included)")
        if record:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            rows = live_at_peak(snap, copy)
            print(json.dumps({"live_at_allocated_peak": rows}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--phase")
    args = parser.parse_args()
    out = Path(args.out)
    if args.phase:
        phase(args.phase, out)
        return
    for alloc in ("", "expandable_segments:True"):
        for which in ("judge_truth", "worker_timing"):
            env = dict(os.environ)
            if alloc:
                env["PYTORCH_CUDA_ALLOC_CONF"] = alloc
            print(f"== {which} allocator={alloc or 'default'}", flush=True)
            subprocess.run(
                [sys.executable, __file__, "--phase", which, "--out", str(out)], env=env, check=False
            )


if __name__ == "__main__":
    main()
