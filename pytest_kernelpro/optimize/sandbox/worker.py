"""The sandbox worker process: evaluates one candidate and writes its result as JSON.

    python -m pytest_kernelpro.optimize.sandbox.worker --task TASK.json --result RESULT.json \
        --progress PROGRESS.log

The parent (`evaluator.SandboxEvaluator`) starts it in a new session (its own process
group) with a scrubbed environment, watches the progress file to time the build and the
run separately, and kills the whole group on a timeout or when its memory grows past the
limit. Inside, the worker turns core dumps off, installs faulthandler (a segfault prints a
Python traceback into the log), limits its address space on the CPU, runs
`harness.run_task` and exits with `os._exit` so that a corrupted CUDA context cannot hang
interpreter shutdown. No result file means the worker died: the parent classifies that.
This module imports nothing heavy at import time: the parent imports its phase names.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
from pathlib import Path
from typing import Any

# Clocks, the JSON encoder and the file functions kept before any candidate code runs
# (measure/bound.py, result_channel.py): a candidate that rebinds them cannot change what this
# worker writes.
from pytest_kernelpro.measure import bound
from pytest_kernelpro.optimize.sandbox.loader import add_session_path
from pytest_kernelpro.optimize.sandbox.result_channel import ResultChannel

# Phases before "built" count against the build timeout, the rest against the run timeout.
BUILD_PHASES = ("start", "import", "reference", "build")
RUN_PHASES = ("built", "correctness", "checks", "shapes", "timing", "timed", "done")


def _vm_size_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def limit_memory(limit_mb: int | None, cuda: bool) -> str:
    """No core dumps; on the CPU, cap the address space at current size + `limit_mb`.

    CUDA reserves far more virtual address space than it uses, so with CUDA the cap would
    break the driver: the parent's RSS watchdog and torch's OutOfMemoryError cover the GPU
    path instead. Returns what was applied (for the log).
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return "no resource module"
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not limit_mb or cuda:
        return "RLIMIT_AS not set" + (" (CUDA)" if cuda else "")
    current = _vm_size_bytes()
    if current is None:
        return "RLIMIT_AS not set (no /proc)"
    cap = current + int(limit_mb) * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return f"RLIMIT_AS={cap // (1024 * 1024)} MB"


def main(argv: list[str] | None = None) -> int:
    """Worker entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kernelpro.optimize.sandbox.worker")
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--progress", required=True, type=Path)
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)
    # The result channel is opened before the candidate's code runs.
    channel = ResultChannel(str(args.result))
    progress_file = open(args.progress, "a", encoding="utf-8")  # noqa: SIM115 - lives until exit
    clock = bound.monotonic

    def progress(phase: str) -> None:
        progress_file.write(f"{phase} {clock():.3f}\n")
        progress_file.flush()

    progress("start")
    task: dict[str, Any] = json.loads(args.task.read_text(encoding="utf-8"))
    add_session_path(task.get("sys_path") or ())
    if task.get("retime"):
        result = _retime_or_error(task, progress)
    else:
        result = _evaluate(task, progress)
    rebound = bound.binding_failure("in the worker")
    if rebound is not None and result.get("status") == "correct":
        # The kept functions wrote this result either way; a candidate that rebinds them
        # still cheats.
        bound.restore()
        result = {"status": "cheat", "reason": rebound}
    channel.write(result)
    sys.stdout.flush()
    sys.stderr.flush()
    progress_file.close()
    os._exit(0)


def _evaluate(task: dict[str, Any], progress: Any) -> dict[str, Any]:
    try:
        progress("import")
        import torch

        device = task.get("device", "auto")
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        sys.stderr.write(f"kernelpro worker: {limit_memory(task.get('memory_limit_mb'), cuda)}\n")
        from pytest_kernelpro.optimize.sandbox.harness import run_task

        result = run_task(task, progress)
    except MemoryError as exc:
        result = {"status": "run_error", "reason": f"out of memory: MemoryError: {exc}"}
    except Exception as exc:
        result = {"status": "run_error", "reason": f"worker error: {type(exc).__name__}: {exc}"}
    return result


def _retime_or_error(task: dict[str, Any], progress: Any) -> dict[str, Any]:
    try:
        return retime(task, progress)
    except Exception as exc:
        return {"status": "run_error", "reason": f"re-timing failed: {type(exc).__name__}: {exc}"}


RETIME_MAX_SAMPLES = 200  # the re-timing's sample cap
# The re-timing decides one thing: is the fresh median within the confirmation's tolerance
# (25% on a GPU, `optimize/sandbox/confirm.py`) of the search's? A median of tens of samples is good to
# a few percent, so the re-timing samples for at most this long (and never fewer than the
# task's min_samples), whatever the search's own per-kernel budget: a 6 ms GEMM took 200
# samples (1.3 s) under the 2 s default, 80 now.
RETIME_BUDGET_S = 0.5


def retime_budget(timing: dict[str, Any] | None) -> Any:
    """The task's budget read as the gate's timer reads it (its defaults and validation),
    its sampling capped at `RETIME_BUDGET_S` and `RETIME_MAX_SAMPLES`."""
    import dataclasses

    from pytest_kernelpro.measure.timing import TimingBudget

    budget = TimingBudget(**dict(timing or {}))
    return dataclasses.replace(
        budget,
        max_time_s=min(budget.max_time_s, RETIME_BUDGET_S),
        max_samples=max(budget.min_samples, min(budget.max_samples, RETIME_MAX_SAMPLES)),
    )


def retime(task: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Time the candidate again in a fresh process exactly as the search timed it: the gate's
    timer (`measure.timing.time_kernel`: its warm-up, cache flush, clocks kept before any
    candidate code ran and verified before and after every sample) on the search's timed call
    (`harness._Pipeline.fresh_candidate`: new input content before every call, outputs of
    calls chosen after they returned compared with the reference on that content). One
    implementation: a confirmation that disagrees with the search measured the kernel, not
    two methods. The reference runs once before the candidate's code (its reduced precision
    and its float64 truth calibrate the checks, as in the search); the output of one more call
    on inputs made before the candidate ran goes to the trusted judge. The statistics are
    computed by the parent from the raw samples.

    A check that fails or a rebound clock (`DishonestTiming`) is a cheat: the winner is
    disqualified with the timer's reason. What this cannot stop is code that rewrites this
    process's memory or its result file (every process the candidate runs in is its own): the
    profile's ncu kernel durations, taken by ncu's own process, are the cross-check for that
    (`confirm.py`)."""
    import torch

    from pytest_kernelpro.measure.correctness_check import clone_inputs
    from pytest_kernelpro.measure.timing import DishonestTiming, time_kernel
    from pytest_kernelpro.optimize.sandbox import judge
    from pytest_kernelpro.optimize.sandbox.harness import _Pipeline

    budget = retime_budget(task.get("timing"))
    pipeline = _Pipeline(task, progress)
    pipeline.build_reference()
    args = pipeline.inputs(pipeline.seed)
    final_args = pipeline.inputs(pipeline.seed + judge.RETIME_SEED_OFFSET)
    pipeline.run_reference(clone_inputs(torch, args))  # precision and truth, before the candidate
    pipeline.build_candidate()  # the candidate's code runs from here on
    progress("timing")
    with torch.no_grad():
        fresh = pipeline.fresh_candidate(args)
        try:
            result = time_kernel(None, device=str(pipeline.device), budget=budget, fresh=fresh)
        except DishonestTiming as exc:
            return {"status": "cheat", "reason": f"refused while re-timed: {exc}"}
        out = pipeline.new_model(*final_args)
    pipeline.sync()
    holder = [out]
    del out
    judge.save_output(judge.RETIMED, holder)
    progress("done")
    flushed = "cache flushed" if result.flushed_l2 else "no cache flush"
    return {
        "status": "correct",
        "timing": {
            "retimed": {
                "samples_s": list(result.samples_s),
                "samples": len(result.samples_s),
                "warmup_runs": result.warmup_runs,
                "method": f"the gate's timer ({result.method}), fresh inputs, {flushed}",
                "honesty": result.honesty,
            }
        },
    }


if __name__ == "__main__":
    sys.exit(main())
