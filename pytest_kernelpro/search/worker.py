"""The sandbox worker process: evaluates one candidate and writes its result as JSON.

    python -m pytest_kernelpro.search.worker --task TASK.json --result RESULT.json \
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
import time
from pathlib import Path
from typing import Any

# Phases before "built" count against the build timeout, the rest against the run timeout.
BUILD_PHASES = ("start", "import", "reference", "build")
RUN_PHASES = ("built", "correctness", "checks", "shapes", "timing", "done")


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


def add_session_path(entries: Any) -> None:
    """Put the pytest session's sys.path entries missing here in front of the worker's
    (keeping their order), so the kernel's modules import as they did under pytest."""
    missing = [str(p) for p in entries if str(p) and str(p) not in sys.path]
    sys.path[:0] = missing


def main(argv: list[str] | None = None) -> int:
    """Worker entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kernelpro.search.worker")
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--progress", required=True, type=Path)
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)
    progress_file = open(args.progress, "a", encoding="utf-8")  # noqa: SIM115 - lives until exit

    def progress(phase: str) -> None:
        progress_file.write(f"{phase} {time.monotonic():.3f}\n")
        progress_file.flush()

    progress("start")
    task: dict[str, Any] = json.loads(args.task.read_text(encoding="utf-8"))
    add_session_path(task.get("sys_path") or ())
    if task.get("retime"):
        result = _retime_or_error(task, progress)
    else:
        result = _evaluate(task, progress)
    from pytest_kernelpro.fileio import atomic_write_json

    atomic_write_json(args.result, result)
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
        from pytest_kernelpro.search.harness import run_task

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


def retime(task: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Time the candidate again in a fresh process, with clocks taken before its code runs.

    The search's timing (`measure.timing`) reads `time.perf_counter` and torch's Python event
    and synchronize wrappers at call time, so a candidate can patch them in its own process.
    Here the clock functions are bound before the candidate's module executes, the CUDA
    events are driven through torch's C methods (C types cannot be patched from Python), and
    the output of one more call on fresh inputs goes to the trusted judge, so a candidate
    that does less work while it is timed fails there. What this cannot stop is code that
    rewrites this process's memory (ctypes): the GPU path's ncu durations are the stronger
    check for that.
    """
    import statistics

    clock = time.perf_counter_ns
    import torch

    current_stream = torch.cuda.current_stream
    cuda_event = getattr(torch._C, "_CudaEventBase", None)
    record = getattr(cuda_event, "record", None)
    elapsed = getattr(cuda_event, "elapsed_time", None)
    synchronize = getattr(torch._C, "_cuda_synchronize", None)
    from pytest_kernelpro.search import judge
    from pytest_kernelpro.search.harness import _Pipeline

    pipeline = _Pipeline(task, progress)
    pipeline.build()  # the candidate's code runs from here on
    progress("timing")
    model, seed = pipeline.new_model, pipeline.seed
    args = pipeline.inputs(seed)
    cuda = pipeline.device.type == "cuda" and cuda_event is not None and synchronize is not None
    calls = max(3, int(task.get("retime_calls", 20)))
    samples: list[float] = []
    with torch.no_grad():
        model(*args)  # warm-up (lazy initialisation, autotuning)
        if cuda:
            synchronize()
            pairs = [
                (cuda_event(enable_timing=True), cuda_event(enable_timing=True))
                for _ in range(calls)
            ]
            for start, end in pairs:
                record(start, current_stream())
                model(*args)
                record(end, current_stream())
            synchronize()
            samples = [elapsed(start, end) * 1e-3 for start, end in pairs]
        else:
            for _ in range(calls):
                t0 = clock()
                model(*args)
                samples.append((clock() - t0) * 1e-9)
        out = model(*pipeline.inputs(seed + judge.RETIME_SEED_OFFSET))
        if cuda:
            synchronize()
    judge.save_output(Path(task["outputs_dir"]) / "retimed.pt", out)
    progress("done")
    return {
        "status": "correct",
        "timing": {
            "retimed": {
                "median_s": statistics.median(samples),
                "samples": len(samples),
                "method": "cuda-event (C methods)" if cuda else "perf_counter_ns bound first",
            }
        },
    }


if __name__ == "__main__":
    sys.exit(main())
