"""How close a kernel's output must be to the reference's: the dtype tolerances
(`tolerance_rule`, relaxed where the reference's fp32 matmuls may run reduced), the
higher-precision truth (the reference re-run in float64 on the same inputs, `run_truth`),
and the rule measured against it (`CorrectnessRule`): within a stated factor of the
reference's own error against that truth, and never an output that carries no information.

One rule for the gate (`correctness.check_correctness`, `recheck_after_timing`) and the
sandbox (`optimize/sandbox/measurement.py`: the worker's checks and the judge's), so an
output that passes one passes the others.

The truth's precision: the reference's floating outputs decide. float32/complex64 outputs ->
the re-run is in float64 (complex128); bfloat16/float16 (and float8) outputs -> float32.
Inputs, parameters and buffers narrower than that are widened on copies (the reference and
its inputs are never written), the default dtype is the wide one while it runs (tensors it
creates without a dtype are wide too), and fp32 matmuls/convolutions run in full fp32 (no
TF32, no bf16) for a float32 truth.

The truth's cost, bounded and recorded: one re-run per check (the first trial's inputs), its
wall time (the re-run and the reference's errors against it) and its peak memory above what
was allocated when it started (CUDA; an upper bound where the item had a higher peak
before). It is skipped, with the reason in the record, when it cannot give a truth:
- the outputs are float64 already (nothing wider) or have no floating leaf;
- it would not fit: about twice the widened inputs, parameters and outputs must be free;
- it would take too long: the reference's own call times the slowdown of wide arithmetic
  on the device (`SLOWDOWN`) above `TIME_BUDGET_S`;
- the re-run raises (an op without float64 support, a reference that insists on its dtype),
  runs out of memory, returns other shapes, returns the narrow dtype again (the reference
  casts internally), or gives NaN/infinity where the reference does not;
- it disagrees with the reference by more than `AGREEMENT` (normwise relative): the
  reference is not a plain function of its inputs (random, stateful) or no longer close to
  its own exact answer, so it is no truth for it.

The rule, per floating output (t: the reference re-run in float64, or float32 for a
bf16/fp16 reference, `run_truth`; r: the reference; k: the kernel; u: the unit
roundoff of the output's dtype; F = `FACTOR`):

- the call whose inputs the truth was run on (the first trial):
  every element |k - t| <= F (|r - t| + s) + R u |t|, with the floor s = max |r - t| +
  u rms(t) (the reference's largest error and one rounding of the output's typical value: a
  scale of the output, not a fixed atol; a reordering's error at one element is not bounded
  by the reference's error there, nor by its typical size: on the H200 a transposed
  convolution run twice differed at 0.005% of 28M elements by more than 8x the rms), and
  normwise ||k - t|| <= F ||r - t|| + R u ||t||
  (R = `ROUNDINGS`: the kernel may round its result differently). A kernel that does the
  same math in another order has an error of the reference's size and passes; an error F
  times the reference's own does not.
- every later call (other inputs: more trials, the re-check after timing, the sandbox's
  in-place and shape checks) compares with the reference directly, by the tolerance the
  first call measured: |k - r| <= R u |r| + F s + (F + 1) m per element (m = max |r - t|)
  and ||k - r|| <= ((F + 1) rho + R u) ||r||
  (rho: the reference's normwise relative error), which a kernel passing the first rule on
  these inputs meets.
- without a truth (it could not run: `Truth.skipped` says why) the dtype tolerances decide
  (`tolerance_rule`); a marker's (or task's) rtol/atol override the rule,
  and the record names whichever decided.
- in every mode an output that carries no information fails: all zeros where the reference
  stands above its own noise, one constant where it varies, or the reference times a
  constant (the scale explains the difference and exceeds the rule's relative allowance) --
  a softmax over 393,216 columns is about 2.5e-6 everywhere, so a zeros kernel passed any
  fixed atol. The truth's rule (and its calibration) rejects them by itself; where the dtype
  rule or a marker decides, `information_failure` checks them, and a failing output's
  message starts with that diagnosis.

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
  a task's) rtol/atol replacing the default's fields when given.

Imports only the standard library and `measure/` at module level (torch is passed in), so
the sandbox's child processes import it without the plugin.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure import compare as _compare
from pytest_kernelpro.measure.compare import (
    STRUCTURE_ONLY_SOURCE,
    LeafReport,
    compare_outputs,
    compare_tensor,
)

# ----- the dtype tolerances, and the reduced precision the reference's fp32 ops ran in -----

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


# ----- the truth: the reference re-run in higher precision -----

# Normwise relative difference between the reference and its re-run above which the re-run
# is no truth for it. A TF32 reference of a deep network is off by about 1e-3..1e-2; a
# random or stateful one by order 1.
AGREEMENT = 0.05
# Wide arithmetic against the reference's own: float64 on a GPU runs at a fraction of the
# fp32/TF32 rate (an H200's float64 tensor-core rate is about a tenth of its dense TF32 rate,
# cuDNN's float64 convolutions use no tensor cores); on a CPU float64 is about 2x fp32.
SLOWDOWN = {"cuda": 64.0, "cpu": 4.0}
TIME_BUDGET_S = 30.0  # the re-run's estimated wall time above this: skipped
MEMORY_HEADROOM = 2.0  # free memory needed: this times the widened inputs, params and outputs


@dataclass
class LeafTruth:
    """One floating output leaf: the reference's own error against the truth."""

    path: str
    difference: Any  # reference - truth in float32, on the device (None once calibrated)
    numel: int
    reference_error_norm: float  # ||reference - truth||_2 over finite elements
    truth_norm: float  # ||truth||_2 over the same elements
    reference_error_max: float  # max |reference - truth|
    truth_abs_max: float
    truth_min: float
    truth_max: float
    unit_roundoff: float  # of the reference output's dtype

    @property
    def reference_error_rel(self) -> float:
        """||reference - truth|| / ||truth|| (0 when the truth is all zeros and so is it)."""
        if self.truth_norm > 0:
            return self.reference_error_norm / self.truth_norm
        return 0.0 if self.reference_error_norm == 0 else math.inf

    @property
    def rms_reference_error(self) -> float:
        return self.reference_error_norm / math.sqrt(max(1, self.numel))

    @property
    def rms_truth(self) -> float:
        return self.truth_norm / math.sqrt(max(1, self.numel))


@dataclass
class Truth:
    """The outcome of a re-run: per-leaf errors of the reference, or why there is none."""

    precision: str | None  # "float64" / "float32"; None when not run
    skipped: str | None = None  # why there is no truth (then `leaves` is empty)
    seconds: float | None = None  # the re-run's wall time and its comparison with the reference
    peak_bytes: int | None = None  # its peak allocation above its start (CUDA only)
    peak_exact: bool | None = None  # False: an earlier, higher peak of the item (an upper bound)
    leaves: dict[str, LeafTruth] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.skipped is None and bool(self.leaves)

    def summary(self) -> dict[str, Any]:
        """JSON-safe: precision, cost and the reason it was skipped."""
        return {
            "precision": self.precision,
            "seconds": None if self.seconds is None else round(self.seconds, 6),
            "peak_bytes": self.peak_bytes,
            "peak_exact": self.peak_exact,
            "skipped": self.skipped,
        }


def unit_roundoff(torch: Any, dtype: Any) -> float:
    """Half an ulp at 1.0 of a floating dtype (complex: of its real part)."""
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    return float(torch.finfo(dtype).eps) / 2


def leaves_of(torch: Any, obj: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of an output structure, with `compare.compare_outputs`'s path names."""
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from leaves_of(torch, item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from leaves_of(torch, item, f"{path}[{key!r}]")
    else:
        yield path, obj


def wide_dtype(torch: Any, expected: Any) -> tuple[Any, str | None]:
    """(the dtype to re-run in, None) from the reference's outputs, or (None, why not)."""
    floats = [
        leaf.dtype
        for _, leaf in leaves_of(torch, expected)
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex())
    ]
    if not floats:
        return None, "no floating-point output (compared exactly)"
    if any(d in (torch.float64, torch.complex128) for d in floats):
        return None, "the reference already computes in float64: no wider type to re-run in"
    if any(d in (torch.float32, torch.complex64) for d in floats):
        return torch.float64, None
    return torch.float32, None


def _widen(torch: Any, value: Any, wide: Any) -> Any:
    """A copy of `value` with floating tensors narrower than `wide` in `wide` (complex in
    its complex counterpart); other tensors and objects as they are."""
    if isinstance(value, torch.Tensor):
        if value.is_complex() and wide == torch.float64 and value.dtype != torch.complex128:
            return value.detach().to(torch.complex128)
        if (
            value.is_floating_point()
            and value.element_size() < torch.empty((), dtype=wide).element_size()
        ):
            return value.detach().to(wide)
        return value.detach().clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_widen(torch, v, wide) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_widen(torch, v, wide) for v in value)
    if isinstance(value, dict):
        return {k: _widen(torch, v, wide) for k, v in value.items()}
    return value


def _widened_module(torch: Any, module: Any, wide: Any) -> Any:
    """A copy of `module` whose parameters, buffers and tensor attributes are widened,
    made without first copying them in their own dtype (deepcopy's memo is pre-filled)."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for tensor in list(vars(sub).values()):
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                memo[id(tensor)] = _widen(torch, tensor, wide)
        for tensor in sub._parameters.values():
            if tensor is not None and id(tensor) not in memo:
                memo[id(tensor)] = torch.nn.Parameter(
                    _widen(torch, tensor, wide), requires_grad=False
                )
        for tensor in sub._buffers.values():
            if tensor is not None and id(tensor) not in memo:
                memo[id(tensor)] = _widen(torch, tensor, wide)
    return copy.deepcopy(module, memo)


def widened_reference(torch: Any, reference: Callable[..., Any], wide: Any) -> Callable[..., Any]:
    """The reference with its own tensors widened: an nn.Module (or a bound method of one)
    is copied; a plain function is used as it is (its inputs are widened by the caller)."""
    if isinstance(reference, torch.nn.Module):
        return _widened_module(torch, reference, wide)
    owner = getattr(reference, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return getattr(_widened_module(torch, owner, wide), reference.__name__)
    return reference


@contextlib.contextmanager
def _wide_mode(torch: Any, wide: Any, device: str) -> Iterator[None]:
    """Default dtype `wide`, no autograd, fp32 matmuls/convs in full fp32 (a float32 truth
    computed with TF32 would be no more exact than a TF32 reference)."""
    before_default = torch.get_default_dtype()
    flags = fp32_precision_flags(torch) if device.startswith("cuda") else None
    torch.set_default_dtype(wide)
    try:
        if flags and any(flags.values()):
            with contextlib.suppress(RuntimeError):  # a mix of torch's two flag APIs
                apply_fp32_precision_flags(
                    torch, {"matmul": None, "conv": None}, where="the truth's re-run"
                )
        with torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(before_default)
        if flags and any(flags.values()):
            with contextlib.suppress(RuntimeError):
                apply_fp32_precision_flags(torch, flags, where="the truth's re-run")


def _tensor_bytes(torch: Any, obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(torch, v) for v in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(torch, v) for v in obj.values())
    if isinstance(obj, torch.nn.Module):
        return sum(_tensor_bytes(torch, t) for t in [*obj.parameters(), *obj.buffers()])
    return 0


def _memory_shortfall(
    torch: Any, reference: Any, inputs: Any, expected: Any, wide: Any, device: str
) -> str | None:
    """Why the re-run would not fit in the device's free memory, or None."""
    if not device.startswith("cuda"):
        return None
    owner = getattr(reference, "__self__", reference)
    narrow = _tensor_bytes(torch, inputs) + _tensor_bytes(torch, owner)
    narrow += _tensor_bytes(torch, expected)
    needed = MEMORY_HEADROOM * 2.0 * narrow  # fp32 -> fp64 and bf16/fp16 -> fp32 double a tensor
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    available = free + max(0, cached)
    if needed <= available:
        return None
    return (
        f"not enough device memory: the re-run needs about {needed / 2**30:.1f} GiB "
        f"({MEMORY_HEADROOM:g}x the widened inputs, parameters and outputs), "
        f"{available / 2**30:.1f} GiB free"
    )


@contextlib.contextmanager
def _peak_meter(torch: Any, device: str, out: list[tuple[int, bool]]) -> Iterator[None]:
    """(bytes, exact) into `out`: the allocator's peak above the block's start while it ran.
    The peak counter is not reset (the item's memory record reads it, `gpu_memory.py`), so
    where an earlier peak of the item was higher the number is that one: an upper bound
    (exact False)."""
    if not device.startswith("cuda"):
        yield
        return
    torch.cuda.synchronize(device)
    peak_before = torch.cuda.max_memory_allocated(device)
    start = torch.cuda.memory_allocated(device)
    try:
        yield
    finally:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        out.append((max(0, peak - start), peak > peak_before))


def _leaf_truth(torch: Any, path: str, ref: Any, wide_out: Any) -> LeafTruth | str:
    """The reference's error on one leaf, or why the re-run is no truth for it."""
    if not isinstance(wide_out, torch.Tensor) or tuple(wide_out.shape) != tuple(ref.shape):
        return f"the re-run returned another output at {path}"
    if wide_out.element_size() <= ref.element_size():
        return (
            f"the re-run returned {str(wide_out.dtype).removeprefix('torch.')} at {path}: "
            "the reference casts to its own dtype"
        )
    keep = torch.complex64 if ref.is_complex() else torch.float32
    total = ref.numel()
    diff = torch.empty(ref.shape, dtype=keep, device=ref.device)
    flat_d, flat_r, flat_t = diff.reshape(-1), ref.detach().reshape(-1), wide_out.reshape(-1)
    step = max(_compare.COMPARE_CHUNK, -(-total // _compare.COMPARE_MAX_CHUNKS))
    sums = []
    for lo in range(0, total, step):
        r = flat_r[lo : lo + step].to(wide_out.dtype)
        t = flat_t[lo : lo + step]
        r_ok = torch.isfinite(r)
        lost = (r_ok & ~torch.isfinite(t)).sum()  # read once, with the sums (one sync)
        d = torch.where(r_ok, r - t, torch.zeros((), dtype=t.dtype, device=t.device))
        t_ok = torch.where(r_ok, t, torch.zeros((), dtype=t.dtype, device=t.device))
        flat_d[lo : lo + step] = d.to(keep)
        real = t_ok.real if t_ok.is_complex() else t_ok
        sums.append(
            torch.stack(
                [
                    d.abs().pow(2).sum().real if d.is_complex() else d.pow(2).sum(),
                    t_ok.abs().pow(2).sum(),
                    d.abs().max(),
                    t_ok.abs().max(),
                    real.min(),
                    real.max(),
                    lost.to(d.dtype if not d.is_complex() else torch.float64),
                ]
            ).to(torch.float64)
        )
    table = torch.stack(sums).cpu()
    if float(table[:, 6].sum()) > 0:
        return f"the re-run gave NaN or infinity at {path} where the reference did not"
    leaf = LeafTruth(
        path=path,
        difference=diff,
        numel=total,
        reference_error_norm=math.sqrt(float(table[:, 0].sum())),
        truth_norm=math.sqrt(float(table[:, 1].sum())),
        reference_error_max=float(table[:, 2].max()),
        truth_abs_max=float(table[:, 3].max()),
        truth_min=float(table[:, 4].min()),
        truth_max=float(table[:, 5].max()),
        unit_roundoff=unit_roundoff(torch, ref.dtype),
    )
    if leaf.reference_error_rel > AGREEMENT:
        return (
            f"the reference differs from its re-run by {leaf.reference_error_rel:.3g} "
            f"(normwise relative, at {path}; above {AGREEMENT:g}): it is not a plain function "
            "of its inputs (random or stateful) or too sensitive to rounding to have a truth"
        )
    return leaf


def run_truth(
    torch: Any,
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    expected: Any,
    *,
    device: str,
    reference_s: float | None = None,
    arrange: Callable[[Any], Any] | None = None,
) -> Truth:
    """Re-run `reference` on widened copies of `inputs` and measure `expected` (its output
    on those inputs) against it; a `Truth` with the reason when it cannot (module docstring).

    `reference_s`: the reference's own call on these inputs took this long (for the time
    bound; None: not bounded). `arrange`: what the caller did to the reference's output to
    get `expected` (the sandbox's judge compares flattened leaves), done to the re-run's too.
    """
    wide, why_not = wide_dtype(torch, expected)
    if wide is None:
        return Truth(precision=None, skipped=why_not)
    precision = str(wide).removeprefix("torch.")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if reference_s is not None and reference_s * SLOWDOWN[kind] > TIME_BUDGET_S:
        return Truth(
            precision=precision,
            skipped=(
                f"too slow: the reference's call took {reference_s:.3g} s; in {precision} about "
                f"{SLOWDOWN[kind]:g}x that on {kind}, above the {TIME_BUDGET_S:g} s budget"
            ),
        )
    try:
        short = _memory_shortfall(torch, reference, inputs, expected, wide, device)
    except RuntimeError as exc:
        short = f"device memory could not be read ({exc})"
    if short:
        return Truth(precision=precision, skipped=short)
    peak: list[tuple[int, bool]] = []
    started = time.perf_counter()
    with _peak_meter(torch, device, peak):
        truth = _rerun(torch, reference, inputs, expected, wide, device, arrange)
    truth.seconds = time.perf_counter() - started  # the re-run and the reference's errors
    if peak:
        truth.peak_bytes, truth.peak_exact = peak[0]
    return truth


def _rerun(
    torch: Any,
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    expected: Any,
    wide: Any,
    device: str,
    arrange: Callable[[Any], Any] | None,
) -> Truth:
    """The re-run and each floating leaf's errors (`run_truth` times and meters it)."""
    precision = str(wide).removeprefix("torch.")
    try:
        with _wide_mode(torch, wide, device):
            wide_ref = widened_reference(torch, reference, wide)
            wide_inputs = _widen(torch, list(inputs), wide)
            wide_out = wide_ref(*wide_inputs)
            del wide_ref, wide_inputs
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
    except Exception as exc:  # an op without float64 support, out of memory, ...
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return Truth(precision=precision, skipped=f"the reference raised in {precision}: {text}")
    truth = Truth(precision=precision)
    if arrange is not None:
        wide_out = arrange(wide_out)
    wide_leaves = dict(leaves_of(torch, wide_out))
    ref_leaves = list(leaves_of(torch, expected))
    if set(wide_leaves) != {p for p, _ in ref_leaves}:
        truth.skipped = "the re-run returned another output structure"
        return truth
    for path, ref in ref_leaves:
        if not (isinstance(ref, torch.Tensor) and (ref.is_floating_point() or ref.is_complex())):
            continue
        if ref.numel() == 0:
            continue
        found = _leaf_truth(torch, path, ref, wide_leaves[path])
        if isinstance(found, str):
            truth.skipped, truth.leaves = found, {}
            return truth
        truth.leaves[path] = found
    return truth


# ----- the rule: the kernel against the truth -----

# The kernel may be this many times farther from the truth than the reference is. A
# reordering of the same sums has an error of the reference's own size (elementwise, up to
# the reference's largest, which the floor carries); one precision step coarser (fp32 ->
# TF32: 2^13 times) is far outside.
FACTOR = 8.0
# Roundings of the output's dtype a kernel may differ by beyond that (where the reference is
# exact, or its error is below one rounding): its last rounding may go the other way.
ROUNDINGS = 2.0
KERNELBENCH = Tolerance(1e-2, 1e-2, "KernelBench's check: torch.allclose(atol=1e-2, rtol=1e-2)")


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _steps(total: int) -> range:
    # Read at call time, as compare.py does (a by-value import ignores a changed
    # COMPARE_CHUNK, and the pass runs in one full-size chunk).
    step = max(_compare.COMPARE_CHUNK, -(-total // _compare.COMPARE_MAX_CHUNKS))
    return range(0, total, step)


@dataclass(frozen=True)
class TruthComparison:
    """One leaf of the kernel's output against the truth."""

    report: LeafReport
    kernel_error: float  # ||kernel - truth|| / ||truth||
    reference_error: float  # ||reference - truth|| / ||truth||


def truth_source(precision: str | None, factor: float) -> str:
    return f"within {factor:g}x the reference's own error against its {precision} re-run"


def screen_tolerance(source: str) -> Tolerance:
    """Shape, dtype, NaN and infinities judged with the gate's messages; values not judged."""
    return Tolerance(0.0, math.inf, source)


def compare_with_truth(
    torch: Any,
    path: str,
    got: Any,
    expected: Any,
    leaf: LeafTruth,
    precision: str,
    factor: float,
) -> TruthComparison:
    """The first call's rule on one floating leaf (module docstring), in one chunked pass
    (which also takes the kernel's errors against the reference for the record); a NaN or
    infinity the reference does not have, or another shape or dtype, is explained by the
    gate's comparison (`compare.compare_tensor`, values not judged)."""
    u = leaf.unit_roundoff
    floor = leaf.reference_error_max + u * leaf.rms_truth
    source = truth_source(precision, factor)
    norm_bound_rel = factor * leaf.reference_error_rel + ROUNDINGS * u
    tol = Tolerance(ROUNDINGS * u, factor * floor, source, norm_rtol=norm_bound_rel)

    def screened() -> TruthComparison:
        screen = compare_tensor(torch, path, got, expected, screen_tolerance(source))
        screen.tolerance = tol  # the screen's own (values not judged) is no rule
        return TruthComparison(screen, math.inf, leaf.reference_error_rel)

    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        return screened()
    shape, total = tuple(expected.shape), expected.numel()
    work = torch.complex64 if expected.is_complex() else torch.float32
    g = got.detach().to(expected.device).reshape(-1)
    r, d = expected.detach().reshape(-1), leaf.difference.reshape(-1)
    rows = []
    best_at = []
    steps = _steps(total)
    for lo in steps:
        hi = min(total, lo + steps.step)
        gd, rd, dd = g[lo:hi].to(work), r[lo:hi].to(work), d[lo:hi].to(work)
        ok = torch.isfinite(gd) & torch.isfinite(rd)
        both_nan = torch.isnan(gd) & torch.isnan(rd)
        # Not numbers on both sides and not the same NaN or infinity: screened below.
        unlike = (~ok & ~both_nan & (gd != rd)).sum()
        zero = torch.zeros((), dtype=work, device=gd.device)
        diff = torch.where(ok, gd - rd, zero)  # kernel - reference
        r_abs = rd.abs()
        rel = torch.where(r_abs > 0, diff.abs() / r_abs, torch.zeros_like(r_abs))
        off = (diff + torch.where(ok, dd, zero)).abs()  # |kernel - truth|
        allowed = factor * (dd.abs() + floor) + ROUNDINGS * u * (rd - dd).abs()
        ratio = torch.where(off > 0, off / allowed, torch.zeros_like(off))
        best = ratio.argmax()
        rows.append(
            torch.stack(
                [
                    (off > allowed).sum().to(torch.float64),
                    off.to(torch.float64).pow(2).sum(),
                    ratio[best].to(torch.float64),
                    unlike.to(torch.float64),
                    both_nan.sum().to(torch.float64),
                    diff.abs().max().to(torch.float64),
                    rel.max().to(torch.float64),
                ]
            )
        )
        best_at.append(best + lo)
        del gd, rd, dd, ok, both_nan, diff, r_abs, rel, off, allowed, ratio
    table = torch.stack(rows).cpu()
    starts = torch.stack(best_at).cpu()
    if float(table[:, 3].sum()) > 0:
        return screened()
    n_both_nan = int(table[:, 4].sum())
    notes = []
    if n_both_nan:
        notes.append(
            f"{path}: the reference itself produced NaN at {n_both_nan} element(s) and the kernel "
            "has NaN at the same places (accepted: the reference runs without output poisoning)"
        )
    n_bad = int(table[:, 0].sum())
    off_norm = math.sqrt(float(table[:, 1].sum()))
    chunk = int(table[:, 2].argmax())
    worst_ratio, worst_flat = float(table[chunk, 2]), int(starts[chunk])
    kernel_rel = (
        off_norm / leaf.truth_norm if leaf.truth_norm else (0.0 if off_norm == 0 else math.inf)
    )
    norm_bound = factor * leaf.reference_error_norm + ROUNDINGS * u * leaf.truth_norm
    norm_ratio = off_norm / norm_bound if norm_bound else (0.0 if off_norm == 0 else math.inf)
    index = _unravel(worst_flat, shape)
    errors = (
        f"Normwise relative error against the truth: kernel {kernel_rel:.3g}, reference "
        f"{leaf.reference_error_rel:.3g}."
    )
    message = None
    if n_bad:
        r_v, d_v = r[worst_flat].item(), d[worst_flat].item()
        t_v = r_v - d_v
        message = (
            f"{path}: {n_bad} of {total} elements ({100 * n_bad / total:.3g}%) farther from the "
            f"{precision} truth than {factor:g}x the reference's own error allows "
            f"(|kernel - truth| <= {factor:g} (|reference - truth| + floor) + {ROUNDINGS:g} u "
            "|truth|, "
            f"u = {u:.3g}, floor = {floor:.3g}: max |reference - truth| + u rms(truth)). "
            f"Worst at index {index}: truth {t_v:.7g}, reference {r_v:.7g}, kernel "
            f"{g[worst_flat].item():.7g}. {errors}"
        )
    elif norm_ratio > 1:
        message = (
            f"{path}: normwise relative error against the {precision} truth {kernel_rel:.3g}, "
            f"above {factor:g}x the reference's {leaf.reference_error_rel:.3g} + {ROUNDINGS:g} u "
            f"(u = {u:.3g}) = {norm_bound_rel:.3g}, though every element is inside its bound."
        )
    ok = message is None
    report = LeafReport(
        path,
        tol,
        ok,
        message,
        float(table[:, 5].max()),
        float(table[:, 6].max()),
        max(worst_ratio, norm_ratio),
        index,
        notes,
        "values",
    )
    return TruthComparison(report, kernel_rel, leaf.reference_error_rel)


@dataclass(frozen=True)
class InformationLimits:
    """When an output counts as carrying no information (`information_failure`): the
    reference's noise relative to its own magnitude, elementwise (`abs_rel`, of max |ref|)
    and normwise (`norm_rel`, of ||ref||), and the relative error the rule allows (`rel`)."""

    abs_rel: float
    norm_rel: float
    rel: float


def information_failure(
    torch: Any, path: str, got: Any, expected: Any, limits: InformationLimits
) -> str | None:
    """Why `got` carries no information about `expected` (zeros, one constant, a scaled
    copy), or None. Finite elements on both sides only; chunked sums in float64."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or expected.numel() == 0:
        return None
    if expected.is_complex() or not expected.is_floating_point():
        return None
    total = expected.numel()
    g_all = got.detach().to(expected.device).reshape(-1)
    e_all = expected.detach().reshape(-1)
    rows = []
    steps = _steps(total)
    for lo in steps:
        hi = min(total, lo + steps.step)
        g = g_all[lo:hi].to(torch.float64)
        e = e_all[lo:hi].to(torch.float64)
        ok = torch.isfinite(g) & torch.isfinite(e)
        if not bool(ok.all()):
            g, e = g[ok], e[ok]
        if g.numel() == 0:
            continue
        rows.append(
            torch.stack(
                [
                    torch.tensor(float(g.numel()), dtype=torch.float64, device=g.device),
                    g.abs().max(),
                    g.min(),
                    g.max(),
                    e.abs().max(),
                    e.min(),
                    e.max(),
                    (g * e).sum(),
                    (e * e).sum(),
                    (g * g).sum(),
                ]
            )
        )
    if not rows:
        return None
    table = torch.stack(rows).cpu()
    n = int(table[:, 0].sum())
    g_abs, g_min, g_max = (
        float(table[:, 1].max()),
        float(table[:, 2].min()),
        float(table[:, 3].max()),
    )
    e_abs, e_min, e_max = (
        float(table[:, 4].max()),
        float(table[:, 5].min()),
        float(table[:, 6].max()),
    )
    ge, ee, gg = (float(table[:, i].sum()) for i in (7, 8, 9))
    noise_abs = limits.abs_rel * e_abs
    if g_abs == 0 and e_abs > noise_abs:
        return (
            f"{path}: the kernel returned all zeros; the reference reaches {e_abs:.3g} (its "
            f"noise: {noise_abs:.3g}). Zeros carry no information about it."
        )
    if n >= 2 and g_min == g_max and e_max - e_min > 2 * noise_abs:
        return (
            f"{path}: the kernel returned one value ({g_min:.7g}) for all {n} elements; the "
            f"reference ranges from {e_min:.7g} to {e_max:.7g}. A constant carries no "
            "information about it."
        )
    if n >= 2 and ee > 0 and g_abs > 0:
        scale = ge / ee
        e_norm = math.sqrt(ee)
        residual = math.sqrt(max(0.0, gg - scale * ge))
        off = abs(scale - 1) * e_norm
        if off > (limits.norm_rel + limits.rel) * e_norm and residual <= 0.5 * off:
            return (
                f"{path}: the kernel returned {scale:.6g} times the reference (after that "
                f"factor the normwise difference is {residual / e_norm:.3g}); a constant factor "
                f"off by {abs(scale - 1):.3g} is beyond the rule's relative allowance "
                f"{limits.norm_rel + limits.rel:.3g}."
            )
    return None


@dataclass(frozen=True)
class Calibration:
    """What the first call's truth says about one output, for every later call."""

    tolerance: Tolerance
    limits: InformationLimits


def calibrate(leaf: LeafTruth, precision: str, factor: float) -> Calibration:
    """Later calls' tolerance for one leaf (module docstring)."""
    u = leaf.unit_roundoff
    floor = leaf.reference_error_max + u * leaf.rms_truth
    rho = leaf.reference_error_rel
    source = (
        f"{truth_source(precision, factor)}, calibrated on the first trial "
        f"(reference's normwise error {rho:.3g})"
    )
    tol = Tolerance(
        rtol=ROUNDINGS * u,
        atol=factor * floor + (factor + 1) * leaf.reference_error_max,
        source=source,
        norm_rtol=(factor + 1) * rho + ROUNDINGS * u,
    )
    return Calibration(tol, limits_from_truth(leaf, factor, rel=0.0))


def limits_from_truth(leaf: LeafTruth, factor: float, rel: float) -> InformationLimits:
    u = leaf.unit_roundoff
    abs_rel = (
        factor * leaf.reference_error_max / leaf.truth_abs_max + ROUNDINGS * u
        if leaf.truth_abs_max
        else math.inf
    )
    return InformationLimits(abs_rel, factor * leaf.reference_error_rel + ROUNDINGS * u, rel)


class CorrectnessRule:
    """The rule one check decides by, with what it learns from the first call's truth.

    `set_truth(truth)` before the comparison of the call whose inputs the truth was run on;
    `judge` then compares that call with the truth, and every later call with the tolerance
    calibrated from it (`for_leaf`). Without a truth, or under a marker's rtol/atol (or a
    fixed tolerance), the dtype rule (`tolerance_rule`) decides. Usable as the
    `tolerance_for` of `compare.compare_outputs`.
    """

    def __init__(
        self,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        fixed: Tolerance | None = None,
        factor: float = FACTOR,
    ) -> None:
        self.rtol, self.atol, self.fixed, self.factor = rtol, atol, fixed, factor
        self.reduced: str | None = None  # the reference's fp32 matmuls ran in "tf32"/"bf16"
        self.truth: Truth | None = None
        self.calibrated: dict[str, Calibration] = {}
        self.kernel_error: float | None = None  # normwise relative, vs the truth (worst leaf)
        self.reference_error: float | None = None
        self._pending = False

    @property
    def overridden(self) -> bool:
        return self.fixed is not None or self.rtol is not None or self.atol is not None

    def set_truth(self, truth: Truth) -> None:
        self.truth = truth
        self._pending = truth.available

    @property
    def name(self) -> str:
        """Which rule decides, in words (the record's `rule`)."""
        if self.fixed is not None:
            return f"fixed tolerance ({self.fixed.source})"
        if self.overridden:
            return f"marker rtol={self.rtol}, atol={self.atol} (override)"
        if self.truth is None:
            return "dtype default (no higher-precision truth was run)"
        if not self.truth.available:
            return f"dtype default (no truth: {self.truth.skipped})"
        if self.reduced:
            return (
                f"{truth_source(self.truth.precision, self.factor)}, or the {self.reduced} "
                f"tolerance (its fp32 matmuls/convolutions may run in {self.reduced})"
            )
        return truth_source(self.truth.precision, self.factor)

    def fallback(self) -> Callable[[Any], Tolerance]:
        return tolerance_rule(
            reduced=self.reduced, rtol=self.rtol, atol=self.atol, fixed=self.fixed
        )

    def __call__(self, dtype: Any) -> Tolerance:
        return self.fallback()(dtype)

    def for_leaf(self, path: str, dtype: Any) -> Tolerance:
        """A later call's tolerance for the leaf at `path` (`compare.leaf_tolerance`).

        Where the reference's fp32 matmuls/convolutions may run reduced (TF32, bf16: the
        session's flags allow it), the same reference may be that inexact on any call (the
        check's deterministic mode alone makes cuDNN pick another algorithm), so the reduced
        precision's dtype tolerance is allowed too: the larger of the two."""
        found = self.calibrated.get(path)
        if found is None or self.overridden:
            return self.fallback()(dtype)
        if not self.reduced:
            return found.tolerance
        loose = self.fallback()(dtype)
        cal = found.tolerance
        return Tolerance(
            max(cal.rtol, loose.rtol),
            max(cal.atol, loose.atol),
            f"{cal.source}, or {loose.source}",
        )

    def _limits(self, torch: Any, path: str, expected: Any, tol: Tolerance) -> InformationLimits:
        found = self.calibrated.get(path)
        rel = tol.rtol if self.overridden or found is None or self.reduced else 0.0
        if found is not None:
            return InformationLimits(found.limits.abs_rel, found.limits.norm_rel, rel)
        u = unit_roundoff(torch, expected.dtype)
        return InformationLimits(ROUNDINGS * u, ROUNDINGS * u, rel)

    def judge(self, torch: Any, got: Any, expected: Any) -> list[LeafReport]:
        """One call's reports, one per output leaf (the truth's call first, if pending)."""
        if self._pending:
            self._pending = False
            reports = self._judge_with_truth(torch, got, expected)
        else:
            reports = compare_outputs(torch, got, expected, self)
        return self._with_information(torch, got, expected, reports)

    def _judge_with_truth(self, torch: Any, got: Any, expected: Any) -> list[LeafReport]:
        assert self.truth is not None
        precision = self.truth.precision or "float64"
        leaves = self.truth.leaves
        fallback = self.fallback()
        overridden = self.overridden

        class FirstPass:
            """Structure, integers, plain values and the override's verdict by their rule;
            the truth's leaves screened only (their values are judged below)."""

            def __call__(self, dtype: Any) -> Tolerance:
                return fallback(dtype)

            def for_leaf(self, path: str, dtype: Any) -> Tolerance:
                if path in leaves and not overridden:
                    return Tolerance(0.0, math.inf, STRUCTURE_ONLY_SOURCE)
                return fallback(dtype)

        reports = compare_outputs(torch, got, expected, FirstPass())
        by_report = {r.path: r for r in reports}
        got_leaves = dict(leaves_of(torch, got))
        exp_leaves = dict(leaves_of(torch, expected))
        kernel_errors, reference_errors = [], []
        for path, leaf in leaves.items():
            self.calibrated[path] = calibrate(leaf, precision, self.factor)
            exp_leaf, got_leaf = exp_leaves.get(path), got_leaves.get(path)
            report = by_report.get(path)
            if report is None or report.kind == "structure":
                continue  # the structure comparison names it
            if not isinstance(got_leaf, torch.Tensor) or not isinstance(exp_leaf, torch.Tensor):
                continue
            found = compare_with_truth(
                torch,
                path,
                got_leaf,
                exp_leaf,
                leaf,
                precision,
                self.factor,
            )
            if not overridden:
                by_report[path] = found.report
            if (
                not overridden
                and not found.report.ok
                and self.reduced
                and found.report.kind == "values"
            ):
                # The reduced precision's tolerance accepts too (see `for_leaf`).
                loose = compare_tensor(torch, path, got_leaf, exp_leaf, fallback(exp_leaf.dtype))
                if loose.ok:
                    loose.notes.append(
                        f"{path}: outside {found.report.tolerance.source}, inside "
                        f"{loose.tolerance.source}: accepted, as the reference's fp32 "
                        f"matmuls/convolutions may run in {self.reduced}"
                    )
                    by_report[path] = loose
            kernel_errors.append(found.kernel_error)
            reference_errors.append(found.reference_error)
        # Calibrated: later calls need only the numbers (the caller's Truth keeps its own).
        self.truth = replace(
            self.truth,
            leaves={p: replace(v, difference=None) for p, v in self.truth.leaves.items()},
        )
        if kernel_errors:
            self.kernel_error = max(kernel_errors)
            self.reference_error = max(reference_errors)
        return [by_report[r.path] for r in reports]

    def _with_information(
        self, torch: Any, got: Any, expected: Any, reports: list[LeafReport]
    ) -> list[LeafReport]:
        got_leaves = dict(leaves_of(torch, got))
        exp_leaves = dict(leaves_of(torch, expected))
        out = []
        for report in reports:
            exp_leaf = exp_leaves.get(report.path)
            # A leaf that passed by the truth's rule (or its calibration) is no constant, zero
            # or scaled copy beyond its noise: that rule is tighter. The others are checked,
            # and a failing leaf gets the diagnosis in its message.
            by_truth = report.path in self.calibrated and not (self.overridden or self.reduced)
            judged = not by_truth if report.ok else report.kind == "values"
            if judged and isinstance(exp_leaf, torch.Tensor) and exp_leaf.is_floating_point():
                limits = self._limits(torch, report.path, exp_leaf, report.tolerance)
                why = information_failure(
                    torch, report.path, got_leaves.get(report.path), exp_leaf, limits
                )
                if why is not None:
                    # Failing by the values already: the diagnosis leads the message.
                    text = why if report.ok else f"{why} {report.message}"
                    report = LeafReport(
                        report.path,
                        report.tolerance,
                        False,
                        text,
                        report.max_abs,
                        report.max_rel,
                        math.inf,
                        report.worst_index,
                        report.notes,
                        "information",
                    )
            out.append(report)
        return out

    def summary(self) -> dict[str, Any]:
        """The record's fields: rule, factor, both errors, the truth's precision and cost."""
        truth = self.truth.summary() if self.truth is not None else None
        return {
            "rule": self.name,
            "factor": self.factor if self.truth is not None and self.truth.available else None,
            "kernel_error": self.kernel_error,
            "reference_error": self.reference_error,
            "truth": truth,
        }
