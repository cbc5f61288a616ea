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
# (measure/bound.py): a candidate that rebinds them cannot change what this worker writes.
from pytest_kernelpro.measure import bound
from pytest_kernelpro.optimize.sandbox.loader import add_session_path

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
    # The result channel is opened before the candidate's code runs (bound.ResultChannel).
    channel = bound.ResultChannel(str(args.result))
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
    tampered = bound.tampered()
    if tampered and result.get("status") == "correct":
        # The kept functions wrote this result either way; a candidate that rebinds them
        # still cheats.
        result = {
            "status": "cheat",
            "reason": f"rebinds {', '.join(tampered)} in the worker (numbers it writes could be "
            "anything)",
        }
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


# Samples the unwarmed diagnostic takes: what the confirmation measured before it used the
# search's method (one warm-up call, then back-to-back events, no flush): kept beside the
# real re-timing so a report shows how far apart the two methods are on this kernel.
UNWARMED_SAMPLES = 20
RETIME_MAX_SAMPLES = 200  # the re-timing's sample cap (a few rounds of events)
# The re-timing decides one thing: is the fresh median within the confirmation's tolerance
# (25% on a GPU, `optimize/sandbox/confirm.py`) of the search's? A median of tens of samples is good to
# a few percent, so the re-timing samples for at most this long (and never fewer than the
# task's min_samples), whatever the search's own per-kernel budget: a 6 ms GEMM took 200
# samples (1.3 s) under the 2 s default, 80 now.
RETIME_BUDGET_S = 0.5
RETIME_ROUND = 100  # samples enqueued behind one GPU sleep


def retime(task: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Time the candidate again in a fresh process, the way the search timed it, with every
    clock and helper bound before the candidate's code runs.

    The method is the search's (`measure.timing.cuda`): a first call, an estimate from 5
    L2-flushed calls, warm-up for the task's `warmup_ms`, then rounds of samples, each sample
    an L2 flush (a buffer of twice the L2 written) and a pair of CUDA events around one call,
    enqueued behind a GPU sleep so the events bracket GPU work and not Python launch time.
    What differs is where the functions come from: the events, the stream, the sleep, the
    synchronize and the flush are C methods and objects taken before the candidate's module
    executes (C types cannot be patched from Python), the inputs are made before it too, and
    after it runs nothing but those and the model is called (a Python helper's code could be
    swapped by the candidate). The statistics are computed by the parent from the raw
    samples. The output of one more call on fresh inputs goes to the trusted judge, so a
    candidate that does less work while it is timed fails there.

    What this cannot stop is code that rewrites this process's memory or its result file
    (every process the candidate runs in is its own): the profile's ncu kernel durations,
    taken by ncu's own process, are the cross-check for that (`search.confirm`).
    """
    clock = bound.perf_counter_ns
    import torch

    set_grad = torch._C._set_grad_enabled
    from pytest_kernelpro.measure.timing import TimingBudget
    from pytest_kernelpro.optimize.sandbox import judge
    from pytest_kernelpro.optimize.sandbox.harness import _Pipeline

    # The task's budget read as the gate's timer reads it (its defaults and validation).
    budget = TimingBudget(**dict(task.get("timing") or {}))
    warmup_s = budget.warmup_ms * 1e-3
    max_time_s = min(budget.max_time_s, RETIME_BUDGET_S)
    min_samples = max(3, budget.min_samples)
    pipeline = _Pipeline(task, progress)
    pipeline.build_reference()
    seed = pipeline.seed
    args = pipeline.inputs(seed)
    final_args = pipeline.inputs(seed + judge.RETIME_SEED_OFFSET)
    cuda = pipeline.device.type == "cuda"
    if cuda:
        tools = _cuda_tools(torch, pipeline.device, budget)
    pipeline.build_candidate()  # the candidate's code runs from here on
    progress("timing")
    model = pipeline.new_model
    set_grad(False)
    model(*args)  # first call: lazy initialisation, autotuning
    unwarmed: list[float] = []
    samples: list[float] = []
    n_warm = 0
    if cuda:
        event, record, elapsed, sync, stream, sleep, flush, flush_s, cycles_per_s = tools
        sync()
        pairs = [
            (event(enable_timing=True), event(enable_timing=True)) for _ in range(UNWARMED_SAMPLES)
        ]
        for start, end in pairs:
            record(start, stream)
            model(*args)
            record(end, stream)
        sync()
        unwarmed = [elapsed(start, end) * 1e-3 for start, end in pairs]
        pairs = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(5)]
        t0 = clock()
        for start, end in pairs:
            flush()
            record(start, stream)
            model(*args)
            record(end, stream)
        host_s = (clock() - t0) * 1e-9 / 5  # CPU time to enqueue one sample
        sync()
        per_call = sorted(elapsed(start, end) * 1e-3 for start, end in pairs)[2]
        n_warm = max(1, min(100_000, int(warmup_s / max(flush_s + per_call, 1e-9)) + 1))
        for _ in range(n_warm):
            flush()
            model(*args)
        sync()
        per_sample = max(flush_s + per_call, host_s, 1e-7)
        want = max(min_samples, min(RETIME_MAX_SAMPLES, int(max_time_s / per_sample)))
        while len(samples) < want:
            k = min(RETIME_ROUND, want - len(samples))
            pairs = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(k)]
            if cycles_per_s > 0:  # keep the GPU busy while the CPU enqueues the round
                sleep(int(min(0.05, host_s + 1.5 * k * host_s) * cycles_per_s))
            for start, end in pairs:
                flush()
                record(start, stream)
                model(*args)
                record(end, stream)
            sync()
            samples += [elapsed(start, end) * 1e-3 for start, end in pairs]
        out = model(*final_args)
        sync()
        method = "cuda-events (C methods bound before the candidate ran), L2 flush" + (
            "" if flush_s > 0 else " off"
        )
    else:
        deadline = clock() + int(warmup_s * 1e9)
        while clock() < deadline:
            model(*args)
            n_warm += 1
        deadline = clock() + int(max_time_s * 1e9)
        while len(samples) < min_samples or (
            len(samples) < RETIME_MAX_SAMPLES and clock() < deadline
        ):
            t0 = clock()
            model(*args)
            samples.append((clock() - t0) * 1e-9)
        out = model(*final_args)
        method = "perf_counter_ns bound before the candidate ran"
    set_grad(True)
    judge.save_output(judge.RETIMED, out)
    progress("done")
    return {
        "status": "correct",
        "timing": {
            "retimed": {
                "samples_s": samples,
                "samples": len(samples),
                "warmup_runs": n_warm,
                "method": method,
                "unwarmed_samples_s": unwarmed,
            }
        },
    }


def _cuda_tools(torch: Any, device: Any, budget: Any) -> tuple[Any, ...]:
    """The C-level functions and objects the re-timing uses, taken (and the GPU sleep
    calibrated, the flush buffer allocated and timed) before any candidate code runs. The
    flush is the gate timer's (`measure.timing.flush_size`: the budget's `flush_bytes`, else
    twice the L2)."""
    from pytest_kernelpro.measure.timing import flush_size

    flush_l2 = bool(budget.flush_l2)
    event = torch._C._CudaEventBase
    record, elapsed = event.record, event.elapsed_time
    sync = torch._C._cuda_synchronize
    sleep = torch._C._cuda_sleep
    stream = torch.cuda.current_stream(device)
    flush_s = 0.0
    flush: Any = int  # a no-op builtin when the task times without a flush
    if flush_l2:
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        nbytes = flush_size(budget, l2)
        buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
        flush = buffer.zero_
    sleep(100_000)  # load the sleep kernel's module outside the calibration
    start, end = event(enable_timing=True), event(enable_timing=True)
    record(start, stream)
    sleep(1_000_000)
    record(end, stream)
    sync()
    seconds = elapsed(start, end) * 1e-3
    cycles_per_s = 1_000_000 / seconds if seconds > 0 else 0.0
    if flush_l2:
        times = []
        for _ in range(3):
            start, end = event(enable_timing=True), event(enable_timing=True)
            record(start, stream)
            flush()
            record(end, stream)
            sync()
            times.append(elapsed(start, end) * 1e-3)
        flush_s = sorted(times)[1]
    return event, record, elapsed, sync, stream, sleep, flush, flush_s, cycles_per_s


if __name__ == "__main__":
    sys.exit(main())
