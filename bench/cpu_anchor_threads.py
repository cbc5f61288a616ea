"""One-off: attacks on the CPU anchors through the real CPU timer, before and after the
guards (run once with `PYTHONPATH` at each checkout; results in
bench/results/2026-12-06-cpu-anchor-threads-cpu.md). The attack kernels are the tests'
(tests/measure/timing/cpu_anchor_attack_kernels.py, which says what each does).

    PYTHONPATH=CHECKOUT python bench/cpu_anchor_threads.py [--repeat 3] [--budget 1.0]
        [--only ATTACK ...]

Prints, per attack and repeat: refused (the refusal's first words) or the medians of the
kernel's on-CPU time, the GEMM anchor and the memory anchor, and the anchors' change against
the unattacked control of the same repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import pytest_kernelpro
from pytest_kernelpro.measure.timing import TimingBudget
from pytest_kernelpro.measure.timing.cpu import time_cpu
from pytest_kernelpro.measure.timing.fresh_inputs import DishonestTiming

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "measure" / "timing"))
import cpu_anchor_attack_kernels as attacks  # noqa: E402


def timed(fn: Callable[[], object], budget_s: float) -> dict[str, Any]:
    """One CPU timing with the anchors on: its medians, or the refusal."""
    budget = TimingBudget(max_time_s=budget_s, min_samples=20, clock_anchor="on")
    try:
        anchor = time_cpu(fn, budget).anchor
    except DishonestTiming as exc:
        return {"refused": str(exc)}
    assert anchor is not None
    return {
        "kernel_ms": anchor["kernel_median_s"] * 1e3,
        "gemm_ms": anchor["anchor_median_s"] * 1e3,
        "memory_ms": statistics.median(anchor["memory_s"]) * 1e3,
        "pairs": anchor["pairs"],
    }


def attack(name: str, budget_s: float) -> dict[str, Any]:
    kernel = attacks.kernel
    if name == "control":
        return timed(kernel, budget_s)
    if name in ("memory_thread", "compute_thread", "gil_hold", "gil_hold_lean"):
        attacker = {
            "memory_thread": attacks.memory_streamer,
            "compute_thread": attacks.compute_burner,
            "gil_hold": attacks.gil_holder,
            "gil_hold_lean": lambda: attacks.gil_holder(lean=True),
        }[name]()
        with attacks.switch_interval(3e-4 if name == "gil_hold" else 5e-4):
            with attacker.running():
                out = timed(attacker.wrap(kernel), budget_s)
        return {**out, "woken": attacker.woken, "attacker_cpu_ms": attacker.cpu_s * 1e3}
    if name == "patched_torch":
        calls: list[int] = []
        with attacks.patched_torch(calls):
            out = timed(kernel, budget_s)
        return {**out, "patched_calls": len(calls)}
    with attacks.bigger_buffer():
        return timed(kernel, budget_s)


ATTACKS = ("control", "memory_thread", "compute_thread", "gil_hold", "gil_hold_lean")
ATTACKS += ("patched_torch", "bigger_buffer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--only", nargs="*", default=ATTACKS[1:], help="attacks after control")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"pytest_kernelpro from {Path(pytest_kernelpro.__file__).parent}", flush=True)
    for repeat in range(args.repeat):
        control: dict[str, Any] = {}
        for name in ("control", *args.only):
            out = attack(name, args.budget)
            if name == "control":
                control = out
            if "refused" in out:
                line = f"REFUSED: {out['refused'][:140]}"
            else:
                moved = ""
                if "gemm_ms" in control:
                    moved = (
                        f" | gemm {out['gemm_ms'] / control['gemm_ms'] - 1:+.0%}"
                        f" memory {out['memory_ms'] / control['memory_ms'] - 1:+.0%}"
                        " vs control"
                    )
                line = (
                    f"kernel {out['kernel_ms']:.3f} ms, gemm {out['gemm_ms']:.3f} ms, "
                    f"memory {out['memory_ms']:.3f} ms, {out['pairs']} pairs{moved}"
                )
            extra = {k: v for k, v in out.items() if k in ("woken", "attacker_cpu_ms", "patched_calls")}
            print(f"repeat {repeat} {name:15s} {line} {extra or ''}", flush=True)


if __name__ == "__main__":
    main()
