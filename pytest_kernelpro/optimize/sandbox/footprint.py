"""Does one evaluation of a problem fit this machine? Decided before any worker starts.

A problem's footprint is the bytes of one call: its inputs plus its output. It is found
without allocating them: the problem's own `get_inputs()` and `Model` run on torch's `meta`
device (shapes and dtypes, no storage), in the session, before the first evaluation.

One evaluation holds several copies of that footprint at its peak (`HELD_COPIES`). Where
they are, for a problem whose inputs and output are the same size (I = O = half the
footprint), in the worker:

- every checked call reads one sealed input set, shared by the reference and the candidate
  (`input_handles.py`: no copy per call), beside the reference's and the candidate's
  outputs and the candidate's handed-over copy; the first call also re-runs the reference
  in float64 for the truth (widened inputs and output: twice the footprint, and the
  truth's own temporaries);
- the timing phase holds the checked outputs handed over so far (three trials and the
  in-place call: 4 O, in the session's memfds until the judge drops them), the timed
  inputs and the fresh-content draws and pool of one side at a time (`measure.timing.
  fresh_inputs`: I + 3 I, and a draw while it is made), the call's output, a checked call's
  copy and the reference's output on it: the worker's peak;
- the judge holds every handed-over output (5 O) while its first call re-runs the reference
  in float64: its peak.

When that estimate passes the sandbox's memory limit (`SandboxLimits.memory_limit_mb`, where
the watchdog would kill the worker) the evaluation is refused up front with the numbers,
instead of every candidate dying "out of memory".

A problem the meta device cannot run (an op without a meta kernel, inputs made with numpy)
has no estimate: it is evaluated, and the watchdog still bounds it.
"""

from __future__ import annotations

import sys
from typing import Any

from pytest_kernelpro.errors import KernelproError

# Copies of the footprint one evaluation holds at its peak (module doc): the timing phase's
# count (4 O held + 4 I + 3 O: 5.5x for I = O) with the draw being made and the allocator's
# temporaries: rounded up to cover the worker's measured peak above its idle size
# (bench/optimizer_handles.py on a large softmax; the judge's is lower).
HELD_COPIES = 8.0


def meta_footprint(reference_source: str) -> int | None:
    """Bytes of one call's inputs and output of a KernelBench reference, found on the meta
    device; None when the reference cannot run there."""
    import torch

    from pytest_kernelpro.optimize.sandbox.checks import flatten
    from pytest_kernelpro.optimize.sandbox.loader import load_source

    name = "kernelpro_footprint_reference"
    try:
        module = load_source(reference_source, name)
        with torch.device("meta"), torch.no_grad():
            inputs = list(module.get_inputs())
            init = list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
            output = module.Model(*init)(*inputs)
    except Exception:
        return None
    finally:
        sys.modules.pop(name, None)
    leaves = [*flatten(inputs), *flatten(output)]
    return sum(
        leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor)
    )


def refusal(task_name: str, footprint: int, limit_mb: int | None) -> KernelproError | None:
    """The error that refuses a problem whose evaluation cannot fit `limit_mb`, else None."""
    if not limit_mb or footprint <= 0:
        return None
    needed = HELD_COPIES * footprint
    limit = limit_mb * 2**20
    if needed <= limit:
        return None
    return KernelproError(
        f"The problem {task_name!r} is too large for the optimizer on this machine: one call's "
        f"inputs and output take {footprint / 2**30:.2f} GiB, one evaluation holds up to "
        f"{HELD_COPIES:g}x that ({needed / 2**30:.2f} GiB) and the sandbox's memory limit is "
        f"{limit / 2**30:.2f} GiB (SandboxLimits.memory_limit_mb, half the machine's memory "
        "by default). Optimize it at a smaller shape (its get_inputs), or on a machine with "
        f"at least {needed / 2**30 * 2:.0f} GiB of memory."
    )


def check_fits(task_name: str, reference_source: str, limit_mb: int | None) -> dict[str, Any]:
    """Raise the refusal for a problem that cannot fit; else what was found (for metrics)."""
    footprint = meta_footprint(reference_source)
    if footprint is None:
        return {"footprint_bytes": None, "why": "the reference does not run on the meta device"}
    error = refusal(task_name, footprint, limit_mb)
    if error is not None:
        raise error
    return {"footprint_bytes": footprint, "held_copies": HELD_COPIES}
