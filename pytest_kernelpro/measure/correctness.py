"""Check a kernel against its reference: fresh inputs per trial, poisoned outputs, tolerances.

Each trial builds inputs with `make_inputs(seed + trial)` (under `torch.manual_seed` of the
same number, restored afterwards), gives the reference and the kernel their own clones (an
in-place kernel cannot change what the reference sees), runs the reference normally, then
runs the kernel with uninitialized memory poisoned: `torch.empty`/`empty_like`/`new_empty`
(also from C++ extensions and Triton wrappers) return NaN for floats and the largest value
for integers, and on CUDA freed blocks of the outputs' sizes are pre-filled with the same
poison, so an element the kernel never writes fails the comparison.

The first trial also re-runs the reference in higher precision on its inputs (the truth,
`measure/truth.py`), and the rule of `measure/accuracy.py` decides: the kernel within
`accuracy.FACTOR` times the reference's own error against that truth (elementwise, with a
floor at the output's scale, and normwise), later trials and the re-check after timing by the
tolerance that truth calibrated. Where no truth can be run, the dtype tolerances decide as
`torch.allclose` does (|got - expected| <= atol + rtol * |expected|, `tolerance.tolerance_rule`);
a marker's rtol/atol override either. In every mode an output that carries no information
(zeros, one constant, a scaled copy) fails. NaN never passes, except where the reference
itself produced NaN at the same place (the reference runs without poisoning, so its NaNs are
its own). A KernelBench file also gets KernelBench's own verdict (allclose with
atol = rtol = 1e-2), recorded next to the gate's, for comparison with published numbers.

A kernel that raises gives a failed `CorrectnessResult` (the exception in `failure` and
`exception`); a reference or input factory that raises is a problem definition error and
raises `KernelproError` with the original exception chained.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.accuracy import CorrectnessRule
from pytest_kernelpro.measure.compare import LeafReport, compare_outputs, failure_text, json_float
from pytest_kernelpro.measure.tolerance import KERNELBENCH, Tolerance, run_recording_precision
from pytest_kernelpro.measure.truth import run_truth


@dataclass(frozen=True)
class CorrectnessResult:
    """The verdict of `check_correctness` over all trials run."""

    passed: bool
    trials: int
    trials_run: int
    max_abs_err: float  # over all trials run and all finite elements
    max_rel_err: float  # |err| / |expected| over elements with expected != 0
    tolerance: Tolerance  # the one of the failing (else the closest-to-failing) output
    failure: str | None
    worst_index: tuple[int, ...] | None
    output_path: str | None  # e.g. "output[1]"
    worst_ratio: float = 0.0  # max |err| / (atol + rtol |expected|); <= 1 means inside
    exception: str | None = None  # "TypeError: ..." when the kernel raised
    notes: tuple[str, ...] = field(default_factory=tuple)
    tf32: bool = False  # the reference ran fp32 matmul/conv with TF32 allowed (on CUDA)
    cuda_error: bool = False  # the kernel raised a CUDA error: this process's context is broken
    rule: str | None = None  # which rule decided (`accuracy.CorrectnessRule.name`)
    factor: float | None = None  # the kernel within this many times the reference's error
    kernel_error: float | None = None  # ||kernel - truth|| / ||truth|| on the first trial
    reference_error: float | None = None  # ||reference - truth|| / ||truth||, same inputs
    truth: dict[str, Any] | None = None  # precision, seconds, peak_bytes, skipped (why not)
    kernelbench: dict[str, Any] | None = None  # KernelBench's own verdict (KernelBench files)
    # The rule with what the first trial's truth calibrated, for `recheck_after_timing`.
    rule_state: Any = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite errors become "inf"/"nan" strings)."""
        data = asdict(replace(self, rule_state=None))  # asdict would deep-copy the rule
        data.pop("rule_state")
        for key in ("max_abs_err", "max_rel_err", "worst_ratio", "kernel_error", "reference_error"):
            if data[key] is not None:
                data[key] = json_float(data[key])
        data["worst_index"] = None if self.worst_index is None else list(self.worst_index)
        data["notes"] = list(self.notes)
        return data


@contextlib.contextmanager
def poisoned_allocations(torch: Any) -> Iterator[None]:
    """Make uninitialized tensors NaN (floats) / max-int (ints) inside the block.

    Uses torch's deterministic mode with `fill_uninitialized_memory` (warn-only, so kernels
    with nondeterministic ops still run); restores the previous settings and swallows the
    warnings this mode itself causes (the test config turns warnings into errors).
    """
    det_mod = torch.utils.deterministic
    prev = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        det_mod.fill_uninitialized_memory,
    )
    # The public torch.use_deterministic_algorithms also flips torch._inductor's
    # `deterministic` config (importing inductor, seconds, and changing what a
    # torch.compile'd kernel compiles to during this check); the C setter does only the
    # dispatcher part.
    set_mode = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_mode is None:
        set_mode = torch.use_deterministic_algorithms
    with warnings.catch_warnings():
        # "... does not have a deterministic implementation ..." and the CuBLAS
        # CUBLAS_WORKSPACE_CONFIG note are both consequences of this scope, not the kernel.
        warnings.filterwarnings("ignore", message=r"(?s).*[Dd]eterministic")
        set_mode(True, warn_only=True)
        det_mod.fill_uninitialized_memory = True
        try:
            yield
        finally:
            set_mode(prev[0], warn_only=prev[1])
            det_mod.fill_uninitialized_memory = prev[2]


_POISON_SMALL_BYTES = 16 * 1024**2


def _poison_value(torch: Any, dtype: Any) -> Any:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def prepoison_cuda_cache(torch: Any, expected: Any) -> None:
    """Fill freed caching-allocator blocks of the outputs' sizes with poison.

    Catches kernels that get output memory from the allocator without `at::empty` (raw
    allocations), which fill_uninitialized_memory does not cover. Best effort: a dtype
    `torch.full` cannot fill (float8) or an allocation that does not fit is skipped.
    """
    blocks = []
    for leaf in _tensor_leaves(torch, expected):
        if not leaf.is_cuda or leaf.numel() == 0 or leaf.numel() * leaf.element_size() > 2**31:
            continue
        value = _poison_value(torch, leaf.dtype)
        # Three blocks for small outputs (a kernel's temporaries come from the same sizes);
        # one for large ones, so the check's peak memory stays near the problem's own.
        for _ in range(3 if leaf.numel() * leaf.element_size() <= _POISON_SMALL_BYTES else 1):
            try:
                blocks.append(
                    torch.full((leaf.numel(),), value, dtype=leaf.dtype, device=leaf.device)
                )
            except RuntimeError:  # out of memory, or no fill kernel for this dtype
                break
    del blocks  # back to the cache, poisoned


def _tensor_leaves(torch: Any, obj: Any) -> Iterator[Any]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensor_leaves(torch, item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensor_leaves(torch, item)


def clone_inputs(torch: Any, obj: Any) -> Any:
    """Deep copy of tensors (strides kept) inside lists/tuples/dicts; other objects shared."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(clone_inputs(torch, x) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_inputs(torch, x) for x in obj)
    if isinstance(obj, dict):
        return {k: clone_inputs(torch, v) for k, v in obj.items()}
    return obj


def is_cuda_error(exc: BaseException) -> bool:
    """True for a CUDA runtime error (illegal address, device-side assert, launch failure).

    torch raises these as `torch.AcceleratorError` (2.8+) or RuntimeError("CUDA error: ...");
    after one the CUDA context of the process is unusable.
    """
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ == "AcceleratorError" or "CUDA error" in text or "cudaError" in text


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _kernel_exception_text(exc: BaseException) -> str:
    """The traceback from the kernel's own frames down (this module's frame left out)."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    lines = traceback.format_exception(type(exc), exc, tb)
    return "".join(lines[-8:]).strip()[-2000:]


def _reference_exception_text(exc: BaseException) -> str:
    """The reference's traceback: the frames below this package's own (the recording of
    its precision, the input copy) down to where it raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    package = str(Path(__file__).resolve().parents[1])
    own = [
        i for i, f in enumerate(frames) if not str(Path(f.filename).resolve()).startswith(package)
    ]
    kept = frames[own[0] :] if own else frames
    lines = ["Traceback of the reference (most recent call last):\n"]
    lines += traceback.format_list(kept[-8:])
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()[-2000:]


def _chunks(torch: Any, a: Any, b: Any) -> Iterator[tuple[Any, Any]]:
    """`a` and `b` (same shape) as pairs of flat pieces of at most a 32nd of the elements
    (at least COMPARE_CHUNK): CUDA's `torch.equal` and `==` make a temporary the size of their
    operands, a quarter of an 8 GB fp32 input for its bool result."""
    from pytest_kernelpro.measure.compare import COMPARE_CHUNK, COMPARE_MAX_CHUNKS

    n = a.numel()
    if n <= COMPARE_CHUNK or not (a.is_contiguous() and b.is_contiguous()):
        yield a, b
        return
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)  # views: both are contiguous
    step = max(COMPARE_CHUNK, -(-n // COMPARE_MAX_CHUNKS))
    for start in range(0, n, step):
        yield flat_a[start : start + step], flat_b[start : start + step]


def _count_changed(torch: Any, a: Any, b: Any) -> int:
    """Elements of `a` and `b` (same shape and dtype) that differ bitwise, NaN equal to NaN."""
    diff = 0
    for x, y in _chunks(torch, a, b):
        if torch.equal(x, y):
            continue
        same = x == y
        if x.is_floating_point() or x.is_complex():
            same = same | (torch.isnan(x) & torch.isnan(y))
        diff += int((~same).sum())
    return diff


def _changed_input(torch: Any, original: Any, used: Any, path: str = "input") -> str | None:
    """The first input tensor (its path and how many elements) that differs bitwise between
    `original` and `used` (NaN equal to NaN), else None."""
    if isinstance(original, torch.Tensor) and isinstance(used, torch.Tensor):
        if original.shape != used.shape or original.dtype != used.dtype:
            return f"{path} (its shape or dtype changed)"
        diff = _count_changed(torch, original.detach(), used.detach())
        return None if diff == 0 else f"{path} ({diff} of {original.numel()} elements changed)"
    if isinstance(original, (list, tuple)) and isinstance(used, (list, tuple)):
        for i, (x, y) in enumerate(zip(original, used, strict=False)):
            found = _changed_input(torch, x, y, f"{path}[{i}]" if path != "input" else f"input {i}")
            if found:
                return found
        return None
    if isinstance(original, dict) and isinstance(used, dict):
        for key in original:
            if key in used:
                found = _changed_input(torch, original[key], used[key], f"{path}[{key!r}]")
                if found:
                    return found
    return None


def recheck_after_timing(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    timed_inputs: Sequence[Any],
    fresh_inputs: Sequence[Any] | Callable[[], Sequence[Any]],
    *,
    device: str,
    correctness: CorrectnessResult,
    rtol: float | None = None,
    atol: float | None = None,
) -> str | None:
    """Check the kernel once more after it was timed; the failure text, or None.

    The timed inputs get new values written into them in place (same tensors, same
    addresses), then the kernel runs on them under poisoned allocations and is compared with
    the reference on a copy: a kernel that is correct only during the correctness trials
    (counts its calls, caches by input address, leaves work for later) fails here.
    """
    import torch

    # `fresh_inputs` may be a factory: then the fresh set lives only for the copy, and the
    # check holds one input set, not two (a multi-GB problem's peak memory).
    fresh = fresh_inputs() if callable(fresh_inputs) else fresh_inputs
    for dst, src in zip(
        _tensor_leaves(torch, timed_inputs), _tensor_leaves(torch, fresh), strict=False
    ):
        if dst.shape == src.shape and dst.dtype == src.dtype:
            dst.copy_(src)
    # The loop variables too: `src` still held the last fresh tensor, so a one-input problem
    # kept three input sets through the reference's run (3.00x its footprint on the H200).
    dst = src = fresh = None
    _sync(torch, device)

    # The trials' rule, with what the first trial's truth calibrated; a result made
    # elsewhere (no rule kept) decides by the dtype tolerances.
    rule = correctness.rule_state
    if not isinstance(rule, CorrectnessRule):
        rule = CorrectnessRule(rtol=rtol, atol=atol)
        rule.reduced = "tf32" if correctness.tf32 else None

    expected = reference(*clone_inputs(torch, timed_inputs))
    _sync(torch, device)
    try:
        with poisoned_allocations(torch):
            got = kernel(*timed_inputs)
            _sync(torch, device)
    except Exception as exc:
        return f"after timing, the kernel raised {type(exc).__name__}: {exc}"
    failed = [r for r in rule.judge(torch, got, expected) if not r.ok]
    if not failed:
        return None
    text = " ".join(r.message or "" for r in failed[:3])
    return f"correct in the trials, but wrong once timed (timed inputs refilled in place): {text}"


def _implies(reports: Sequence[LeafReport], looser: Tolerance) -> bool:
    """Every leaf passed by an elementwise allclose no looser than `looser`."""
    return all(
        r.ok and r.tolerance.rtol <= looser.rtol and r.tolerance.atol <= looser.atol
        for r in reports
    )


def check_correctness(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[int], Sequence[Any]],
    *,
    device: str,
    trials: int = 3,
    tolerance: Tolerance | None = None,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    truth: bool = True,
    kernelbench: bool = False,
) -> CorrectnessResult:
    """Run `trials` trials of kernel vs reference on fresh inputs; stop at the first failure.

    The rule (`accuracy.CorrectnessRule`): with `truth`, the first trial's inputs re-run the
    reference in higher precision and the kernel must be within the factor of the
    reference's own error; without one, per-output defaults from the reference's dtype
    (`tolerance.default_tolerance`, TF32-aware on CUDA). `tolerance` (fixed) or `rtol`/`atol` (a
    marker's, replacing the default's fields) override the rule. `kernelbench`: also record
    KernelBench's own verdict. Raises `KernelproError` if `make_inputs` or `reference` raises.
    """
    import time

    import torch

    if trials < 1:
        raise KernelproError(f"check_correctness(trials={trials!r}): need at least one trial")
    cuda_devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    tf32_mode: str | None = None
    worst: LeafReport | None = None
    max_abs = max_rel = 0.0
    notes: list[str] = []
    first_tol: Tolerance | None = None
    reference_writes_inputs = False

    rule = CorrectnessRule(rtol=rtol, atol=atol, fixed=tolerance)
    kb_failure: str | None = None
    kb_max_abs = 0.0

    def tolerance_for(dtype: Any) -> Tolerance:
        # The rule of the reduced precision found so far (the reference's first trial).
        return rule.fallback()(dtype)

    def rule_fields() -> dict[str, Any]:
        fields = rule.summary()
        fields["rule_state"] = rule
        if kernelbench:
            fields["kernelbench"] = {
                "passed": kb_failure is None,
                "rtol": KERNELBENCH.rtol,
                "atol": KERNELBENCH.atol,
                "max_abs_err": json_float(kb_max_abs),
                "failure": kb_failure,
            }
        return fields

    def failed_before_comparison(failure: str, expected: Any, **extra: Any) -> CorrectnessResult:
        """This trial's failure found before its outputs were compared: the errors so far,
        and the tolerance of the first comparison (or of the expected output's dtype)."""
        return CorrectnessResult(
            passed=False,
            trials=trials,
            trials_run=trial + 1,
            max_abs_err=max_abs,
            max_rel_err=max_rel,
            tolerance=first_tol or tolerance_for(getattr(expected, "dtype", None)),
            failure=failure,
            worst_index=None,
            output_path=None,
            notes=tuple(notes),
            tf32=tf32_mode == "tf32",
            **rule_fields(),
            **extra,
        )

    for trial in range(trials):
        trial_seed = seed + trial
        where = f"trial {trial + 1} of {trials} (inputs seed {trial_seed})"
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(trial_seed)
            try:
                inputs = make_inputs(trial_seed)
            except KernelproError:
                raise
            except Exception as exc:
                raise KernelproError(
                    f"the input factory raised {type(exc).__name__} for seed {trial_seed}: {exc}"
                ) from exc
        if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)):
            inputs = (inputs,)
        ref_copy: list[Any] = []  # the reference's copy of the inputs, of its last call

        def run_reference(inputs: Any = inputs, ref_copy: list[Any] = ref_copy) -> Any:
            ref_copy[:] = [clone_inputs(torch, inputs)]
            out = reference(*ref_copy[0])
            _sync(torch, device)
            return out

        try:
            # The first trial records which fp32 matmuls/convs the reference runs, for the
            # TF32 (or bf16) tolerance (measure/tolerance.py); the rule is the sandbox's too.
            started = time.perf_counter()
            expected, mode = run_recording_precision(
                torch, run_reference, device, record=trial == 0
            )
            reference_s = time.perf_counter() - started
            reference_writes_inputs = reference_writes_inputs or (
                _changed_input(torch, inputs, ref_copy[0]) is not None
            )
        except KernelproError:
            raise
        except Exception as exc:
            # Its traceback from the reference's frames down: where in the user's code it broke.
            raise KernelproError(
                f"the reference raised {type(exc).__name__} on {where}: {exc}\n"
                f"{_reference_exception_text(exc)}"
            ) from exc
        # The reference's copy goes before the kernel's is made: two input sets at a time,
        # not three (a large-input, small-output problem peaked at 3.25x its footprint).
        ref_copy.clear()
        del run_reference  # it holds this trial's inputs, which go after the kernel's run
        if trial == 0:
            tf32_mode = rule.reduced = mode
            if truth:
                # The first trial's inputs, re-run in higher precision: the truth the
                # kernel and the reference are measured against (measure/truth.py).
                rule.set_truth(
                    run_truth(
                        torch, reference, inputs, expected, device=device, reference_s=reference_s
                    )
                )
        ker_inputs = clone_inputs(torch, inputs)
        if device.startswith("cuda"):
            prepoison_cuda_cache(torch, expected)
        try:
            with poisoned_allocations(torch):
                got = kernel(*ker_inputs)
                _sync(torch, device)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            return failed_before_comparison(
                f"The kernel raised {text.strip()} on {where}.\n{_kernel_exception_text(exc)}",
                expected,
                exception=text[:500],
                cuda_error=is_cuda_error(exc),
            )
        # A kernel that writes into its inputs breaks its caller (and hides a reused scratch
        # buffer); that is a failure unless the reference does the same by design.
        changed = None if reference_writes_inputs else _changed_input(torch, inputs, ker_inputs)
        del inputs
        if changed is not None:
            return failed_before_comparison(
                f"The kernel writes into {changed} on {where}; the reference "
                "leaves its inputs unchanged. Write into a new or scratch tensor instead.",
                expected,
            )
        reports = rule.judge(torch, got, expected)
        if kernelbench and _implies(reports, KERNELBENCH) and trial > 0:
            # Every leaf passed an allclose at most as loose as KernelBench's (the calibrated
            # tolerance of a later trial): its check passes too, with the same max abs error.
            kb_max_abs = max([kb_max_abs, *(r.max_abs for r in reports)])
        elif kernelbench:
            for kb in compare_outputs(torch, got, expected, lambda _dtype: KERNELBENCH):
                kb_max_abs = max(kb_max_abs, kb.max_abs)
                if not kb.ok and kb_failure is None:
                    kb_failure = f"{kb.message} Failed on {where}."[:600]
        for report in reports:
            first_tol = first_tol or report.tolerance
            max_abs = max(max_abs, report.max_abs)
            max_rel = max(max_rel, report.max_rel)
            # One note per output path (later trials repeat it with other counts).
            notes.extend(
                n for n in report.notes if not any(o.startswith(report.path + ":") for o in notes)
            )
            if (
                worst is None
                or report.worst_ratio > worst.worst_ratio
                or (not report.ok and worst.ok)
            ):
                worst = report
        failed = [r for r in reports if not r.ok]
        if failed:
            text = failure_text(failed)
            hint = ""
            if any(r.kind == "values" for r in failed) and rule.name.startswith("dtype default"):
                hint = (
                    " If this is rounding (a long reduction or matmul accumulates error with its"
                    " length), set rtol=/atol= on the kernelpro marker."
                )
            first = failed[0]
            return CorrectnessResult(
                passed=False,
                trials=trials,
                trials_run=trial + 1,
                max_abs_err=max_abs,
                max_rel_err=max_rel,
                tolerance=first.tolerance,
                failure=f"{text} Failed on {where}.{hint}",
                worst_index=first.worst_index,
                output_path=first.path,
                worst_ratio=first.worst_ratio,
                notes=tuple(notes),
                tf32=tf32_mode == "tf32",
                **rule_fields(),
            )
        # This trial's tensors go before the next trial makes its inputs: a large problem
        # must not hold two trials' inputs and outputs at once.
        del expected, got, ker_inputs, reports, failed
    assert worst is not None  # at least one trial ran and every output produced a report
    return CorrectnessResult(
        passed=True,
        trials=trials,
        trials_run=trials,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        tolerance=worst.tolerance,
        failure=None,
        worst_index=worst.worst_index,
        output_path=worst.path,
        worst_ratio=worst.worst_ratio,
        notes=tuple(notes),
        tf32=tf32_mode == "tf32",
        **rule_fields(),
    )
