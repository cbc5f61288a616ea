"""The program that profilers launch: `python -m pytest_kernelpro.profile.target <spec>`.

`<spec>` is a JSON object, inline or as a path to a `.json` file:

    {"problem_file": "...", "qualname": "...", "shape_index": 0 | null, "device": "cuda",
     "mode": "ncu" | "timeline" | "nsys", "seed": 0, "runs": 10, "output": "events.json",
     "extra_cuda_cflags": ["-lineinfo", "-Xptxas=-v"], "triton_cache_dir": "..."}

It loads the problem (`problem_loader.load_problem`), builds the kernel callable
(`Problem.kernel_factory(device)`) and its inputs (the harness's kernels, outside any
profiled range), warms the kernel up once (Triton JIT, cuBLAS handles, lazy module loading), then:

- `ncu`: runs the kernel exactly once inside the push/pop NVTX ranges `kernelpro` >
  `kernel` and synchronizes, so `ncu --nvtx --nvtx-include kernelpro/` sees only the
  kernel's own launches, never the reference's or the harness's;
- `timeline`: records `runs` back-to-back calls with torch.profiler and writes the events
  to `output`;
- `nsys`: runs `runs` calls between cudaProfilerStart/Stop.

Extensions are built under `capture_extensions` with the same flags as in the pytest
process, so the cached build is reused instead of rebuilt with different flags.
`triton_cache_dir`, when given, becomes this process's TRITON_CACHE_DIR before anything
imports Triton: the profile's private cache, whose cubins are read for the SASS.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

NVTX_OUTER = "kernelpro"
NVTX_INNER = "kernel"
EXIT_BAD_SPEC = 2
EXIT_PROBLEM_FAILED = 3


def load_spec(argument: str) -> dict[str, Any]:
    """Parse the spec from inline JSON or from a file path."""
    text = argument if argument.lstrip().startswith("{") else Path(argument).read_text("utf-8")
    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise ValueError(f"the spec must be a JSON object, got {type(spec).__name__}")
    for key in ("problem_file", "qualname"):
        if not spec.get(key):
            raise ValueError(f"the spec has no {key!r}")
    return spec


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_once_in_nvtx(fn: Callable[[], Any], *, warmup: int = 1) -> None:
    """Warm up, then run `fn` once inside the `kernelpro` > `kernel` NVTX ranges."""
    import torch

    for _ in range(max(0, warmup)):
        fn()
    _synchronize()
    torch.cuda.nvtx.range_push(NVTX_OUTER)
    torch.cuda.nvtx.range_push(NVTX_INNER)
    try:
        fn()
        _synchronize()
    finally:
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()


def run_in_profiler_range(fn: Callable[[], Any], *, runs: int = 10, warmup: int = 1) -> None:
    """Warm up, then run `fn` `runs` times between cudaProfilerStart and cudaProfilerStop."""
    import torch

    for _ in range(max(0, warmup)):
        fn()
    _synchronize()
    torch.cuda.profiler.start()
    try:
        for _ in range(max(1, runs)):
            fn()
        _synchronize()
    finally:
        torch.cuda.profiler.stop()


def _kernel_callable(spec: dict[str, Any]) -> Callable[[], Any]:
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.profile.problem_loader import load_problem

    locator = ProblemLocator(
        str(spec["problem_file"]), str(spec["qualname"]), spec.get("shape_index")
    )
    problem = load_problem(locator)
    device = str(spec.get("device", "cuda"))
    # Problem.kernel_factory(device) builds the callable (instantiating nn.Module kernels
    # with the reference's parameters); a plain `kernel` attribute is accepted too.
    factory = getattr(problem, "kernel_factory", None)
    kernel = factory(device) if callable(factory) else problem.kernel
    inputs = problem.make_inputs(device, int(spec.get("seed", 0)))

    import torch

    def call() -> Any:
        with torch.no_grad():
            return kernel(*inputs)

    return call


def run_spec(spec: dict[str, Any]) -> None:
    """Run one spec (the body of `main`, importable for tests and the bench)."""
    from pytest_kernelpro.fileio import atomic_write_json
    from pytest_kernelpro.profile.capture import DEFAULT_CUDA_FLAGS, capture_extensions
    from pytest_kernelpro.profile.model import NotCollected
    from pytest_kernelpro.profile.timeline import trace_callable

    flags = tuple(spec.get("extra_cuda_cflags", DEFAULT_CUDA_FLAGS))
    with capture_extensions(flags):
        call = _kernel_callable(spec)
        mode = spec.get("mode", "ncu")
        runs = int(spec.get("runs", 10))
        if mode == "ncu":
            run_once_in_nvtx(call)
        elif mode == "nsys":
            run_in_profiler_range(call, runs=runs)
        elif mode == "timeline":
            events = trace_callable(call, runs=runs, warmup=1)
            payload: dict[str, Any]
            if isinstance(events, NotCollected):
                payload = {"not_collected": events.why}
            else:
                payload = {"events": events}
            atomic_write_json(spec["output"], payload)
        else:
            raise ValueError(f"unknown mode {mode!r}; use 'ncu', 'timeline' or 'nsys'")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit 0 on success, 2 on a bad spec, 3 when the problem itself failed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m pytest_kernelpro.profile.target <spec.json|JSON>\n")
        return EXIT_BAD_SPEC
    try:
        spec = load_spec(args[0])
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"kernelpro target: bad spec {args[0][:200]!r}: {exc}\n")
        return EXIT_BAD_SPEC
    if spec.get("triton_cache_dir"):
        os.environ["TRITON_CACHE_DIR"] = str(spec["triton_cache_dir"])
    try:
        from pytest_kernelpro.profile.problem_loader import extend_import_path

        extend_import_path([str(p) for p in spec.get("sys_path") or ()])
        run_spec(spec)
    except Exception as exc:  # the message goes to the profiler's NotCollected reason
        sys.stderr.write(f"kernelpro target: {type(exc).__name__}: {exc}\n")
        return EXIT_PROBLEM_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
