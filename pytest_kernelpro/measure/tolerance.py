"""The dtype tolerances, and the reduced precision a reference's fp32 matmuls ran in.

Where no higher-precision truth decides (none could be run: `measure/truth.py`), or where a
marker (or a task) gives rtol/atol, an output is compared with the reference as
torch.allclose does, by the (rtol, atol) of its dtype: a few of the dtype's unit roundoffs.
An fp32 reference whose matmuls/convolutions may have run reduced is only as exact as the
reduced type, so its fp32 outputs get that type's tolerance (fp16's for TF32, bf16's for
bf16). The correctness rule (`measure/accuracy.py`) falls back to these, and where the
reference's fp32 ops may run reduced it allows them beside its own.

The dtype tolerances:

- `default_tolerance(dtype)`: the per-dtype defaults (torch.allclose semantics,
  |got - expected| <= atol + rtol |expected|), with the relaxation for an fp32 reference whose
  matmuls/convolutions ran reduced (TF32 tensor cores, or bf16 under
  `torch.backends.cuda.matmul.fp32_precision = "bf16"`);
- `record_fp32_matmuls` and `reduced_precision_mode`: whether the reference ran such ops on a
  device where they may run reduced, and in which precision the torch flags let them run;
  `fp32_precision_flags` / `apply_fp32_precision_flags`: those flags read in the session and
  set in the sandbox's fresh processes, so both relax alike;
- `tolerance_rule(...)`: the function from an output's dtype to its `Tolerance`, a marker's (or
  a task's) rtol/atol replacing the default's fields when given;
- `KERNELBENCH`: KernelBench's own fixed check, recorded beside the gate's verdict for a
  KernelBench file (`correctness.py`).

Imports only the standard library and `errors` at module level (torch is passed in), so
the sandbox's child processes import it without the plugin.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_kernelpro.errors import KernelproError

# (rtol, atol) per dtype name, chosen from the dtype's unit roundoff u (half an ulp at 1.0):
# a few ulps for a result of order 1 computed in a different order than the reference.
_FLOAT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),  # u = 1.1e-16: generous, kernels often accumulate differently
    "complex128": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),  # u = 6e-8; a K=4096 fp32 dot product reordered differs ~1.2e-4
    "complex64": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),  # u = 4.9e-4: ~10 ulps, for fp32-accumulated fp16 kernels
    "bfloat16": (1.6e-2, 1e-2),  # u = 3.9e-3: 2 ulps at 1.0 (torch.testing uses rtol 1.6e-2)
    "float8_e4m3fn": (1.25e-1, 1e-1),  # 3 mantissa bits: 1 ulp at 1.0
    "float8_e4m3fnuz": (1.25e-1, 1e-1),
    "float8_e5m2": (2.5e-1, 1e-1),  # 2 mantissa bits: 1 ulp at 1.0
    "float8_e5m2fnuz": (2.5e-1, 1e-1),
}
# TF32 keeps fp16's 10 mantissa bits, so an fp32 result from TF32 tensor cores gets fp16's
# tolerance; fp32 matmuls in bf16 (`torch.backends.cuda.matmul.fp32_precision = "bf16"`)
# get bf16's.
_TF32 = (1e-2, 1e-2)

# Device types whose fp32 matmuls/convolutions torch's flags may run in reduced precision
# (cuBLAS/cuDNN on tensor cores). Elsewhere fp32 stays fp32 and nothing is recorded.
TENSOR_CORE_DEVICES: tuple[str, ...] = ("cuda",)


@dataclass(frozen=True)
class Tolerance:
    """Per-element tolerance, torch.allclose semantics; `source` says where it came from."""

    rtol: float
    atol: float
    source: str
    # Also ||got - expected||_2 <= norm_rtol * ||expected||_2 over the finite elements (the
    # normwise relative bound of a rule calibrated on the reference's float64 truth,
    # `calibrate`); None: elementwise only.
    norm_rtol: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (`norm_rtol` only when set)."""
        data = asdict(self)
        if self.norm_rtol is None:
            data.pop("norm_rtol")
        return data


def default_tolerance(dtype: Any, *, tf32: bool = False, reduced: str | None = None) -> Tolerance:
    """The default tolerance for a reference output of `dtype` (a torch dtype or its name).

    `None` (a non-tensor output) compares exactly.
    `tf32=True` (an fp32 reference whose matmuls/convolutions ran on TF32 tensor cores) gives
    fp16's tolerance; `reduced` names another reduced type the fp32 matmuls ran in ("bf16"
    under `torch.backends.cuda.matmul.fp32_precision = "bf16"`). Integers and bool compare
    exactly.
    """
    if dtype is None:
        return Tolerance(0.0, 0.0, "exact for non-tensor outputs")
    name = str(dtype).removeprefix("torch.")
    label = f"torch.{name}"
    if name in ("float32", "complex64") and reduced == "bf16":
        rtol, atol = _FLOAT_TOLERANCES["bfloat16"]
        return Tolerance(rtol, atol, f"default for {label} with fp32 matmuls in bf16")
    if name in ("float32", "complex64") and tf32:
        return Tolerance(*_TF32, f"default for {label} with TF32 matmul/conv allowed")
    if name in _FLOAT_TOLERANCES:
        rtol, atol = _FLOAT_TOLERANCES[name]
        return Tolerance(rtol, atol, f"default for {label}")
    if name == "bool" or name.startswith(("int", "uint")):
        return Tolerance(0.0, 0.0, f"exact for {label}")
    raise KernelproError(
        f"no default tolerance for reference output dtype {label}: give rtol= and atol= "
        "on the kernelpro marker"
    )


def tolerance_rule(
    *,
    reduced: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    fixed: Tolerance | None = None,
) -> Callable[[Any], Tolerance]:
    """dtype -> the `Tolerance` of an output of that dtype.

    `fixed`: that tolerance for every output. Else the dtype's default, relaxed for fp32 by
    `reduced` (`reduced_precision_mode`'s "tf32" or "bf16"; "bf16" applies to float32 outputs
    only, as the flag it comes from governs real fp32 matmuls), with `rtol`/`atol` (a
    marker's or a task's) replacing the default's fields when given (source "marker").
    """

    def tolerance_for(dtype: Any) -> Tolerance:
        if fixed is not None:
            return fixed
        name = str(dtype).removeprefix("torch.")
        base = default_tolerance(
            dtype,
            tf32=reduced == "tf32",
            reduced="bf16" if reduced == "bf16" and name == "float32" else None,
        )
        if rtol is None and atol is None:
            return base
        return Tolerance(
            rtol=base.rtol if rtol is None else rtol,
            atol=base.atol if atol is None else atol,
            source="marker",
        )

    return tolerance_for


# KernelBench's own check (a fixed allclose), recorded beside the gate's verdict for a
# KernelBench file (`correctness.py`), for comparison with published numbers.
KERNELBENCH = Tolerance(1e-2, 1e-2, "KernelBench's check: torch.allclose(atol=1e-2, rtol=1e-2)")


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


def may_run_reduced(device: Any) -> bool:
    """True when fp32 matmuls/convs on `device` ("cuda:0", a torch.device) may run reduced:
    only there is the reference's run recorded (entering a dispatch mode costs seconds)."""
    return str(device).partition(":")[0] in TENSOR_CORE_DEVICES


@contextlib.contextmanager
def record_fp32_matmuls(torch: Any, found: list[str]) -> Iterator[None]:
    """Record (into `found`) aten matmul/conv ops with fp32 operands on a tensor-core device
    (`TENSOR_CORE_DEVICES`) run in the block; "unknown" when the recorder is unavailable."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:  # private API moved: assume the worst case the flags allow
        found.append("unknown")
        yield
        return

    class Recorder(TorchDispatchMode):  # type: ignore[misc]
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo
        # unless the subclass opts out, and that wrapper imports torch._dynamo on its first
        # call: 2-3 s in every fresh process that checks a reference on CUDA (the sandbox's
        # worker, judge and re-measurement workers each paid it). A Dynamo that is not
        # loaded compiles nothing under this mode, so the mode opts out until it is loaded;
        # once a reference loads it (torch.compile), the mode asks Dynamo to skip as by
        # default, so the reference runs eagerly under the mode and its ops are seen.
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            if name in _GEMM_OPS or name in _CONV_OPS:
                for arg in args:
                    if (
                        isinstance(arg, torch.Tensor)
                        and arg.device.type in TENSOR_CORE_DEVICES
                        and arg.dtype == torch.float32
                    ):
                        found.append(name)
                        break
            return func(*args, **(kwargs or {}))

    with Recorder():
        yield


def _fp32_reduced_mode(torch: Any, op: str) -> str | None:
    """`"tf32"`/`"bf16"` when fp32 ops of kind `op` ("matmul"/"conv") may run reduced on CUDA.

    Reads the newer `fp32_precision` settings (torch >= 2.9) first; "none" there defers to
    the legacy flags, which newer torch refuses to read after a mix of both APIs.
    """
    if op == "conv":
        backend = getattr(torch.backends.cudnn, "conv", None)
        legacy = ("cudnn", "allow_tf32")
    else:
        backend = torch.backends.cuda.matmul
        legacy = ("cuda", "allow_tf32")
    new = getattr(backend, "fp32_precision", None)
    if new in ("tf32", "bf16"):
        return str(new)
    if new == "ieee":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy flags are deprecated in newer torch
        try:
            # "high" and "medium" float32 matmul precision both mean TF32 in cuBLAS.
            flags = torch.backends.cudnn if legacy[0] == "cudnn" else torch.backends.cuda.matmul
            return "tf32" if getattr(flags, legacy[1]) else None
        except RuntimeError:  # "mix of the legacy and new APIs": treat as full fp32
            return None


FP32_OPS = ("matmul", "conv")
_MODES = ("tf32", "bf16", None)


def fp32_precision_flags(torch: Any) -> dict[str, str | None]:
    """The precision ("tf32", "bf16" or None: full fp32) this process's torch flags let fp32
    matmuls and convolutions run in on CUDA, by kind: what a session's conftest set (e.g.
    `torch.backends.cuda.matmul.allow_tf32 = True`), for a fresh process to take over
    (`apply_fp32_precision_flags`)."""
    return {op: _fp32_reduced_mode(torch, op) for op in FP32_OPS}


def apply_fp32_precision_flags(torch: Any, flags: Mapping[str, Any], *, where: str) -> None:
    """Set this process's torch flags as `flags` (`fp32_precision_flags` of another process)
    says: TF32 through `allow_tf32` (cuBLAS matmuls, cuDNN convolutions), bf16 through the
    newer `fp32_precision`. So a fresh process runs fp32 matmuls/convs, and relaxes the fp32
    tolerance for them (`reduced_precision_mode`), as the process the flags came from.
    `where` names the flags' origin in the error for a bad value."""
    for op, mode in flags.items():
        if op not in FP32_OPS or mode not in _MODES:
            raise KernelproError(
                f"{where}: fp32 precision {op!r}={mode!r} is invalid; the kinds are "
                f"{', '.join(FP32_OPS)} and the modes tf32, bf16 or null (full fp32)"
            )
        if op == "matmul":
            backend, legacy = torch.backends.cuda.matmul, torch.backends.cuda.matmul
        else:
            backend, legacy = torch.backends.cudnn.conv, torch.backends.cudnn
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
        _fp32_reduced_mode(torch, "matmul") if unknown or set(found) & _GEMM_OPS else None,
        _fp32_reduced_mode(torch, "conv") if unknown or set(found) & _CONV_OPS else None,
    }
    return "bf16" if "bf16" in modes else "tf32" if "tf32" in modes else None


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
    found: list[str] = []
    out: Any = _UNSET
    try:
        with record_fp32_matmuls(torch, found):
            out = call()
    except Exception:
        found = ["unknown"]
    if out is _UNSET:
        out = call()
    return out, reduced_precision_mode(torch, found)
