"""How torch's flags run fp32 matmuls and convolutions on CUDA (TF32 or bf16 on tensor cores,
else full fp32): read (`fp32_reduced_mode`, `reduced_precision_mode`, a session's flags for a
fresh process: `fp32_precision_flags`), set (`apply_fp32_precision_flags`) and seen in a
reference's call (`record_fp32_matmuls`). Imported where a tensor-core device is involved
(`fp32_precision`, the truth's re-run on CUDA, the sandbox), never by a CPU check. Standard library and `errors` only at
module level (torch is passed in).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_kernelpro.errors import KernelproError

# aten ops (as a TorchDispatchMode sees them, after composite ops decompose) that cuBLAS or
# cuDNN may run on TF32 tensor cores for fp32 operands.
_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation"})


_CONV_OPS = frozenset(
    {
        "convolution",
        "_convolution",
        "cudnn_convolution",
        "cudnn_convolution_transpose",
        "convolution_overrideable",
    }
)


@contextlib.contextmanager
def record_fp32_matmuls(torch: Any, found: list[str], devices: tuple[str, ...]) -> Iterator[None]:
    """Record (into `found`) aten matmul/conv ops with fp32 operands on a device of type in
    `devices` run in the block; "unknown" when the recorder is unavailable."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:  # private API moved: assume the worst case the flags allow
        found.append("unknown")
        yield
        return

    class Recorder(TorchDispatchMode):  # type: ignore[misc]
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo
        # unless the subclass opts out, and that wrapper imports torch._dynamo on its first
        # call (seconds in every fresh process). A Dynamo that is not loaded compiles nothing
        # under this mode, so the mode opts out until it is loaded; once a reference loads it
        # (torch.compile), Dynamo skips as by default: the reference runs eagerly, ops seen.
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            if name in _GEMM_OPS or name in _CONV_OPS:
                for arg in args:
                    if (
                        isinstance(arg, torch.Tensor)
                        and arg.device.type in devices
                        and arg.dtype == torch.float32
                    ):
                        found.append(name)
                        break
            return func(*args, **(kwargs or {}))

    with Recorder():
        yield


def _precision_backends(torch: Any, op: str) -> tuple[Any, Any]:
    """The torch objects that hold the precision of fp32 ops of kind `op` ("matmul"/"conv"):
    the newer one with `fp32_precision` (None where this torch has none) and the legacy one
    with `allow_tf32`."""
    if op == "matmul":
        return torch.backends.cuda.matmul, torch.backends.cuda.matmul
    return getattr(torch.backends.cudnn, "conv", None), torch.backends.cudnn


def fp32_reduced_mode(torch: Any, op: str) -> str | None:
    """`"tf32"`/`"bf16"` when fp32 ops of kind `op` ("matmul"/"conv") may run reduced on CUDA.

    Reads the newer `fp32_precision` settings (torch >= 2.9) first; "none" there defers to
    the legacy flags, which newer torch refuses to read after a mix of both APIs.
    """
    backend, legacy = _precision_backends(torch, op)
    new = getattr(backend, "fp32_precision", None)
    if new in ("tf32", "bf16"):
        return str(new)
    if new == "ieee":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy flags are deprecated in newer torch
        try:
            # "high" and "medium" float32 matmul precision both mean TF32 in cuBLAS.
            return "tf32" if legacy.allow_tf32 else None
        except RuntimeError:  # "mix of the legacy and new APIs": treat as full fp32
            return None


FP32_OPS = ("matmul", "conv")


def fp32_precision_flags(torch: Any) -> dict[str, str | None]:
    """The precision ("tf32", "bf16" or None: full fp32) this process's torch flags let fp32
    matmuls and convolutions run in on CUDA, by kind ("matmul", "conv"): what a session's
    conftest set, for a fresh process to take over (`apply_fp32_precision_flags`)."""
    return {op: fp32_reduced_mode(torch, op) for op in FP32_OPS}


_MODES = ("tf32", "bf16", None)


def apply_fp32_precision_flags(torch: Any, flags: Mapping[str, Any], *, where: str) -> None:
    """Set this process's torch flags as `flags` (`fp32_precision_flags` of another process)
    says, so it runs fp32 matmuls/convs, and relaxes the fp32 tolerance for them, as the
    process the flags came from: TF32 through `allow_tf32` (cuBLAS matmuls, cuDNN
    convolutions), bf16 through the newer `fp32_precision`. `where` names the flags' origin
    in the error for a bad value."""
    for op, mode in flags.items():
        if op not in FP32_OPS or mode not in _MODES:
            raise KernelproError(
                f"{where}: fp32 precision {op!r}={mode!r} is invalid; the kinds are "
                f"{', '.join(FP32_OPS)} and the modes tf32, bf16 or null (full fp32)"
            )
        backend, legacy = _precision_backends(torch, op)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy flags are deprecated in newer torch
            if mode == "bf16":
                backend.fp32_precision = "bf16"
            else:
                legacy.allow_tf32 = mode == "tf32"


def reduced_precision_mode(torch: Any, found: list[str]) -> str | None:
    """The reduced precision ("bf16", "tf32" or None) the recorded ops (`found`, from
    `record_fp32_matmuls`; "unknown" for all kinds) may have run in under torch's flags."""
    if not found:
        return None
    unknown = "unknown" in found
    modes = {
        fp32_reduced_mode(torch, "matmul") if unknown or set(found) & _GEMM_OPS else None,
        fp32_reduced_mode(torch, "conv") if unknown or set(found) & _CONV_OPS else None,
    }
    return "bf16" if "bf16" in modes else "tf32" if "tf32" in modes else None
