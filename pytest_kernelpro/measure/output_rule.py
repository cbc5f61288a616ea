"""The correctness rule: how close a kernel's output must be to the reference's, given the
reference's own error. One rule for the gate's check (`correctness_check`) and the
optimizer's sandbox, so an output that passes one passes the others.

Per floating output (t: the truth, the reference re-run wider by `correctness_check.run_truth`;
r: the reference; k: the kernel; u: the output dtype's unit roundoff; F = `FACTOR`, R =
`ROUNDINGS`):

- the call the truth ran on: |k - t| <= F (|r - t| + s) + R u |t| per element, with the floor
  s = max |r - t| + u rms(t) (a scale of the output, not a fixed atol), and ||k - t|| <= F
  ||r - t|| + R u ||t||: the same math in another order passes, F times the reference's
  error does not.
- later calls (other inputs) compare with the reference by what the first call measured
  (`calibrate`): |k - r| <= R u |r| + F s + (F + 1) m (m = max |r - t|) and ||k - r|| <=
  ((F + 1) rho + R u) ||r|| (rho: the reference's normwise relative error).
- without a truth (`Truth.skipped` says why) the dtype's tolerance decides as torch.allclose
  does (`tolerance_rule`); an fp32 reference whose matmuls may run reduced (TF32, bf16) gets
  that type's tolerance too. A marker's rtol/atol override the rule; `CorrectnessRule.name`
  records which decided.
- an output that carries no information fails in every mode (zeros, one constant, or the
  reference times a constant beyond the rule's relative allowance: a softmax over 393,216
  columns is 2.5e-6 everywhere, so zeros pass any fixed atol); `information_failure` checks
  it where the truth's rule does not decide.
- NaN passes only where the reference has NaN at the same place; shapes, dtypes and
  structures must match; integers and booleans compare exactly.

Pure arithmetic on outputs, leaf by leaf, chunked (`chunk_ranges`). Imports only the standard
library and `errors` (torch is passed in), so the sandbox's children import it without the
plugin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

from pytest_kernelpro.errors import KernelproError

# The kernel may be this many times farther from the truth than the reference is. A
# reordering of the same sums has an error of the reference's own size (elementwise, up to
# the reference's largest, which the floor carries); one precision step coarser (fp32 ->
# TF32: 2^13 times) is far outside.
FACTOR = 8.0
# Roundings of the output's dtype a kernel may differ by beyond that (where the reference is
# exact, or its error is below one rounding): its last rounding may go the other way.
ROUNDINGS = 2.0


# (rtol, atol) per dtype name where no truth decides: a few of the dtype's unit roundoffs u
# for a result of order 1 computed in another order than the reference.
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
# TF32 keeps fp16's 10 mantissa bits: an fp32 result from TF32 tensor cores gets fp16's
# tolerance (fp32 matmuls in bf16 get bf16's).
_TF32 = (1e-2, 1e-2)


@dataclass(frozen=True)
class Tolerance:
    """Per-element tolerance, torch.allclose semantics; `source` says where it came from;
    `norm_rtol`: also ||got - expected|| <= norm_rtol ||expected|| over the finite elements
    (a truth's rule), None: elementwise only."""

    rtol: float
    atol: float
    source: str
    norm_rtol: float | None = None


def default_tolerance(dtype: Any, reduced: str | None = None) -> Tolerance:
    """The tolerance of a reference output of `dtype` (a torch dtype or its name; None: a
    plain value, exact). `reduced`: an fp32 reference whose matmuls may run in "tf32"
    (float32 and complex64 outputs) or "bf16" (float32 only, as its flag governs real fp32
    matmuls) gets that type's tolerance. Integers and bool compare exactly."""
    if dtype is None:
        return Tolerance(0.0, 0.0, "exact for non-tensor outputs")
    name = str(dtype).removeprefix("torch.")
    label = f"torch.{name}"
    if name == "float32" and reduced == "bf16":
        rtol, atol = _FLOAT_TOLERANCES["bfloat16"]
        return Tolerance(rtol, atol, f"default for {label} with fp32 matmuls in bf16")
    if name in ("float32", "complex64") and reduced == "tf32":
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
    *, reduced: str | None = None, rtol: float | None = None, atol: float | None = None
) -> Callable[[Any], Tolerance]:
    """dtype -> its `Tolerance`: the dtype's default relaxed by `reduced`
    (`default_tolerance`), with a marker's `rtol`/`atol` replacing its fields (source
    "marker")."""

    def tolerance_for(dtype: Any) -> Tolerance:
        base = default_tolerance(dtype, reduced)
        if rtol is None and atol is None:
            return base
        return Tolerance(
            rtol=base.rtol if rtol is None else rtol,
            atol=base.atol if atol is None else atol,
            source="marker",
        )

    return tolerance_for


# KernelBench's own check, recorded beside the gate's verdict for comparison with its numbers.
KERNELBENCH = Tolerance(1e-2, 1e-2, "KernelBench's check: torch.allclose(atol=1e-2, rtol=1e-2)")


TolFor = Callable[[Any], Tolerance]  # an output's dtype (None: a plain value) -> its tolerance


def json_float(value: float) -> float | str:
    """A float for JSON: finite as is, else "inf", "-inf" or "nan"."""
    return value if math.isfinite(value) else str(value)


def unit_roundoff(torch: Any, dtype: Any) -> float:
    """Half an ulp at 1.0 of a floating dtype (complex: of its real part)."""
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    return float(torch.finfo(dtype).eps) / 2


def leaves_of(torch: Any, obj: Any, path: str = "output") -> list[tuple[str, Any]]:
    """(path, leaf) of an output structure in order, named as `compare_outputs` names them."""
    found: list[tuple[str, Any]] = []
    stack = [(path, obj)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, (list, tuple)):
            for i in range(len(item) - 1, -1, -1):  # loops: a generator's frame is a call
                stack.append((f"{where}[{i}]", item[i]))
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                stack.append((f"{where}[{key!r}]", item[key]))
        else:
            found.append((where, item))
    return found


def tensor_leaves(torch: Any, obj: Any) -> list[Any]:
    """The tensors of nested lists, tuples (named too) and dicts, in `leaves_of`'s order."""
    found = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def map_tensors(torch: Any, obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` with each tensor of `tensor_leaves` replaced, in order, by `fn(tensor)`; the
    containers are new (a namedtuple's type kept), other objects shared."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):  # a tensor item mapped here, in a loop: no call
        tensor, items = torch.Tensor, []
        for x in obj:
            items.append(fn(x) if isinstance(x, tensor) else map_tensors(torch, x, fn))
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return {k: map_tensors(torch, v, fn) for k, v in obj.items()}
    return obj


def clone_inputs(torch: Any, obj: Any) -> Any:
    """Deep copy of tensors (strides kept) inside lists/tuples/dicts; other objects shared.
    A clone made without grad is detached (`tensor.detach().clone()`), and `torch.clone` is
    C: no call per tensor."""
    with torch.no_grad():
        return map_tensors(torch, obj, torch.clone)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


# Elements compared at once: at least COMPARE_CHUNK, else a 32nd of the output, so the
# temporaries stay near a fifth of a large output's size in at most 32 chunks. On the CPU at
# most CPU_COMPARE_CHUNK, so a chunk's float64 temporaries stay below glibc's mmap threshold
# and are reused, not faulted in again (bench/results/2026-12-05-optimizer-memory-cpu.md).
COMPARE_CHUNK = 1 << 22
COMPARE_MAX_CHUNKS = 32
CPU_COMPARE_CHUNK = 1 << 20


def chunk_ranges(total: int, device: Any = None) -> range:
    """The start of each chunk of `total` elements on `device` (a torch device, its type, or
    None: a GPU); the step is the chunk's length. The sizes are read at call time (tests
    shrink them)."""
    step = max(COMPARE_CHUNK, -(-total // COMPARE_MAX_CHUNKS))
    if getattr(device, "type", device) == "cpu":
        step = min(step, CPU_COMPARE_CHUNK)
    return range(0, total, step)


def _ratio(num: float, den: float) -> float:
    """num / den, and 0 / 0 = 0, x / 0 = inf."""
    return num / den if den else (0.0 if num == 0 else math.inf)


def _both_nan_note(path: str, count: int) -> str:
    return (
        f"{path}: the reference itself produced NaN at {count} element(s) and the kernel "
        "has NaN at the same places (accepted: the reference runs without output poisoning)"
    )


@dataclass
class LeafReport:
    """The comparison of one output leaf (one tensor or value)."""

    path: str
    tolerance: Tolerance
    ok: bool
    message: str | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_ratio: float = 0.0  # max |err| / (atol + rtol |expected|); inf for NaN/exact misses
    worst_index: tuple[int, ...] | None = None
    notes: list[str] = field(default_factory=list)
    kind: str = "values"  # what failed: "values" (beyond tolerance), "nan", "exact", "structure"


def _describe(torch: Any, obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        dtype = str(obj.dtype).removeprefix("torch.")
        return f"a tensor of shape {tuple(obj.shape)} dtype {dtype}"
    if isinstance(obj, (list, tuple)):
        return f"a {type(obj).__name__} of {len(obj)} items"
    if isinstance(obj, dict):
        return f"a dict with keys {sorted(map(str, obj))}"
    return f"{type(obj).__name__} {obj!r}"[:120]


def _mismatch(torch: Any, path: str, tol: Tolerance, got: Any, expected: Any) -> LeafReport:
    text = f"{path}: kernel returned {_describe(torch, got)}; reference returned {_describe(torch, expected)}."
    return LeafReport(path, tol, False, text, worst_ratio=math.inf, kind="structure")


def _fmt(value: Any) -> str:
    return f"{value:.7g}" if isinstance(value, (float, complex)) else repr(value)


def compare_outputs(
    torch: Any, got: Any, expected: Any, tolerance_for: TolFor, path: str = "output"
) -> list[LeafReport]:
    """One `LeafReport` per leaf of `got` (kernel) against `expected` (reference); a
    structure mismatch is one failing report where the structures part (tuples and lists
    are interchangeable)."""
    if isinstance(expected, torch.Tensor):
        return [
            compare_tensor(
                torch, path, got, expected, leaf_tolerance(tolerance_for, path, expected.dtype)
            )
        ]
    if isinstance(expected, (list, tuple, dict)):
        is_dict = isinstance(expected, dict)
        if (
            not isinstance(got, dict if is_dict else (list, tuple))
            or len(got) != len(expected)
            or (is_dict and set(got) != set(expected))
        ):
            return [_mismatch(torch, path, tolerance_for(None), got, expected)]
        reports: list[LeafReport] = []
        for key in list(expected) if is_dict else range(len(expected)):
            sub = f"{path}[{key!r}]" if is_dict else f"{path}[{key}]"
            reports.extend(compare_outputs(torch, got[key], expected[key], tolerance_for, sub))
        return reports
    return [_compare_value(torch, path, got, expected, tolerance_for)]


def leaf_tolerance(tolerance_for: TolFor, path: str, dtype: Any) -> Tolerance:
    """The tolerance of the leaf at `path`: by `tolerance_for.for_leaf` where the rule
    calibrates per output (`CorrectnessRule`), else by dtype."""
    for_leaf = getattr(tolerance_for, "for_leaf", None)
    return for_leaf(path, dtype) if for_leaf is not None else tolerance_for(dtype)


def _compare_value(
    torch: Any, path: str, got: Any, expected: Any, tolerance_for: TolFor
) -> LeafReport:
    """Plain Python leaves: floats with the tolerance (float64's by default), others by ==."""
    is_number = isinstance(got, (int, float)) and not isinstance(got, bool)
    if not (isinstance(expected, float) and is_number):
        tol = tolerance_for(None)
        if type(got) is type(expected) and got == expected:
            return LeafReport(path, tol, True)
        return _mismatch(torch, path, tol, got, expected)
    tol = tolerance_for("float64")
    if math.isnan(expected) and math.isnan(got):
        note = f"{path}: the reference produced NaN and so did the kernel (accepted)"
        return LeafReport(path, tol, True, notes=[note])
    diff = abs(got - expected)
    limit = tol.atol + tol.rtol * abs(expected)
    ratio = _ratio(diff, limit)
    ok = not math.isnan(diff) and ratio <= 1.0
    rel = diff / abs(expected) if expected else 0.0
    msg = (
        None
        if ok
        else (
            f"{path}: expected {_fmt(expected)}, got {_fmt(got)} "
            f"(rtol={tol.rtol:g}, atol={tol.atol:g}, {tol.source})."
        )
    )
    return LeafReport(path, tol, ok, msg, diff, rel, ratio if ok or ratio > 1 else math.inf)


def _first_index(torch: Any, name: str, gd: Any, ed: Any) -> int:
    """The first element of one chunk where mask `name` holds."""
    g_nan, e_nan = torch.isnan(gd), torch.isnan(ed)
    if name == "nan":
        mask = g_nan & ~e_nan
    elif name == "missing nan":
        mask = e_nan & ~g_nan
    else:
        mask = ~g_nan & ~e_nan & ~(torch.isfinite(gd) & torch.isfinite(ed)) & (gd != ed)
    return int(mask.nonzero()[0])


# A leaf tolerance that asks for the shape and dtype only (`compare_with_truth` judges values).
STRUCTURE_ONLY_SOURCE = "shape and dtype only (values judged against the truth)"


def compare_tensor(torch: Any, path: str, got: Any, exp: Any, tol: Tolerance) -> LeafReport:
    """One tensor pair: shape/dtype first, then exact (int/bool) or allclose (float)."""
    if not isinstance(got, torch.Tensor):
        return _mismatch(torch, path, tol, got, exp)
    if tuple(got.shape) != tuple(exp.shape) or got.dtype != exp.dtype:
        g_dtype = str(got.dtype).removeprefix("torch.")
        e_dtype = str(exp.dtype).removeprefix("torch.")
        text = (
            f"{path}: kernel returned shape {tuple(got.shape)} dtype {g_dtype}; "
            f"reference returned {tuple(exp.shape)} {e_dtype}."
        )
        return LeafReport(path, tol, False, text, worst_ratio=math.inf, kind="structure")
    if exp.numel() == 0 or tol.source == STRUCTURE_ONLY_SOURCE:
        return LeafReport(path, tol, True)
    g, e = got.detach().to(exp.device), exp.detach()
    if exp.dtype.is_floating_point or exp.dtype.is_complex:
        return _compare_float(torch, path, g, e, tol)
    return _compare_exact(torch, path, g, e, tol)


def _compare_exact(torch: Any, path: str, g: Any, e: Any, tol: Tolerance) -> LeafReport:
    """Integers and bool: every element equal."""
    shape, total = tuple(e.shape), e.numel()
    bad = (g != e).reshape(-1)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return LeafReport(path, tol, True)
    flat = int(bad.nonzero()[0])
    index = _unravel(flat, shape)
    got_v, exp_v = g.reshape(-1)[flat].item(), e.reshape(-1)[flat].item()
    text = (
        f"{path}: {n_bad} of {total} elements ({100 * n_bad / total:.3g}%) differ "
        f"({tol.source}); first at index {index}: expected {exp_v!r}, got {got_v!r}."
    )
    if e.dtype != torch.bool and got_v == torch.iinfo(e.dtype).max:
        dtype = str(e.dtype).removeprefix("torch.")
        text += (
            f" {got_v} is the poison value for {dtype}: that element was probably never written."
        )
    return LeafReport(path, tol, False, text, worst_ratio=math.inf, worst_index=index, kind="exact")


def _work_dtype(torch: Any, dtype: Any) -> Any:
    """float64 (complex128) for those outputs, else float32 (complex64): its rounding is far
    below any narrower dtype's rtol, at half the memory of float64 temporaries."""
    if dtype.is_complex:
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    return torch.float64 if dtype == torch.float64 else torch.float32


def _compare_float(torch: Any, path: str, g: Any, e: Any, tol: Tolerance) -> LeafReport:
    """Floating/complex: allclose per element (and normwise where the tolerance has a normwise
    bound), NaN and infinities explained."""
    shape = tuple(e.shape)
    work = _work_dtype(torch, e.dtype)
    g_flat, e_flat = g.reshape(-1), e.reshape(-1)
    table, starts = _allclose_pass(torch, g_flat, e_flat, tol, work)
    counts = {name: int(table[:, i].sum()) for i, name in enumerate(_MISSES)}
    n_both_nan = int(table[:, 4].sum())
    max_abs, max_rel = float(table[:, 5].max()), float(table[:, 6].max())
    best_chunk = int(table[:, 7].argmax())  # the first chunk holding the largest ratio
    worst_ratio, worst_flat = float(table[best_chunk, 7]), int(starts[best_chunk])
    notes = [_both_nan_note(path, n_both_nan)] if n_both_nan else []
    if any(counts.values()):
        # The message names the first non-number problem (ratio inf), else the largest ratio.
        total, kind = e_flat.numel(), "values"
        step = chunk_ranges(total, e_flat.device).step
        n_bad = sum(counts.values())
        parts = [
            f"{path}: {n_bad} of {total} elements ({100 * n_bad / total:.3g}%) outside "
            f"rtol={tol.rtol:g}, atol={tol.atol:g} ({tol.source})."
        ]
        for i, name in enumerate(_MISSES[:3]):
            if not counts[name]:
                continue
            lo = int((table[:, i] > 0).nonzero()[0]) * step
            pair = g_flat[lo : lo + step].to(work), e_flat[lo : lo + step].to(work)
            first_flat = lo + _first_index(torch, name, *pair)
            if kind == "values":
                kind, worst_flat, worst_ratio = "nan", first_flat, math.inf
            at = _unravel(first_flat, shape)
            parts.append(
                {
                    "nan": f"{counts[name]} NaN where the reference is a number, first at index "
                    f"{at}: never written by the kernel (outputs are poisoned with NaN before "
                    "it runs) or computed as NaN.",
                    "missing nan": f"{counts[name]} element(s) where the reference is NaN and "
                    f"the kernel is not, first at index {at}.",
                    "inf": f"{counts[name]} element(s) with an infinity on one side only or of "
                    f"the other sign, first at index {at}.",
                }[name]
            )
        index = _unravel(worst_flat, shape)
        exp_v, got_v = e_flat[worst_flat].item(), g_flat[worst_flat].item()
        parts.append(f"Worst at index {index}: expected {_fmt(exp_v)}, got {_fmt(got_v)}.")
        if counts["over"]:
            parts.append(
                f"Max abs error {max_abs:.3g}, max rel error {max_rel:.3g} "
                "(over the elements that are numbers on both sides)."
            )
        message = " ".join(parts)
        return LeafReport(
            path, tol, False, message, max_abs, max_rel, worst_ratio, index, notes, kind
        )
    index = _unravel(worst_flat, shape)
    if tol.norm_rtol is not None:
        diff_norm = math.sqrt(float(table[:, 8].sum()))
        exp_norm = math.sqrt(float(table[:, 9].sum()))
        if diff_norm > tol.norm_rtol * exp_norm:
            rel_norm = diff_norm / exp_norm if exp_norm else math.inf
            text = (
                f"{path}: normwise relative error {rel_norm:.3g} above {tol.norm_rtol:.3g} "
                f"({tol.source}), though every element is inside rtol={tol.rtol:.3g}, "
                f"atol={tol.atol:.3g}."
            )
            return LeafReport(path, tol, False, text, max_abs, max_rel, worst_ratio, index, notes)
    return LeafReport(path, tol, True, None, max_abs, max_rel, worst_ratio, index, notes)


def _two_stage_pass(
    torch: Any,
    flats: tuple[Any, ...],
    chunk: Callable[[tuple[Any, ...], bool], tuple[Any, Any]],
    settled: Callable[[Any], bool],
) -> tuple[Any, Any]:
    """The chunked passes' shape: each chunk (`chunk_ranges` of the first of the flat tensors
    `flats`) taken by `chunk(its views of flats, False)`, without the NaN and infinity screens;
    one synchronization reads the table; a row `settled` refuses is taken again by `chunk(...,
    True)`. Each returns (row, where its largest ratio is in the chunk, or None). Returns the
    table on the CPU and those places as flat indices on the CPU (None where there are none).

    Rows and places are written into tensors made at the first chunk: a small tensor kept
    per chunk sits among the chunk's freed temporaries, so glibc cannot reuse them whole and
    the heap grows by about a chunk per chunk
    (bench/results/2026-12-06-optimizer-memory8-cpu.md)."""
    steps = chunk_ranges(flats[0].numel(), flats[0].device)
    if not len(steps):
        return torch.stack([]).cpu(), None  # no chunk: no table
    table: Any = None
    places: Any = None
    for index, lo in enumerate(steps):
        row, at = chunk(tuple(map(itemgetter(slice(lo, lo + steps.step)), flats)), False)
        if table is None:
            table = row.new_empty((len(steps), *row.shape))
        table[index] = row
        if at is not None:
            if places is None:
                places = at.new_empty((len(steps), *at.shape))
            places[index] = at + lo
        del row, at
    table = table.cpu()  # the one synchronization
    for index, lo in enumerate(steps):
        if not settled(table[index]):
            row, at = chunk(tuple(map(itemgetter(slice(lo, lo + steps.step)), flats)), True)
            table[index] = row.cpu()
            if at is not None:
                places[index] = at + lo
    return table, None if places is None else places.cpu()


# The kinds of element an allclose misses, in the columns of `_allclose_pass`'s table.
_MISSES = ("nan", "missing nan", "inf", "over")


def _allclose_pass(
    torch: Any, g_flat: Any, e_flat: Any, tol: Tolerance, work: Any
) -> tuple[Any, Any]:
    """One chunked pass over a flat output pair: per chunk the counts of `_MISSES`, both-NaN,
    max abs and rel error, the largest ratio |err| / (atol + rtol |expected|) and the sums of
    squares of the errors and expected values; and where each chunk's largest ratio is.

    Unscreened first (a third of the element operations), screened where that is not
    settled (`_allclose_chunk`)."""

    def chunk(pair: tuple[Any, ...], screen: bool) -> tuple[Any, Any]:
        return _allclose_chunk(torch, *pair, tol, work, screen=screen)

    # Settled where the largest ratio is at most 1 (False for NaN: a miss or a non-number).
    return _two_stage_pass(torch, (g_flat, e_flat), chunk, lambda row: bool(row[7] <= 1.0))


def _allclose_chunk(
    torch: Any, g_chunk: Any, e_chunk: Any, tol: Tolerance, work: Any, *, screen: bool
) -> tuple[Any, Any]:
    """One chunk's row of `_allclose_pass`'s table (NaN and infinities counted by kind) and
    where its largest ratio is. Without `screen` every element is taken as finite: a NaN or
    infinity on either side (or 0 / 0) makes the ratio (column 7) NaN, infinite or above 1,
    and the row is not used; on any other chunk it is the screened row."""
    f64 = torch.float64
    gd, ed = g_chunk.to(work), e_chunk.to(work)
    if screen:
        g_nan, e_nan = torch.isnan(gd), torch.isnan(ed)
        finite = torch.isfinite(gd) & torch.isfinite(ed)
        one_side_inf = (~g_nan & ~e_nan & ~finite & (gd != ed)).sum()
    diff = (gd - ed).abs()
    del gd
    e_abs = ed.abs()
    del ed
    zero = torch.zeros((), dtype=e_abs.dtype, device=e_abs.device)
    if screen:
        diff = torch.where(finite, diff, zero)
        limit = tol.atol + tol.rtol * e_abs
        ratio = torch.where(diff > 0, diff / limit, zero)
        rel = torch.where(finite & (e_abs > 0), diff / e_abs.clamp_min(1e-300), zero)
        counts = (g_nan & ~e_nan).sum(), (e_nan & ~g_nan).sum(), one_side_inf  # NaN: kernel, ref
        counts += ((finite & (diff > limit)).sum(), (g_nan & e_nan).sum())
        head = torch.stack(counts).to(f64)
        e_abs = torch.where(finite, e_abs, zero)
    else:
        ratio = diff / (tol.atol + tol.rtol * e_abs)
        rel = torch.where(e_abs > 0, diff / e_abs.clamp_min(1e-300), zero)
        head = torch.zeros(len(_MISSES) + 1, dtype=f64, device=diff.device)
    best = ratio.argmax()  # NaN is the largest to argmax, so a NaN ratio is never hidden
    top = ratio[best]
    del ratio
    errors = torch.stack([diff.max(), rel.max(), top]).to(f64)
    squares = torch.stack([diff.to(f64).pow(2).sum(), e_abs.to(f64).pow(2).sum()])
    return torch.cat([head, errors, squares]), best


def failure_text(failed: list[LeafReport], shown: int = 3) -> str:
    """The messages of the first `shown` failing leaves, and how many more failed."""
    text = " ".join(r.message or "" for r in failed[:shown])
    if len(failed) > shown:
        text += f" ({len(failed) - shown} more outputs differ.)"
    return text


# The reference's normwise relative difference from its re-run above which the re-run is no
# truth for it: a TF32 deep network is off by 1e-3..1e-2, a random or stateful one by order 1.
AGREEMENT = 0.05


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
    unit_roundoff: float  # of the reference output's dtype

    @property
    def reference_error_rel(self) -> float:
        """||reference - truth|| / ||truth||."""
        return _ratio(self.reference_error_norm, self.truth_norm)

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


def measure_reference_error(torch: Any, path: str, ref: Any, wide_out: Any) -> LeafTruth | str:
    """The reference's error on one leaf against its re-run `wide_out`, or why that is no
    truth for it."""
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
    flat = (diff.reshape(-1), ref.detach().reshape(-1), wide_out.reshape(-1))

    def chunk(views: tuple[Any, ...], screen: bool) -> tuple[Any, None]:
        return _reference_error_chunk(torch, views, screen=screen), None

    # Unscreened first: max |r - t| is a number only where both sides are finite throughout.
    table, _ = _two_stage_pass(torch, flat, chunk, lambda row: math.isfinite(float(row[2])))
    if float(table[:, 4].sum()) > 0:
        return f"the re-run gave NaN or infinity at {path} where the reference did not"
    leaf = LeafTruth(
        path=path,
        difference=diff,
        numel=total,
        reference_error_norm=math.sqrt(float(table[:, 0].sum())),
        truth_norm=math.sqrt(float(table[:, 1].sum())),
        reference_error_max=float(table[:, 2].max()),
        truth_abs_max=float(table[:, 3].max()),
        unit_roundoff=unit_roundoff(torch, ref.dtype),
    )
    if leaf.reference_error_rel > AGREEMENT:
        return (
            f"the reference differs from its re-run by {leaf.reference_error_rel:.3g} "
            f"(normwise relative, at {path}; above {AGREEMENT:g}): it is not a plain function "
            "of its inputs (random or stateful) or too sensitive to rounding to have a truth"
        )
    return leaf


def _reference_error_chunk(torch: Any, chunk: tuple[Any, ...], *, screen: bool) -> Any:
    """Writes one chunk's r - t (zero where r is not finite) into its view of the kept
    difference (`chunk`: the views of difference, r and t); returns its sums of squares of
    r - t and t, max |r - t|, max |t| and the count of elements where r is finite and t is
    not. Without `screen` every element is taken as finite."""
    kept, r, t = chunk
    r = r.to(t.dtype)
    if screen:
        r_ok, zero = torch.isfinite(r), torch.zeros((), dtype=t.dtype, device=t.device)
        lost = (r_ok & ~torch.isfinite(t)).sum()
        d, t_ok = torch.where(r_ok, r - t, zero), torch.where(r_ok, t, zero)
    else:
        lost = torch.zeros((), dtype=torch.int64, device=t.device)
        d, t_ok = r - t, t
    kept.copy_(d)
    return torch.stack(
        [
            d.abs().pow(2).sum().real if d.is_complex() else d.pow(2).sum(),
            t_ok.abs().pow(2).sum(),
            d.abs().max(),
            t_ok.abs().max(),
            lost.to(d.dtype if not d.is_complex() else torch.float64),
        ]
    ).to(torch.float64)


@dataclass(frozen=True)
class TruthComparison:
    """One leaf of the kernel's output against the truth."""

    report: LeafReport
    kernel_error: float  # ||kernel - truth|| / ||truth||
    reference_error: float  # ||reference - truth|| / ||truth||


def truth_source(precision: str | None, factor: float) -> str:
    return f"within {factor:g}x the reference's own error against its {precision} re-run"


def _truth_pass(
    torch: Any, flat: tuple[Any, Any, Any], floor: float, factor: float, roundings: float
) -> tuple[Any, Any]:
    """One chunked pass of the first call's element rule over the flat kernel, reference and
    reference - truth (`flat`): per chunk the elements over their bound, the sum of squares
    of |k - t|, the largest ratio, the elements not numbers on one side only, both-NaN, max
    |k - r| and max |k - r| / |r|; and where each chunk's largest ratio is. Unscreened
    first: max |k - r| is a number only where both sides are finite throughout."""
    work = torch.complex64 if flat[1].is_complex() else torch.float32
    bounds = (floor, factor, roundings)

    def chunk(views: tuple[Any, ...], screen: bool) -> tuple[Any, Any]:
        return _truth_chunk(torch, views, bounds, work, screen=screen)

    return _two_stage_pass(torch, flat, chunk, lambda row: math.isfinite(float(row[5])))


def _truth_chunk(
    torch: Any,
    chunk: tuple[Any, Any, Any],
    bounds: tuple[float, float, float],
    work: Any,
    *,
    screen: bool,
) -> tuple[Any, Any]:
    """One chunk's row of `_truth_pass`'s table and where its largest ratio is; `screen`
    counts the elements not numbers on both sides and leaves them out."""
    floor, factor, roundings = bounds
    gd, rd, dd = (part.to(work) for part in chunk)
    zero = torch.zeros((), dtype=work, device=gd.device)
    if screen:
        ok = torch.isfinite(gd) & torch.isfinite(rd)
        nan_both = torch.isnan(gd) & torch.isnan(rd)
        both_nan = nan_both.sum()
        # Not numbers on both sides and not the same NaN or infinity: screened by the caller.
        unlike = (~ok & ~nan_both & (gd != rd)).sum()
        diff = torch.where(ok, gd - rd, zero)  # kernel - reference
        off = (diff + torch.where(ok, dd, zero)).abs()  # |kernel - truth|
    else:
        both_nan = unlike = torch.zeros((), dtype=torch.int64, device=gd.device)
        diff = gd - rd
        off = (diff + dd).abs()
    r_abs = rd.abs()
    rel = torch.where(r_abs > 0, diff.abs() / r_abs, torch.zeros_like(r_abs))
    allowed = factor * (dd.abs() + floor) + roundings * (rd - dd).abs()
    ratio = torch.where(off > 0, off / allowed, torch.zeros_like(off))
    best = ratio.argmax()
    f64 = torch.float64
    over, sq = (off > allowed).sum().to(f64), off.to(f64).pow(2).sum()
    columns = (over, sq, ratio[best].to(f64), unlike.to(f64), both_nan.to(f64))
    return torch.stack((*columns, diff.abs().max().to(f64), rel.max().to(f64))), best


def compare_with_truth(
    torch: Any,
    path: str,
    got: Any,
    expected: Any,
    leaf: LeafTruth,
    precision: str,
    factor: float,
) -> TruthComparison:
    """The first call's rule on one floating leaf in one chunked pass; another shape or
    dtype, or a NaN or infinity the reference lacks, is explained by `compare_tensor`."""
    u = leaf.unit_roundoff
    floor = leaf.reference_error_max + u * leaf.rms_truth
    source = truth_source(precision, factor)
    norm_bound_rel = factor * leaf.reference_error_rel + ROUNDINGS * u
    tol = Tolerance(ROUNDINGS * u, factor * floor, source, norm_rtol=norm_bound_rel)

    def screened() -> TruthComparison:
        # Shape, dtype, NaN and infinities explained; values not judged.
        screen = compare_tensor(torch, path, got, expected, Tolerance(0.0, math.inf, source))
        screen.tolerance = tol  # the screen's own is no rule
        return TruthComparison(screen, math.inf, leaf.reference_error_rel)

    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        return screened()
    shape, total = tuple(expected.shape), expected.numel()
    g = got.detach().to(expected.device).reshape(-1)
    r, d = expected.detach().reshape(-1), leaf.difference.reshape(-1)
    table, starts = _truth_pass(torch, (g, r, d), floor, factor, ROUNDINGS * u)
    if float(table[:, 3].sum()) > 0:
        return screened()
    n_both_nan = int(table[:, 4].sum())
    notes = [_both_nan_note(path, n_both_nan)] if n_both_nan else []
    n_bad = int(table[:, 0].sum())
    off_norm = math.sqrt(float(table[:, 1].sum()))
    chunk = int(table[:, 2].argmax())
    worst_ratio, worst_flat = float(table[chunk, 2]), int(starts[chunk])
    kernel_rel = _ratio(off_norm, leaf.truth_norm)
    norm_ratio = _ratio(
        off_norm, factor * leaf.reference_error_norm + ROUNDINGS * u * leaf.truth_norm
    )
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
    max_abs, max_rel = float(table[:, 5].max()), float(table[:, 6].max())
    ratio = max(worst_ratio, norm_ratio)
    report = LeafReport(path, tol, message is None, message, max_abs, max_rel, ratio, index, notes)
    return TruthComparison(report, kernel_rel, leaf.reference_error_rel)


@dataclass(frozen=True)
class InformationLimits:
    """For `information_failure`: the reference's noise relative to max |ref| (`abs_rel`) and
    to ||ref|| (`norm_rel`), and the relative error the rule allows (`rel`)."""

    abs_rel: float
    norm_rel: float
    rel: float


def information_failure(
    torch: Any,
    path: str,
    got: Any,
    expected: Any,
    limits: InformationLimits,
    steps: range | None = None,
) -> str | None:
    """Why `got` carries no information about `expected` (zeros, one constant, a scaled
    copy), or None; over the elements finite on both sides, in float64 (`steps`: the
    output's `chunk_ranges`, where the caller has them)."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or expected.numel() == 0:
        return None
    if expected.is_complex() or not expected.is_floating_point():
        return None
    total = expected.numel()
    g_all = got.detach().to(expected.device).reshape(-1)
    e_all = expected.detach().reshape(-1)
    rows = []
    steps = steps or chunk_ranges(total, expected.device)
    for lo in steps:
        hi = min(total, lo + steps.step)
        g = g_all[lo:hi].to(torch.float64)
        e = e_all[lo:hi].to(torch.float64)
        ok = torch.isfinite(g) & torch.isfinite(e)
        if not bool(ok.all()):
            g, e = g[ok], e[ok]
        if g.numel() == 0:
            continue
        columns = (
            g.new_tensor(float(g.numel())),
            g.abs().max(),
            g.min(),
            g.max(),
            e.abs().max(),
            e.min(),
            e.max(),
        )
        rows.append(torch.stack((*columns, (g * e).sum(), (e * e).sum(), (g * g).sum())))
    if not rows:
        return None
    table = torch.stack(rows).cpu()
    col = table.T
    n = int(col[0].sum())
    g_abs, g_min, g_max = float(col[1].max()), float(col[2].min()), float(col[3].max())
    e_abs, e_min, e_max = float(col[4].max()), float(col[5].min()), float(col[6].max())
    ge, ee, gg = float(col[7].sum()), float(col[8].sum()), float(col[9].sum())
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
    u, rho = leaf.unit_roundoff, leaf.reference_error_rel
    floor = leaf.reference_error_max + u * leaf.rms_truth
    source = (
        f"{truth_source(precision, factor)}, calibrated on the first trial "
        f"(reference's normwise error {rho:.3g})"
    )
    atol = factor * floor + (factor + 1) * leaf.reference_error_max
    tol = Tolerance(ROUNDINGS * u, atol, source, (factor + 1) * rho + ROUNDINGS * u)
    abs_rel = (
        factor * leaf.reference_error_max / leaf.truth_abs_max + ROUNDINGS * u
        if leaf.truth_abs_max
        else math.inf
    )
    return Calibration(tol, InformationLimits(abs_rel, factor * rho + ROUNDINGS * u, 0.0))


class CorrectnessRule:
    """The rule one check decides by, with what it learns from the first call's truth:
    `set_truth` before the call the truth ran on; `judge` compares that call with the truth
    and later ones by the calibrated tolerance (`for_leaf`). Without a truth, or under an
    override, the dtype rule decides. Usable as `compare_outputs`'s `tolerance_for`."""

    def __init__(
        self, *, rtol: float | None = None, atol: float | None = None, factor: float = FACTOR
    ) -> None:
        self.rtol, self.atol, self.factor = rtol, atol, factor
        # A marker's rtol/atol decides instead of the truth's rule.
        self.overridden = rtol is not None or atol is not None
        self.reduced: str | None = None  # the reference's fp32 matmuls ran in "tf32"/"bf16"
        self.truth: Truth | None = None
        self.calibrated: dict[str, Calibration] = {}
        self.kernel_error: float | None = None  # normwise relative, vs the truth (worst leaf)
        self.reference_error: float | None = None
        self._pending = False

    def set_truth(self, truth: Truth) -> None:
        self.truth = truth
        self._pending = truth.available

    @property
    def name(self) -> str:
        """Which rule decides, in words (the record's `rule`)."""
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
        return tolerance_rule(reduced=self.reduced, rtol=self.rtol, atol=self.atol)

    def __call__(self, dtype: Any) -> Tolerance:
        return self.fallback()(dtype)

    def for_leaf(self, path: str, dtype: Any) -> Tolerance:
        """A later call's tolerance for the leaf at `path`. Where the reference's fp32
        matmuls may run reduced, it may be that inexact on any call (cuDNN may pick another
        algorithm), so the reduced type's tolerance is allowed too: the larger of the two."""
        found = self.calibrated.get(path)
        if found is None or self.overridden:
            return self.fallback()(dtype)
        if not self.reduced:
            return found.tolerance
        loose, cal = self.fallback()(dtype), found.tolerance
        source = f"{cal.source}, or {loose.source}"
        return Tolerance(max(cal.rtol, loose.rtol), max(cal.atol, loose.atol), source)

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

    def timed_check(self, torch: Any) -> Callable[[Any, Any], str | None]:
        """The check of timed calls' outputs: (got, expected) -> the first two failing
        leaves' messages, or None, as `judge` decides. A plain floating tensor is first
        judged in one pass that stops at the first chunk that misses (`_allclose_pass`'s
        element rule, its normwise sums, `information_failure` where `judge` runs it), planned
        once per dtype and size; what fails or is not decided there goes through `judge`,
        which explains it. One frame: it runs on every checked timed call."""
        plans: dict[tuple[Any, int], tuple[Tolerance, InformationLimits | None, range]] = {}
        tensor, float64, isfinite, isnan = torch.Tensor, torch.float64, torch.isfinite, torch.isnan

        def failure(got: Any, expected: Any) -> str | None:
            total = expected.numel() if type(expected) is tensor else 0
            if (
                type(got) is tensor
                and 0 < total
                and expected.is_floating_point()
                and got.shape == expected.shape
                and got.dtype == expected.dtype
                and not self._pending
            ):
                plan = plans.get((expected.dtype, total))
                if plan is None:
                    tol = self.for_leaf("output", expected.dtype)
                    by_truth = "output" in self.calibrated and not (self.overridden or self.reduced)
                    limits = None if by_truth else self._limits(torch, "output", expected, tol)
                    steps = chunk_ranges(total, expected.device)
                    plan = plans[(expected.dtype, total)] = (tol, limits, steps)
                tol, limits, steps = plan
                passed = tol.source != STRUCTURE_ONLY_SOURCE
                work = float64 if expected.dtype == float64 else torch.float32
                g_all = got.detach().to(expected.device).reshape(-1)
                e_all = expected.detach().reshape(-1)
                diff_sq = exp_sq = 0.0
                for lo in steps if passed else ():
                    hi = min(total, lo + steps.step)
                    g, e = g_all[lo:hi].to(work), e_all[lo:hi].to(work)
                    diff = (g - e).abs()
                    e_abs = e.abs()
                    limit = tol.atol + tol.rtol * e_abs
                    # Every difference finite (so both sides are) and inside its limit: the
                    # masks below all True, in a third of the passes.
                    inside = bool((diff <= limit).all() & isfinite(diff.max()))
                    if not inside:
                        finite = isfinite(g) & isfinite(e)
                        close = finite & ~(diff > limit)
                        if not bool((close | (g == e) | (isnan(g) & isnan(e))).all()):
                            passed = False
                            break
                        zero = torch.zeros((), dtype=work, device=e.device)
                        diff = torch.where(finite, diff, zero)
                        e_abs = torch.where(finite, e_abs, zero)
                    if tol.norm_rtol is not None:
                        diff_sq += float(diff.to(float64).pow(2).sum())
                        exp_sq += float(e_abs.to(float64).pow(2).sum())
                if (
                    passed
                    and (
                        tol.norm_rtol is None
                        or math.sqrt(diff_sq) <= tol.norm_rtol * math.sqrt(exp_sq)
                    )
                    and (
                        limits is None
                        or information_failure(torch, "output", got, expected, limits, steps)
                        is None
                    )
                ):
                    return None
            failed = [r for r in self.judge(torch, got, expected) if not r.ok]
            return " ".join(r.message or "" for r in failed[:2]) if failed else None

        return failure

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
            if (  # a structure apart: the structure comparison names it
                report is None
                or report.kind == "structure"
                or not isinstance(got_leaf, torch.Tensor)
                or not isinstance(exp_leaf, torch.Tensor)
            ):
                continue
            found = compare_with_truth(
                torch, path, got_leaf, exp_leaf, leaf, precision, self.factor
            )
            if not overridden:
                by_report[path] = found.report
                if self.reduced and not found.report.ok and found.report.kind == "values":
                    # The reduced precision's tolerance accepts too (see `for_leaf`).
                    tol = fallback(exp_leaf.dtype)
                    loose = compare_tensor(torch, path, got_leaf, exp_leaf, tol)
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
                    report = replace(
                        report, ok=False, message=text, worst_ratio=math.inf, kind="information"
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
