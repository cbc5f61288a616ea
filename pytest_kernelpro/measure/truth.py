"""The truth: the reference re-run in higher precision on the same inputs (`run_truth`),
and the reference's own error against it, per floating output (`Truth`, `LeafTruth`). The
correctness rule (`measure/accuracy.py`) measures the kernel by it: a kernel may be as far
from this truth as a stated factor times the reference's own error.

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

Imports only the standard library and `measure/` at module level (torch is passed in), so
the sandbox's child processes import it without the plugin.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.measure import compare as _compare
from pytest_kernelpro.measure.tolerance import apply_fp32_precision_flags, fp32_precision_flags

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
