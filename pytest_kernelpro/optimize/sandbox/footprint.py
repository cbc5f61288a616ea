"""Does one evaluation of a problem fit this machine? Decided before any worker starts.

A problem's footprint is the bytes of one call: its inputs plus its output. It is found
without allocating them: the problem's own `get_inputs()` and `Model` run on torch's `meta`
device (shapes and dtypes, no storage), in the session, before the first evaluation.

One evaluation holds several copies of that footprint at its peak (`HELD_COPIES`, from the
path's structure): the worker's input set, the candidate's copy of it, the reference's and
the candidate's outputs, the float64 re-run of the first call for the truth (twice the
bytes of inputs and output), and the checked outputs the session holds by handle for the
judge (`handles.py`). When that estimate passes the sandbox's memory limit
(`SandboxLimits.memory_limit_mb`, where the watchdog would kill the worker) the evaluation
is refused up front with the numbers, instead of every candidate dying "out of memory".

A problem the meta device cannot run (an op without a meta kernel, inputs made with numpy)
has no estimate: it is evaluated, and the watchdog still bounds it.
"""

from __future__ import annotations

import sys
from typing import Any

from pytest_kernelpro.errors import KernelproError

# Copies of the footprint one evaluation holds at its peak (module doc): the path's count
# (worker: 4 inputs' and 3 outputs' worth while the truth re-runs; judge: its own 3 plus the
# 5 outputs held by handle, with inputs and output of one size), rounded up. A worker's peak
# measured by bench/optimizer_handles.py on a 1 GiB-footprint softmax: 3.7-4.8x.
HELD_COPIES = 6.0


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
