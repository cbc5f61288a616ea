"""Where one evaluation's checks phase spends its seconds, step by step, on the CPU or a GPU.

    python bench/optimizer_checks_split.py --rows 4096 --cols 32768 --candidate functional
    python bench/optimizer_checks_split.py --device cuda --rows 4096 --cols 393216  # 23_Softmax

Runs the worker's checks (`harness._Pipeline`: the correctness trials, the in-place call, the
second shape and the call after timing; not the timing itself) in this process on a softmax
problem, and the judge's side of every handed-over output right where the worker would wait
for it (`judge._Reference.output` and `measurement.verdict`, as `judge.judge` runs them). Each
step's functions are wrapped with a timer, so the table says what the seconds went to: the
inputs made, the sealing, the reference's calls, the float64 truth, the candidate's calls,
the digests, the bitwise and tolerance comparisons, the copy handed over, and the judge's
own inputs, reference calls, truth and comparisons. What this does not count: the sandbox's
start, the processes' hand-over messages (descriptors on a socket) and the timing phase.
Steps nest (a reference call inside the cache check's remake), so the column "self" is a
step's own time without the steps inside it; the total is the phases' wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROBLEM = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
"""

CANDIDATES = {
    "functional": "return torch.nn.functional.softmax(x, dim=-1)",
    "logexp": "return torch.log_softmax(x, dim=1).exp()",
}


class Steps:
    """Seconds per step name, total and self (less the steps that ran inside it)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.own: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.each: dict[str, list[float]] = defaultdict(list)
        self._stack: list[list[float]] = []
        self.side = "worker"
        # On a GPU a step's work may still run when its call returns: each step ends with a
        # synchronize, so its seconds are its own and not the next step's.
        self.synchronize: Any = None

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        name = f"{self.side}: {name}"
        self._stack.append([0.0])
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            spent = time.perf_counter() - started
            inner = self._stack.pop()[0]
            if self._stack:
                self._stack[-1][0] += spent
            self.total[name] += spent
            self.own[name] += spent - inner
            self.calls[name] += 1
            self.each[name].append(round(spent, 2))

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.step(name):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)


def instrument(steps: Steps) -> None:
    import pytest_kernelpro.optimize.sandbox.harness as harness
    from pytest_kernelpro.optimize.sandbox import checks, input_handles, judge, measurement

    steps.wrap(measurement, "make_inputs", "inputs made (the problem's get_inputs)")
    steps.wrap(input_handles.SealedInputs, "__init__", "inputs sealed (memfd copy)")
    steps.wrap(harness, "clone_inputs", "input copies (clone_inputs)")
    steps.wrap(input_handles, "clone_inputs", "input copies (clone_inputs)")
    steps.wrap(measurement, "run_reference", "reference call")
    steps.wrap(measurement, "find_truth", "float64 truth (re-run, errors)")
    steps.wrap(harness._Pipeline, "run_candidate", "candidate call (guards, poisoning)")
    steps.wrap(checks, "digest", "output digest (sha256)")
    steps.wrap(checks, "same_values", "bitwise comparison (same_values)")
    steps.wrap(checks, "shares_storage", "aliasing check")
    steps.wrap(measurement, "verdict", "tolerance comparison (verdict)")
    steps.wrap(judge, "save_output", "output handed over (sealed copy)")
    steps.wrap(harness._Pipeline, "check", "phase: correctness + in-place")
    steps.wrap(harness._Pipeline, "shapes", "phase: second shape")


def _handed_copy(torch: Any, name: str, leaf: Any) -> Any:
    """One leaf as the judge maps it: a sealed memfd copy (`handles._sealed_copy`)."""
    from pytest_kernelpro.optimize.sandbox.handles import _sealed_copy
    from pytest_kernelpro.optimize.sandbox.input_handles import _read_only

    fd = _sealed_copy(torch, f"kernelpro-{name}", leaf)
    try:
        return _read_only(torch, fd, leaf)
    finally:
        os.close(fd)


def run(
    rows: int, cols: int, candidate: str, threads: int, device: str, worker_truth: bool = False
) -> dict[str, Any]:
    import torch

    from pytest_kernelpro.optimize.sandbox import checks, handles, harness, judge, measurement

    steps = Steps()
    if device.startswith("cuda"):
        steps.synchronize = torch.cuda.synchronize
    instrument(steps)
    reference = PROBLEM.format(rows=rows, cols=cols)
    body = CANDIDATES[candidate]
    source = (
        "import torch\nfrom torch import nn\n\n\nclass ModelNew(nn.Module):\n"
        f"    def forward(self, x):\n        {body}\n"
    )
    task = {"reference": reference, "candidate": source, "device": device, "seed": 42,
            "correct_trials": 3, "cpu_threads": threads}  # fmt: skip
    ref = judge._Reference(task)
    required = dict(judge.required_outputs(task))
    pipeline = harness._Pipeline(task, lambda phase: None)

    # The judge's first output and truth, made before the worker's first call and told to it
    # (`judge.judge`'s `tell_truth`, `harness._Pipeline.judge_truth`); `worker_truth`: the
    # worker finds its own instead, as without a judge beside it.
    made_ahead: dict[str, Any] = {}
    take_judges_truth = harness._Pipeline.judge_truth

    def judge_truth() -> bool:
        if worker_truth:
            return False
        steps.side = "judge"
        try:
            with steps.step("reference output (inputs, call, truth on the first)"):
                made_ahead["trial-1"] = ref.output(required["trial-1"])
            told = json.loads(json.dumps(measurement.truth_payload(ref.rule, ref.worker_paths)))
        finally:
            steps.side = "worker"
        with (
            mock.patch.object(handles, "await_truth", return_value=told),
            mock.patch.dict(os.environ, {handles.HANDLE_FD_ENV: "bench"}),
        ):
            return take_judges_truth(pipeline)

    def handed_over(label: str, out: Any) -> str | None:
        """The worker's hand-over (one sealed copy of each leaf) and the judge's check of it,
        as the worker waits for it."""
        name = judge.output_name(label)
        if name is None:
            return None
        with steps.step("output handed over (sealed copy)"):
            held = [_handed_copy(torch, name, leaf) for leaf in checks.flatten(out)]
        steps.side = "judge"
        try:
            if name in made_ahead:
                expected = made_ahead.pop(name)
            else:
                with steps.step("reference output (inputs, call, truth on the first)"):
                    expected = ref.output(required[name])
            decided = measurement.verdict(torch, held, expected, ref.rule)
            if not decided.ok:
                raise SystemExit(f"the judge refused {name}: {decided.failure}")
        finally:
            steps.side = "worker"
        return None

    pipeline.save_output = handed_over  # type: ignore[method-assign]
    pipeline.judge_truth = judge_truth  # type: ignore[method-assign]
    started = time.perf_counter()
    with steps.step("phase: build"):
        pipeline.build()
    pipeline.check()
    pipeline.shapes()
    with steps.step("phase: after timing"):
        pipeline.check_call(functools.partial(pipeline.inputs, pipeline.seed + 301), "after timing")
    wall = time.perf_counter() - started
    return {
        "rows": rows, "cols": cols, "candidate": candidate, "threads": threads, "device": device,
        "truth": "worker" if worker_truth else "judge's, told",
        "wall_s": round(wall, 2), "load": [round(x, 2) for x in os.getloadavg()],
        "steps": {
            name: {"total_s": round(steps.total[name], 2), "self_s": round(steps.own[name], 2),
                   "calls": steps.calls[name], "each_s": steps.each[name]}
            for name in sorted(steps.total, key=lambda n: -steps.own[n])
        },
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=32768)
    parser.add_argument("--candidate", choices=sorted(CANDIDATES), default="functional")
    # The optimizer's CPU tasks run on the gate's thread policy: one thread unless the user
    # sets kernelpro_cpu_threads (`optimize/loop/compose.py`).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU path")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--worker-truth", action="store_true", help="the worker finds its own truth (no judge's)"
    )
    args = parser.parse_args()
    data = run(args.rows, args.cols, args.candidate, args.threads, args.device, args.worker_truth)
    print(
        f"{data['rows']}x{data['cols']} {data['candidate']}: {data['wall_s']} s, load {data['load']}"
    )
    print(f"  {'step':62} {'self s':>8} {'total s':>8} {'calls':>6}")
    for name, row in data["steps"].items():
        print(
            f"  {name:62} {row['self_s']:>8} {row['total_s']:>8} {row['calls']:>6}  {row['each_s']}"
        )
    if args.out:
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
