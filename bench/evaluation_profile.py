"""Where one optimizer evaluation's time and host memory go, on the CPU: the sandbox worker's
pipeline (`harness._Pipeline`) and the judge (`judge.judge`) run in this process on a softmax
problem, with every step that makes inputs, runs the reference or the candidate, finds the
float64 truth, compares or times wrapped to count its calls and seconds, and a thread that
samples this process's resident memory every 5 ms (the peak, and which steps were running
when it was reached).

    python bench/evaluation_profile.py --rows 2048 --cols 32768 [--json OUT.jsonl] [--label L]

In-process, so no sandbox start and no handles (a checked output is kept as a copy, as the
pipeline does outside the sandbox): the worker's and the judge's own work, nothing else.
Footprint = one call's input + output (fp32). Peaks are above the resident size before the
first step (the interpreter and torch).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The problem and the candidate of the memory test (`tests/optimize/search/
# test_evaluation_memory.py`): a row softmax and a correct exp/sum form of it.
DATA = ROOT / "tests" / "data" / "search" / "cpu"
PROBLEM = (DATA / "softmax_rows.py").read_text(encoding="utf-8")
CANDIDATE = (DATA / "softmax_exp_sum.py").read_text(encoding="utf-8")
SIZE_LINE = "rows, cols = 16, 64"


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Profile:
    """Seconds and calls per wrapped step (inclusive), the resident peak and the steps
    running at it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[str] = []
        self.base = rss_bytes()
        self.peak = self.base
        self.peak_at: list[str] = []
        self.phase = "start"
        self.phase_peak: dict[str, int] = defaultdict(int)
        self.phase_started = time.perf_counter()
        self.phase_seconds: dict[str, float] = defaultdict(float)
        # Per step: the resident peak while it ran, above this process's start.
        self.step_peak: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            now = rss_bytes()
            self.phase_peak[self.phase] = max(self.phase_peak[self.phase], now - self.base)
            for label in list(self.stack):
                self.step_peak[label] = max(self.step_peak[label], now - self.base)
            if now > self.peak:
                self.peak, self.peak_at = now, list(self.stack)

    def progress(self, phase: str) -> None:
        now = time.perf_counter()
        self.phase_seconds[self.phase] += now - self.phase_started
        self.phase, self.phase_started = phase, now

    def stop(self) -> None:
        self.progress("end")
        self._stop.set()
        self._thread.join()

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        original = getattr(owner, name)
        label = label or name

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(label)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1
                self.stack.pop()

        setattr(owner, name, wrapper)


def profile(rows: int, cols: int, threads: int | None) -> dict[str, Any]:
    import torch

    from pytest_kernelpro.measure import correctness_check, output_rule
    from pytest_kernelpro.measure.timing import fresh_inputs
    from pytest_kernelpro.optimize.sandbox import checks, harness, input_handles, judge
    from pytest_kernelpro.optimize.sandbox import measurement as sandbox_measurement

    if threads:
        torch.set_num_threads(threads)
    prof = Profile()
    for owner, name, label in [
        (sandbox_measurement, "make_inputs", "make_inputs"),
        (sandbox_measurement, "find_truth", "truth (float64 re-run)"),
        (sandbox_measurement, "verdict", "compare (verdict)"),
        (sandbox_measurement, "time_call", "time_call"),
        (sandbox_measurement, "fresh_calls", "fresh_calls setup"),
        (checks, "same_values", "same_values"),
        (checks, "shares_storage", "shares_storage"),
        (input_handles.SealedInputs, "__init__", "seal inputs"),
        (input_handles.SealedInputs, "writable", "copy inputs (writable)"),
        (harness._Pipeline, "run_reference", "run_reference"),
        (harness._Pipeline, "run_candidate", "run_candidate"),
        (harness._Pipeline, "save_output", "hand over output"),
        (output_rule, "information_failure", "information check"),
        (correctness_check, "clone_inputs", "clone_inputs"),
        (fresh_inputs.FreshInputs, "drain", "timed-output checks"),
        (fresh_inputs, "kept_content", "kept content"),
    ]:
        prof.wrap(owner, name, label)
    task = {
        "reference": PROBLEM.replace(SIZE_LINE, f"rows, cols = {rows}, {cols}"),
        "candidate": CANDIDATE,
        "device": "cpu",
        "seed": 42,
        "correct_trials": 3,
        "timing": {"max_time_s": 0.5},
        "cpu_threads": threads or None,
    }
    started = time.perf_counter()
    result = harness.run_task(task, prof.progress)
    worker_s = time.perf_counter() - started
    prof.stop()
    worker = report(prof, worker_s)
    worker["status"] = result.get("status")
    worker["reason"] = result.get("reason")
    timing = result.get("timing") or {}
    worker["timed_calls"] = {
        side: (timing.get(side) or {}).get("samples") for side in ("reference", "candidate")
    }
    # The judge on the candidate's outputs, made again here (the in-process pipeline hands
    # nothing over): the candidate's form on each judged call's inputs.
    del result
    judge_prof = Profile()
    for owner, name, label in [
        (sandbox_measurement, "make_inputs", "make_inputs"),
        (sandbox_measurement, "find_truth", "truth (float64 re-run)"),
        (sandbox_measurement, "verdict", "compare (verdict)"),
        (sandbox_measurement, "time_call", "time_call"),
    ]:
        judge_prof.wrap(owner, name, label)
    ref_mod = {}
    exec(task["reference"], ref_mod)  # noqa: S102 - the bench's own problem
    outputs = {}
    for name, seed in judge.required_outputs(task):
        torch.manual_seed(seed)
        x = sandbox_measurement.make_inputs(_Module(ref_mod), seed, "cpu")[0]
        m = x.amax(dim=1, keepdim=True)  # the candidate's form: not bit-identical
        e = (x - m).exp_()
        outputs[name] = [e.div_(e.sum(dim=1, keepdim=True))]
        del m, e
        del x
    judge_prof.base = rss_bytes()
    started = time.perf_counter()
    verdict = judge.judge(task, outputs)
    judge_s = time.perf_counter() - started
    del outputs
    judge_prof.stop()
    judged = report(judge_prof, judge_s)
    judged["ok"] = verdict.get("ok")
    footprint = 2 * rows * cols * 4
    return {
        "shape": [rows, cols],
        "footprint_mb": round(footprint / 2**20, 1),
        "worker": worker,
        "judge": judged,
        "worker_peak_x": round(worker["peak_above_start_mb"] * 2**20 / footprint, 2),
        "judge_peak_x": round(judged["peak_above_start_mb"] * 2**20 / footprint, 2),
    }


class _Module:
    def __init__(self, namespace: dict[str, Any]) -> None:
        self.__dict__.update(namespace)


def report(prof: Profile, wall_s: float) -> dict[str, Any]:
    return {
        "wall_s": round(wall_s, 2),
        "peak_above_start_mb": round((prof.peak - prof.base) / 2**20, 1),
        "peak_in": prof.peak_at,
        "phases_s": {k: round(v, 2) for k, v in prof.phase_seconds.items() if v >= 0.005},
        "phase_peak_mb": {k: round(v / 2**20, 1) for k, v in prof.phase_peak.items()},
        "steps": {
            k: {
                "calls": prof.calls[k],
                "s": round(prof.seconds[k], 2),
                "peak_mb": round(prof.step_peak[k] / 2**20, 1),
            }
            for k in sorted(prof.seconds, key=lambda k: -prof.seconds[k])
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=32768)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load = os.getloadavg()
    data = profile(args.rows, args.cols, args.threads)
    data = {"label": args.label, "load_before": [round(x, 2) for x in load], **data}
    data["load_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(data, indent=1)
    print(text)
    if args.json is not None:
        with open(args.json, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
