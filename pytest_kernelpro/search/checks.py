"""Worker-side building blocks: poisoned allocation, output comparison, anti-cheating guards,
timing. Imported only inside the sandbox worker (and by tests), so torch is imported at the
top. `harness.py` puts them together into the KernelBench evaluation pipeline.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import statistics
import time
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Reference-module names that are part of the problem format, not of the computation.
PROBLEM_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs", "get_inputs_variants"})

# (atol, rtol) by output dtype: KernelBench's fp32 1e-4 and half-precision 1e-2.
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1e-2, 1e-2),
}


def classify_exception(exc: BaseException) -> str:
    """One line naming an exception, with out-of-memory and CUDA errors called out."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    lowered = str(exc).lower()
    oom_types = tuple(
        t
        for t in (
            getattr(torch, "OutOfMemoryError", None),
            getattr(torch.cuda, "OutOfMemoryError", None),
        )
        if t is not None
    )
    if (
        isinstance(exc, MemoryError)
        or isinstance(exc, oom_types)
        or ("out of memory" in lowered or "can't allocate memory" in lowered)
    ):
        return f"out of memory: {name}: {text}"[:400]
    if "illegal memory access" in lowered or "illegal address" in lowered:
        return f"illegal memory access: {name}: {text}"[:400]
    if "cuda error" in lowered or name == "AcceleratorError":
        return f"CUDA error: {name}: {text}"[:400]
    return f"{name}: {text}"[:400]


def tolerance_for(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for comparing outputs of `dtype`; exact for integers and bools."""
    if dtype in _TOLERANCES:
        return _TOLERANCES[dtype]
    if dtype.is_floating_point:  # fp8 and other narrow floats
        return (1e-1, 1e-1)
    return (0.0, 0.0)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Make `torch.empty` & co. return NaN-filled memory (max value for integers) inside.

    Uses torch's deterministic mode with `fill_uninitialized_memory`, which fills every
    uninitialized allocation, so an output element a kernel never writes stays NaN and
    fails the comparison. `warn_only=True` keeps ops without a deterministic
    implementation running; their warnings are swallowed here.
    """
    det = getattr(torch.utils, "deterministic", None)
    prev_enabled = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = getattr(det, "fill_uninitialized_memory", None)
    # torch.use_deterministic_algorithms also sets an inductor config, which imports
    # torch._dynamo (several seconds per worker); the C setter it wraps is all we need.
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        setter = torch.use_deterministic_algorithms
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setter(True, warn_only=True)
        if det is not None:
            det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            setter(prev_enabled, warn_only=prev_warn)
            if det is not None and prev_fill is not None:
                det.fill_uninitialized_memory = prev_fill


# ----- outputs -----


def flatten(value: Any) -> list[Any]:
    """Leaves of a (nested) tuple/list/dict output, in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in flatten(value[key])]
    return [value]


def clone_tree(value: Any) -> Any:
    """Deep copy of tensors inside a (nested) output or argument list."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone_tree(v) for v in value)
    if isinstance(value, dict):
        return {k: clone_tree(v) for k, v in value.items()}
    return value


def compare(
    reference: Any, output: Any, atol: float | None = None, rtol: float | None = None
) -> tuple[bool, dict[str, Any]]:
    """Compare a candidate's output with the reference's. NaN in the output never passes.

    Returns (ok, detail) where detail has max abs/rel error, the first bad index and why.
    """
    ref_leaves, out_leaves = flatten(reference), flatten(output)
    if len(ref_leaves) != len(out_leaves):
        return False, {"why": f"{len(out_leaves)} outputs, expected {len(ref_leaves)}"}
    detail: dict[str, Any] = {"max_abs_err": 0.0, "max_rel_err": 0.0}
    for i, (ref, out) in enumerate(zip(ref_leaves, out_leaves, strict=True)):
        if not isinstance(ref, torch.Tensor):
            if isinstance(out, torch.Tensor) or ref != out:
                return False, {"why": f"output {i}: {out!r}, expected {ref!r}"}
            continue
        if not isinstance(out, torch.Tensor):
            return False, {"why": f"output {i} is {type(out).__name__}, expected a tensor"}
        if tuple(out.shape) != tuple(ref.shape):
            return False, {
                "why": f"output {i} shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
            }
        if out.dtype != ref.dtype:
            return False, {"why": f"output {i} dtype {out.dtype}, expected {ref.dtype}"}
        a_tol, r_tol = tolerance_for(ref.dtype)
        a_tol = a_tol if atol is None else atol
        r_tol = r_tol if rtol is None else rtol
        detail.update(atol=a_tol, rtol=r_tol)
        o = out.detach().to("cpu", torch.float64) if out.is_floating_point() else out.cpu()
        r = ref.detach().to("cpu", torch.float64) if ref.is_floating_point() else ref.cpu()
        if o.is_floating_point():
            nan = torch.isnan(o)
            if bool(nan.any()):
                index = _first_index(nan)
                return False, {
                    **detail,
                    "why": f"output {i} has NaN at {index} "
                    f"({int(nan.sum())} elements never written?)",
                }
            # Infinities must match exactly; a NaN in the reference can never be matched
            # (the output's NaN is rejected above). Elsewhere: |o - r| <= atol + rtol·|r|.
            special = torch.isinf(r) | torch.isnan(r)
            diff = torch.where(special, torch.zeros_like(r), (o - r).abs())
            rel = diff / r.abs().clamp_min(1e-12)
            bad = (diff > (a_tol + r_tol * r.abs())) | (special & (o != r))
        else:
            diff = (o.long() - r.long()).abs().double() if o.dtype != torch.bool else (o != r)
            diff = diff.double()
            rel = diff
            bad = diff > 0
        if diff.numel():
            detail["max_abs_err"] = max(detail["max_abs_err"], float(diff.max()))
            detail["max_rel_err"] = max(detail["max_rel_err"], float(rel.max()))
        if bool(bad.any()):
            index = _first_index(bad)
            return False, {
                **detail,
                "why": f"output {i} differs at {index}: "
                f"got {float(o[index]):.6g}, expected {float(r[index]):.6g} "
                f"({int(bad.sum())}/{bad.numel()} elements beyond "
                f"atol={a_tol:g}, rtol={r_tol:g})",
            }
    return True, detail


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(v) for v in mask.nonzero()[0].tolist())


def same_values(a: Any, b: Any) -> bool:
    """True when two outputs are bitwise equal (NaNs equal), leaf by leaf."""
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            xc, yc = x.detach().cpu(), y.detach().cpu()
            if torch.equal(xc, yc):
                continue
            if not xc.is_floating_point() or not bool(
                torch.isclose(xc, yc, rtol=0, atol=0, equal_nan=True).all()
            ):
                return False
        elif x != y:
            return False
    return True


def shares_storage(output: Any, inputs: Sequence[Any]) -> bool:
    """True when an output tensor overlaps the memory of an input tensor."""
    spans = []
    for t in flatten(list(inputs)):
        if isinstance(t, torch.Tensor) and t.numel():
            storage = t.untyped_storage()
            spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    for t in flatten(output):
        if isinstance(t, torch.Tensor) and t.numel():
            start = t.untyped_storage().data_ptr()
            end = start + t.untyped_storage().nbytes()
            if any(start < hi and lo < end for lo, hi in spans):
                return True
    return False


# ----- guards -----


class OpRecorder(TorchDispatchMode):
    """Records the aten ops run inside it (below autograd, so composite ops decompose)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.add(str(func.overloadpacket))  # e.g. "aten.mm"
        self.ops.add(str(func))  # e.g. "aten.mm.default"
        return func(*args, **(kwargs or {}))


def normalize_op(name: str) -> str:
    """ "mm", "aten::mm", "aten.mm" → "aten.mm"; an overload ("aten.mm.default") is kept."""
    name = name.strip().replace("::", ".")
    return name if "." in name else f"aten.{name}"


def forbidden_used(recorded: set[str], forbidden: Sequence[str]) -> list[str]:
    """Forbidden ops (normalized) that appear among the recorded ones."""
    return sorted({normalize_op(f) for f in forbidden} & recorded)


class ReferenceGuard:
    """Counts calls into the reference module while `active` (during the candidate's run).

    Wraps `forward` of every nn.Module class defined in the reference module and every
    plain function there (except the problem-format functions). Install it before the
    candidate's module is executed, so that functions it imports are already wrapped.
    """

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.active = False
        self.calls: dict[str, int] = {}
        self._restore: list[Callable[[], None]] = []

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.calls[label] = self.calls.get(label, 0) + 1
            return fn(*args, **kwargs)

        return wrapper

    def install(self) -> ReferenceGuard:
        name = self.module.__name__
        for attr, obj in list(vars(self.module).items()):
            if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == name:
                original = obj.__dict__.get("forward")
                if original is not None:
                    obj.forward = self._wrap(f"{attr}.forward", original)
                    self._restore.append(functools.partial(setattr, obj, "forward", original))
            elif (
                inspect.isfunction(obj) and obj.__module__ == name and attr not in PROBLEM_FUNCTIONS
            ):
                setattr(self.module, attr, self._wrap(attr, obj))
                self._restore.append(functools.partial(setattr, self.module, attr, obj))
        return self

    def uninstall(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()


class StreamGuard:
    """Records CUDA streams the candidate creates or switches to (no-op without CUDA).

    Installed before the candidate's module runs, so streams created at import time count.
    `torch.cuda.stream(s)` goes through `torch.cuda.set_stream`, which is patched too.
    """

    def __init__(self) -> None:
        self.events: list[str] = []
        self.active = False
        self._restore: list[Callable[[], None]] = []

    def install(self) -> StreamGuard:
        if not torch.cuda.is_available():
            return self
        guard = self
        original_stream = torch.cuda.Stream

        # Only `torch.cuda.Stream` is replaced (not `torch.cuda.streams.Stream`, which
        # `Stream.__eq__` uses for its isinstance check). `torch.cuda.current_stream()` builds
        # its result through this name too, always with `stream_id=`: those are not new
        # streams, so only calls without `stream_id` count.
        class CountingStream(original_stream):  # type: ignore[misc, valid-type]
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                if guard.active and "stream_id" not in kwargs:
                    guard.events.append("created a torch.cuda.Stream")
                return super().__new__(cls, *args, **kwargs)

        original_set = torch.cuda.set_stream

        def set_stream(stream: Any) -> None:
            if guard.active and stream is not None and stream != torch.cuda.current_stream():
                guard.events.append(f"switched to stream {getattr(stream, 'stream_id', '?')}")
            original_set(stream)

        torch.cuda.Stream = CountingStream  # type: ignore[misc]
        torch.cuda.set_stream = set_stream
        self._restore += [
            functools.partial(setattr, torch.cuda, "Stream", original_stream),
            functools.partial(setattr, torch.cuda, "set_stream", original_set),
        ]
        return self

    def uninstall(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()


# ----- timing -----


def measure(
    fn: Callable[[], Any],
    device: torch.device,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_samples: int = 5,
    max_samples: int = 100,
) -> dict[str, Any]:
    """Median time of `fn` the way triton's `do_bench` does it (budgets in ms).

    GPU: an estimate from 5 calls, `max(1, ...)` warm-up and sample counts, a 256 MB write
    before every sample to flush the L2, one CUDA event pair per sample. CPU: perf_counter.
    """
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    sync()
    estimate_ms = max((time.perf_counter() - t0) * 1e3 / 5, 1e-4)
    n_warmup = max(1, int(warmup_ms / estimate_ms))
    n_samples = min(max_samples, max(min_samples, int(rep_ms / estimate_ms)))
    for _ in range(n_warmup):
        fn()
    sync()
    samples: list[float] = []
    if cuda:
        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=device)
        pairs = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(n_samples)
        ]
        for start, end in pairs:
            flush.zero_()
            start.record()
            fn()
            end.record()
        sync()
        samples = [start.elapsed_time(end) * 1e-3 for start, end in pairs]
        del flush
    else:
        for _ in range(n_samples):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
    ordered = sorted(samples)
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    return {
        "median_s": statistics.median(samples),
        "min_s": ordered[0],
        "iqr_s": q3 - q1,
        "samples": len(samples),
        "method": "cuda_event+l2_flush" if cuda else "perf_counter",
    }
