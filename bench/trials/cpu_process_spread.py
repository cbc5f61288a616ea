"""How far unchanged CPU kernels' on-CPU medians move between processes, and what the CPU
gate's rule (gate/cpu_anchor.py, before its fresh-process confirmation) makes of it.

Each "session" is a fresh process that times eight kernels with the plugin's CPU timer
(`time_cpu`, budget 1 s, the CPU anchor on, the default cache flush): a 1M-element add, a 4M
sum, a cold 64x64 matmul+tanh, a 256^3 matmul and the same matmul done twice (`mm256x2`, the
"2x" kernel), a 2048x1024 bias+gelu, a 256x1024 softmax and a 2048^2 matvec. Sessions run
`--rounds` times in each condition: "quiet" (nothing of ours beside it), "busy" (two
`while True: pass` processes) and "memhog" (one process copying 512 MB arrays in a loop).
`--plain-allocator` sets glibc's mmap threshold back to its dynamic default in the sessions
(the timer's `steady_allocator` is made a no-op), for the before/after comparison.

Then every ordered pair of sessions of the same condition is compared with
`compare_cpu_anchored` at a 5% threshold: unchanged kernels beyond the tolerance are false
alarms, `mm256x2` against the baseline's `mm256` must be beyond it.

    python bench/trials/cpu_process_spread.py --out /tmp/spread [--plain-allocator]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SESSION = r"""
import json, sys
import torch
import torch.nn.functional as F
if sys.argv[2] == "plain":
    from pytest_kernelpro.measure.timing import cpu
    cpu.steady_allocator = lambda: "plain (dynamic mmap threshold)"
from pytest_kernelpro.measure.timing.budget import TimingBudget
from pytest_kernelpro.measure.timing.cpu import time_cpu

torch.set_num_threads(1)
g = lambda: torch.Generator().manual_seed(0)
a1, b1 = torch.randn(1_000_000, generator=g()), torch.randn(1_000_000, generator=g())
x4 = torch.randn(4_000_000, generator=g())
s64a, s64b = torch.randn(64, 64, generator=g()), torch.randn(64, 64, generator=g())
m256a, m256b = torch.randn(256, 256, generator=g()), torch.randn(256, 256, generator=g())
bg, bb = torch.randn(2048, 1024, generator=g()), torch.randn(1024, generator=g())
sm = torch.randn(256, 1024, generator=g())
mv, vv = torch.randn(2048, 2048, generator=g()), torch.randn(2048, generator=g())


def mm2():
    m256a @ m256b
    return m256a @ m256b


KERNELS = {
    "add_1m": (lambda: a1 + b1, 8e6),
    "sum_4m": (lambda: x4.sum(), 16e6),
    "tanh64": (lambda: torch.tanh(s64a @ s64b), 32e3),
    "mm256": (lambda: m256a @ m256b, 512e3),
    "mm256x2": (mm2, 512e3),
    "bias_gelu": (lambda: F.gelu(bg + bb), 8.4e6),
    "softmax": (lambda: torch.softmax(sm, -1), 1e6),
    "matvec": (lambda: mv @ vv, 16.8e6),
}
out = {}
for name, (fn, working_set) in KERNELS.items():
    budget = TimingBudget(max_time_s=1.0, clock_anchor="on", working_set_bytes=int(working_set))
    result = time_cpu(fn, budget)
    anchor = result.anchor
    out[name] = {
        "kernel_s": anchor["kernel_s"],
        "anchor_s": anchor["anchor_s"],
        "allocator": anchor.get("allocator"),
        "busy": bool(result.cpu_load["oversubscribed"]),
        "run_queue_share": anchor["run_queue_share"],
    }
json.dump(out, open(sys.argv[1], "w"))
"""

HOGS = {
    "quiet": [],
    "busy": ["while True: pass", "while True: pass"],
    "memhog": [
        "import numpy as np\na = np.ones(64 * 2**20); b = np.empty_like(a)\n"
        "while True: np.copyto(b, a)"
    ],
}


def run_sessions(out: Path, rounds: int, allocator: str) -> dict[str, dict]:
    sessions = {}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for round_ in range(1, rounds + 1):
        for condition, hogs in HOGS.items():
            procs = [subprocess.Popen([sys.executable, "-c", code]) for code in hogs]
            try:
                time.sleep(1.0 if procs else 0.0)
                path = out / f"{condition}_{round_}.json"
                subprocess.run(
                    [sys.executable, "-c", SESSION, str(path), allocator],
                    check=True,
                    env=env,
                    timeout=600,
                )
            finally:
                for proc in procs:
                    proc.kill()
                    proc.wait()
            sessions[f"{condition}_{round_}"] = json.loads(path.read_text())
            print(f"{time.strftime('%H:%M:%S')} {condition} {round_} done", flush=True)
    return sessions


def analyse(sessions: dict[str, dict]) -> dict:
    import numpy as np

    from pytest_kernelpro.gate.cpu_anchor import CpuAnchorSide, compare_cpu_anchored

    def side(data: dict) -> CpuAnchorSide:
        busy = "busy" if data["busy"] else None
        return CpuAnchorSide("anchor", tuple(data["kernel_s"]), tuple(data["anchor_s"]), busy)

    names = [k for k in next(iter(sessions.values())) if k != "mm256x2"]
    false_alarms, pairs, caught, doubled = [], 0, 0, []
    for now, base in itertools.permutations(sessions, 2):
        if now.split("_")[0] != base.split("_")[0]:
            continue
        for name in names:
            facts = compare_cpu_anchored(
                side(sessions[now][name]), side(sessions[base][name]), 0.05
            )
            pairs += 1
            if abs(facts.change) > facts.tolerance:
                false_alarms.append(
                    (name, base, now, round(facts.change, 3), round(facts.tolerance, 3))
                )
        facts = compare_cpu_anchored(
            side(sessions[now]["mm256x2"]), side(sessions[base]["mm256"]), 0.05
        )
        caught += facts.change > facts.tolerance
        doubled.append((base, now, round(facts.change, 3), round(facts.tolerance, 3)))
    medians = {
        s: {k: round(float(np.median(v["kernel_s"])) * 1e6) for k, v in d.items()}
        for s, d in sessions.items()
    }
    return {
        "unchanged_pairs": pairs,
        "false_alarms": false_alarms,
        "doubled_pairs": len(doubled),
        "doubled_caught": caught,
        "doubled": doubled,
        "medians_us": medians,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plain-allocator", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    allocator = "plain" if args.plain_allocator else "steady"
    sessions = run_sessions(args.out, args.rounds, allocator)
    summary = {"allocator": allocator, **analyse(sessions)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"allocator {allocator}: same-condition unchanged pairs {summary['unchanged_pairs']}, "
        f"beyond the tolerance {len(summary['false_alarms'])}; 2x caught "
        f"{summary['doubled_caught']}/{summary['doubled_pairs']}"
    )
    for row in summary["false_alarms"]:
        print("  false alarm", row)
    for session, medians in summary["medians_us"].items():
        print(f"  {session:9} {medians}")


if __name__ == "__main__":
    main()
