"""In which precision torch runs fp32 matmuls and convolutions (TF32 or bf16 on tensor cores
where this process's flags allow it, else full fp32): the reference's call with the reduced
precision it may have run in (`run_recording_precision`: the correctness rule relaxes the fp32
tolerance by it). The work, and the flags a fresh process takes over, are
`fp32_tensor_cores.py`'s, imported only where a tensor-core device is involved. Standard
library only at module level (torch is passed in), so the sandbox's children import it
without the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Device types whose fp32 matmuls/convolutions torch's flags may run in reduced precision
# (cuBLAS/cuDNN on tensor cores). Elsewhere fp32 stays fp32 and nothing is recorded.
TENSOR_CORE_DEVICES: tuple[str, ...] = ("cuda",)


def may_run_reduced(device: Any) -> bool:
    """True when fp32 matmuls/convs on `device` ("cuda:0", a torch.device) may run reduced:
    only there is the reference's run recorded (entering a dispatch mode costs seconds)."""
    return str(device).partition(":")[0] in TENSOR_CORE_DEVICES


_UNSET = object()


def run_recording_precision(
    torch: Any, call: Callable[[], Any], device: Any, *, record: bool = True
) -> tuple[Any, str | None]:
    """`call()` (the reference on its inputs) and the reduced precision ("tf32", "bf16" or
    None) its fp32 matmuls/convs may have run in.

    Recorded only when `record` and on a tensor-core device (`may_run_reduced`). A reference
    the recording dispatch mode upsets is called again plainly and assumed to run every kind
    the flags allow reduced; an exception of the plain call propagates. Pass a `call` that
    makes its own copy of the inputs: a failed recorded run may have written into its copy.
    """
    if not (record and may_run_reduced(device)):
        return call(), None
    from pytest_kernelpro.measure.fp32_tensor_cores import (
        record_fp32_matmuls,
        reduced_precision_mode,
    )

    found: list[str] = []
    out: Any = _UNSET
    try:
        with record_fp32_matmuls(torch, found, TENSOR_CORE_DEVICES):
            out = call()
    except Exception:
        found = ["unknown"]
    if out is _UNSET:
        out = call()
    return out, reduced_precision_mode(torch, found)
