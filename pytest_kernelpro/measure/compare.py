"""Compare a kernel's outputs with the reference's, leaf by leaf, and explain any difference.

Split from `correctness.py` (which runs the trials); this part only compares two output
structures: tensors, tuples/lists/dicts of them (nested), and plain Python values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.measure.tolerance import Tolerance

TolFor = Callable[[Any], "Tolerance"]


def json_float(value: float) -> float | str:
    """A float for JSON: finite as is, else "inf", "-inf" or "nan"."""
    return value if math.isfinite(value) else str(value)


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


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _fmt(value: Any) -> str:
    return f"{value:.7g}" if isinstance(value, (float, complex)) else repr(value)


def compare_outputs(
    torch: Any, got: Any, expected: Any, tolerance_for: TolFor, path: str = "output"
) -> list[LeafReport]:
    """Compare `got` (kernel) with `expected` (reference); one `LeafReport` per leaf.

    A structure mismatch (a tuple of 2 vs 3, a tensor vs a list) is one failing report at
    the path where the structures part. Tuples and lists are interchangeable.
    """
    if isinstance(expected, torch.Tensor):
        return [
            compare_tensor(
                torch, path, got, expected, leaf_tolerance(tolerance_for, path, expected.dtype)
            )
        ]
    if isinstance(expected, (list, tuple, dict)):
        kind = dict if isinstance(expected, dict) else (list, tuple)
        if not isinstance(got, kind) or len(got) != len(expected):
            return [_mismatch(torch, path, tolerance_for(None), got, expected)]
        if isinstance(expected, dict) and set(got) != set(expected):
            return [_mismatch(torch, path, tolerance_for(None), got, expected)]
        keys = list(expected) if isinstance(expected, dict) else range(len(expected))
        reports: list[LeafReport] = []
        for key in keys:
            sub = f"{path}[{key!r}]" if isinstance(expected, dict) else f"{path}[{key}]"
            reports.extend(compare_outputs(torch, got[key], expected[key], tolerance_for, sub))
        return reports
    return [_compare_value(torch, path, got, expected, tolerance_for)]


def leaf_tolerance(tolerance_for: TolFor, path: str, dtype: Any) -> Tolerance:
    """The tolerance of the output leaf at `path`: `tolerance_for.for_leaf(path, dtype)` when
    the rule has one (tolerances calibrated per output, `measure/accuracy.py`), else by dtype."""
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
    ratio = diff / limit if limit else (0.0 if diff == 0 else math.inf)
    ok = not math.isnan(diff) and ratio <= 1.0
    rel = diff / abs(expected) if expected else 0.0
    msg = None
    if not ok:
        msg = (
            f"{path}: expected {_fmt(expected)}, got {_fmt(got)} "
            f"(rtol={tol.rtol:g}, atol={tol.atol:g}, {tol.source})."
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


# A leaf tolerance that asks for the shape and dtype only: its values are judged elsewhere
# (`measure/accuracy.py` against the truth, in one pass of its own).
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
    g, e = got.detach(), exp.detach()
    if g.device != e.device:
        g = g.to(e.device)
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


# Elements compared at once: at least COMPARE_CHUNK, else a 32nd of the output, so the
# temporaries (about 26 bytes per element in float32) stay near a fifth of a large output's
# own size while a multi-GB output takes at most 32 chunks (about 15 launches each: a few ms).
# With 8 chunks (temporaries about 0.8x the output) the output-dominated KernelBench problems
# (a 4 GiB matmul output from small inputs) peaked at 3.03x their footprint on the H200:
# reference output, kernel output and the comparison's temporaries.
COMPARE_CHUNK = 1 << 22
COMPARE_MAX_CHUNKS = 32


def _work_dtype(torch: Any, dtype: Any) -> Any:
    """float64 for float64/complex128 outputs; float32 (complex64) for narrower ones, whose
    errors and tolerances float32 resolves with room to spare (its rounding, 6e-8 relative,
    is far below any default rtol): half the memory of float64 temporaries."""
    if dtype.is_complex:
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    return torch.float64 if dtype == torch.float64 else torch.float32


def _compare_float(torch: Any, path: str, g: Any, e: Any, tol: Tolerance) -> LeafReport:
    """Floating/complex: allclose per element, NaN and infinities explained.

    Compared in chunks (see COMPARE_CHUNK), with the counts and maxima accumulated on
    the device (one synchronization at the end): temporaries of a whole multi-GB output would
    take many times its size (a 7.5 GB fp32 output needed over 100 GB in float64).
    """
    shape, total = tuple(e.shape), e.numel()
    work = _work_dtype(torch, e.dtype)
    real = torch.float64 if work in (torch.float64, torch.complex128) else torch.float32
    g_flat, e_flat = g.reshape(-1), e.reshape(-1)
    step = max(COMPARE_CHUNK, -(-total // COMPARE_MAX_CHUNKS))
    names = ("nan", "missing nan", "inf", "over")
    per_chunk: list[Any] = []  # per chunk: counts of each mask, both-NaN, max abs, max rel, ratio
    worst_at: list[Any] = []
    for lo in range(0, total, step):
        hi = min(total, lo + step)
        gd, ed = g_flat[lo:hi].to(work), e_flat[lo:hi].to(work)
        g_nan, e_nan = torch.isnan(gd), torch.isnan(ed)
        finite = torch.isfinite(gd) & torch.isfinite(ed)
        inf_any = ~g_nan & ~e_nan & ~finite
        zero = torch.zeros((), dtype=real, device=gd.device)
        diff = torch.where(finite, (gd - ed).abs(), zero)
        e_abs = ed.abs()
        del gd
        limit = tol.atol + tol.rtol * e_abs
        ratio = torch.where(diff > 0, diff / limit, zero)
        rel = torch.where(finite & (e_abs > 0), diff / e_abs.clamp_min(1e-300), zero)
        counts = torch.stack(
            [
                (g_nan & ~e_nan).sum(),  # kernel NaN where the reference is a number
                (e_nan & ~g_nan).sum(),  # the reference is NaN, the kernel a number
                (inf_any & (g_flat[lo:hi].to(work) != ed)).sum(),  # an infinity on one side
                (finite & (diff > limit)).sum(),
                (g_nan & e_nan).sum(),
            ]
        )
        best = ratio.argmax()
        # Sums of squares in float64 for the normwise bound (Tolerance.norm_rtol).
        e_fin = torch.where(finite, e_abs, zero).to(torch.float64)
        per_chunk.append(
            torch.cat(
                [
                    counts.to(torch.float64),
                    torch.stack([diff.max(), rel.max(), ratio[best]]).to(torch.float64),
                    torch.stack([diff.to(torch.float64).pow(2).sum(), e_fin.pow(2).sum()]),
                ]
            )
        )
        del e_fin
        worst_at.append(best + lo)
        del ed, g_nan, e_nan, finite, inf_any, diff, e_abs, limit, ratio, rel, counts
    table = torch.stack(per_chunk).cpu()  # the one synchronization
    starts = torch.stack(worst_at).cpu()
    column = {name: table[:, i] for i, name in enumerate(names)}
    counts_total = {name: int(column[name].sum()) for name in names}
    n_both_nan = int(table[:, 4].sum())
    max_abs, max_rel = float(table[:, 5].max()), float(table[:, 6].max())
    best_chunk = int(table[:, 7].argmax())  # the first chunk holding the largest ratio
    worst_ratio, worst_flat = float(table[best_chunk, 7]), int(starts[best_chunk])
    first: dict[str, int] = {}
    for name in ("nan", "missing nan", "inf"):
        if counts_total[name]:
            chunk = int((column[name] > 0).nonzero()[0])
            lo, hi = chunk * step, min(total, (chunk + 1) * step)
            first[name] = lo + _first_index(
                torch, name, g_flat[lo:hi].to(work), e_flat[lo:hi].to(work)
            )
    counts = counts_total
    norm_text = ""
    if tol.norm_rtol is not None and not any(counts.values()):
        diff_norm, exp_norm = (
            math.sqrt(float(table[:, 8].sum())),
            math.sqrt(float(table[:, 9].sum())),
        )
        if diff_norm > tol.norm_rtol * exp_norm:
            rel_norm = diff_norm / exp_norm if exp_norm else math.inf
            norm_text = (
                f"{path}: normwise relative error {rel_norm:.3g} above {tol.norm_rtol:.3g} "
                f"({tol.source}), though every element is inside rtol={tol.rtol:.3g}, "
                f"atol={tol.atol:.3g}."
            )
    notes = []
    if n_both_nan:
        notes.append(
            f"{path}: the reference itself produced NaN at {n_both_nan} element(s) and the kernel "
            "has NaN at the same places (accepted: the reference runs without output poisoning)"
        )
    n_bad = sum(counts.values())
    if n_bad == 0:
        index = _unravel(worst_flat, shape)
        if norm_text:
            return LeafReport(
                path, tol, False, norm_text, max_abs, max_rel, worst_ratio, index, notes
            )
        return LeafReport(path, tol, True, None, max_abs, max_rel, worst_ratio, index, notes)
    parts = [
        f"{path}: {n_bad} of {total} elements ({100 * n_bad / total:.3g}%) outside "
        f"rtol={tol.rtol:g}, atol={tol.atol:g} ({tol.source})."
    ]
    kind = "values"
    for name in ("nan", "missing nan", "inf"):
        if counts[name]:
            first_flat = first[name]
            if kind == "values":  # the first non-number problem names the worst element
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
    return LeafReport(
        path, tol, False, " ".join(parts), max_abs, max_rel, worst_ratio, index, notes, kind
    )


def failure_text(failed: list[LeafReport], shown: int = 3) -> str:
    """The messages of the first `shown` failing leaves, and how many more failed."""
    text = " ".join(r.message or "" for r in failed[:shown])
    if len(failed) > shown:
        text += f" ({len(failed) - shown} more outputs differ.)"
    return text


@dataclass(frozen=True)
class OutputsVerdict:
    """One comparison of a kernel's outputs with the reference's, summed up over leaves."""

    ok: bool
    reports: tuple[LeafReport, ...]
    failure: str | None  # `failure_text` of the failing leaves; None when ok
    max_abs: float
    max_rel: float
    tolerance: Tolerance | None  # of the first failing leaf, else of the closest to failing

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the verdict, the errors, the tolerance and the failure text."""
        data: dict[str, Any] = {
            "ok": self.ok,
            "max_abs_err": json_float(self.max_abs),
            "max_rel_err": json_float(self.max_rel),
        }
        if self.tolerance is not None:
            data.update(rtol=self.tolerance.rtol, atol=self.tolerance.atol)
            data["tolerance_source"] = self.tolerance.source
        if self.failure is not None:
            data["why"] = self.failure
        return data
