"""The correctness check: runs the kernel and the reference on fresh inputs, trial by trial,
and decides by the rule of `output_rule`.

Trial n's inputs are `make_inputs(seed + n)` under that torch seed; the reference and the
kernel get their own clones. The kernel runs with uninitialized memory poisoned (NaN, or an
integer's largest value; on CUDA freed blocks of the outputs' sizes too), so an element it
never writes fails; writing into its inputs fails unless the reference does too. After
timing it runs once more on its timed inputs refilled in place (`recheck_after_timing`).

The first trial records the reduced precision the reference's fp32 matmuls may run in and
re-runs the reference wider on its inputs (`run_truth`), unless its outputs are float64 or
not floating, it would not fit or take too long, or the re-run fails or is no truth (the
record says why). KernelBench files also get KernelBench's own verdict beside the gate's.

A kernel that raises fails; a reference or input factory that raises is a `KernelproError`.
Imports only the standard library and sibling modules without the plugin (the sandbox's
children import it).
"""

from __future__ import annotations

import contextlib
import copy
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.fp32_precision import run_recording_precision
from pytest_kernelpro.measure.output_rule import (
    KERNELBENCH,
    CorrectnessRule,
    LeafReport,
    Tolerance,
    Truth,
    chunk_ranges,
    clone_inputs,
    compare_outputs,
    failure_text,
    json_float,
    leaves_of,
    map_tensors,
    measure_reference_error,
    tensor_leaves,
)
from pytest_kernelpro.measure.timing.fresh_inputs import overlaps_itself


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
    rule: str | None = None  # which rule decided (`output_rule.CorrectnessRule.name`)
    factor: float | None = None  # the kernel within this many times the reference's error
    kernel_error: float | None = None  # ||kernel - truth|| / ||truth|| on the first trial
    reference_error: float | None = None  # ||reference - truth|| / ||truth||, same inputs
    truth: dict[str, Any] | None = None  # precision, seconds, peak_bytes, skipped (why not)
    kernelbench: dict[str, Any] | None = None  # KernelBench's own verdict (KernelBench files)
    # The rule with what the first trial's truth calibrated, for `recheck_after_timing`.
    rule_state: Any = field(default=None, compare=False, repr=False)


def check_correctness(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[int], Sequence[Any]],
    *,
    device: str,
    trials: int = 3,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    truth: bool = True,
    kernelbench: bool = False,
) -> CorrectnessResult:
    """Run `trials` trials of kernel vs reference, stopping at the first failure, by the
    `CorrectnessRule` (with a truth if `truth`; the marker's `rtol`/`atol` override it);
    `kernelbench`: KernelBench's verdict too."""
    if trials < 1:
        raise KernelproError(f"check_correctness(trials={trials!r}): need at least one trial")
    rule = CorrectnessRule(rtol=rtol, atol=atol)
    run = _Trials(kernel, reference, make_inputs, device, trials, seed, truth, rule, kernelbench)
    for trial in range(trials):
        failed = run.trial(trial)
        if failed is not None:
            return failed
    worst = run.worst
    assert worst is not None  # at least one trial ran and every output produced a report
    return run.result(passed=True, tolerance=worst.tolerance, leaf=worst)


@dataclass
class _Trials:
    """One check's trials and what they found so far."""

    kernel: Callable[..., Any]
    reference: Callable[..., Any]
    make_inputs: Callable[[int], Sequence[Any]]
    device: str
    trials: int
    seed: int
    truth: bool
    rule: CorrectnessRule
    kernelbench: bool
    trials_run: int = 0
    reduced: str | None = None  # the reduced precision of the reference's fp32 matmuls
    reference_writes_inputs: bool = False  # by design: the kernel may too
    max_abs: float = 0.0
    max_rel: float = 0.0
    notes: list[str] = field(default_factory=list)
    first_tolerance: Tolerance | None = None  # of the first output compared
    worst: LeafReport | None = None  # the failing, else the closest-to-failing output
    kernelbench_failure: str | None = None
    kernelbench_max_abs: float = 0.0

    def trial(self, trial: int) -> CorrectnessResult | None:
        """One trial; its failed result, or None. Its inputs and outputs live only in this
        call: a large problem must not hold two trials' tensors at once."""
        import torch

        trial_seed = self.seed + trial
        where = f"trial {trial + 1} of {self.trials} (inputs seed {trial_seed})"
        self.trials_run = trial + 1
        inputs = self._inputs(torch, trial_seed)
        expected, reference_s = self._run_reference(torch, inputs, where, first=trial == 0)
        if trial == 0 and self.truth:
            found = run_truth(
                torch, self.reference, inputs, expected, device=self.device, reference_s=reference_s
            )
            self.rule.set_truth(found)
        ker_inputs = clone_inputs(torch, inputs)
        if self.device.startswith("cuda"):
            prepoison_cuda_cache(torch, expected)
        try:
            with poisoned_allocations(torch):
                got = self.kernel(*ker_inputs)
                _sync(torch, self.device)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            return self.failed_before_comparison(
                f"The kernel raised {text.strip()} on {where}.\n{_kernel_exception_text(exc)}",
                expected,
                exception=text[:500],
                cuda_error=is_cuda_error(exc),
            )
        # Writing into its inputs breaks the caller: a failure unless the reference does too.
        changed = (
            None if self.reference_writes_inputs else _changed_input(torch, inputs, ker_inputs)
        )
        del inputs
        if changed is not None:
            return self.failed_before_comparison(
                f"The kernel writes into {changed} on {where}; the reference "
                "leaves its inputs unchanged. Write into a new or scratch tensor instead.",
                expected,
            )
        reports = self.rule.judge(torch, got, expected)
        if self.kernelbench:
            self._kernelbench(torch, got, expected, reports, trial, where)
        self._gather(reports)
        failed = [r for r in reports if not r.ok]
        if not failed:
            return None
        hint = ""
        if any(r.kind == "values" for r in failed) and self.rule.name.startswith("dtype default"):
            hint = (
                " If this is rounding (a long reduction or matmul accumulates error with its"
                " length), set rtol=/atol= on the kernelpro marker."
            )
        return self.result(
            passed=False,
            tolerance=failed[0].tolerance,
            failure=f"{failure_text(failed)} Failed on {where}.{hint}",
            leaf=failed[0],
        )

    def _inputs(self, torch: Any, trial_seed: int) -> Sequence[Any]:
        """The trial's inputs, made under its own seed (the caller's random state restored)."""
        cuda_devices = (
            [torch.device(self.device).index or 0] if self.device.startswith("cuda") else []
        )
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(trial_seed)
            try:
                inputs = self.make_inputs(trial_seed)
            except KernelproError:
                raise
            except Exception as exc:
                raise KernelproError(
                    f"the input factory raised {type(exc).__name__} for seed {trial_seed}: {exc}"
                ) from exc
        if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)):
            return (inputs,)
        return inputs

    def _run_reference(
        self, torch: Any, inputs: Sequence[Any], where: str, *, first: bool
    ) -> tuple[Any, float]:
        """The reference's output on its own copy of `inputs` and its wall time; the first
        trial records the reduced precision its fp32 matmuls may run in. The copy is gone
        when this returns: two input sets while the kernel runs, not three."""
        copied: list[Any] = []  # the reference's copy of the inputs, of its last call

        def call() -> Any:
            copied[:] = [clone_inputs(torch, inputs)]
            out = self.reference(*copied[0])
            _sync(torch, self.device)
            return out

        try:
            started = time.perf_counter()
            expected, mode = run_recording_precision(torch, call, self.device, record=first)
            reference_s = time.perf_counter() - started
            self.reference_writes_inputs = self.reference_writes_inputs or (
                _changed_input(torch, inputs, copied[0]) is not None
            )
        except KernelproError:
            raise
        except Exception as exc:
            # Its traceback from the reference's frames down: where in the user's code it broke.
            raise KernelproError(
                f"the reference raised {type(exc).__name__} on {where}: {exc}\n"
                f"{_reference_exception_text(exc)}"
            ) from exc
        if first:
            self.reduced = self.rule.reduced = mode
        return expected, reference_s

    def _kernelbench(
        self, torch: Any, got: Any, expected: Any, reports: list[LeafReport], trial: int, where: str
    ) -> None:
        """KernelBench's own verdict on this trial, beside the gate's."""
        if trial > 0 and _implies(reports, KERNELBENCH):
            # Every leaf passed an allclose no looser than KernelBench's: so does its check.
            self.kernelbench_max_abs = max(
                [self.kernelbench_max_abs, *(r.max_abs for r in reports)]
            )
            return
        for kb in compare_outputs(torch, got, expected, lambda _dtype: KERNELBENCH):
            self.kernelbench_max_abs = max(self.kernelbench_max_abs, kb.max_abs)
            if not kb.ok and self.kernelbench_failure is None:
                self.kernelbench_failure = f"{kb.message} Failed on {where}."[:600]

    def _gather(self, reports: list[LeafReport]) -> None:
        for report in reports:
            self.first_tolerance = self.first_tolerance or report.tolerance
            self.max_abs = max(self.max_abs, report.max_abs)
            self.max_rel = max(self.max_rel, report.max_rel)
            # One note per output path (later trials repeat it with other counts).
            self.notes.extend(
                n
                for n in report.notes
                if not any(o.startswith(report.path + ":") for o in self.notes)
            )
            worst = self.worst
            if worst is None or report.worst_ratio > worst.worst_ratio or worst.ok > report.ok:
                self.worst = report

    def failed_before_comparison(
        self, failure: str, expected: Any, **extra: Any
    ) -> CorrectnessResult:
        """A failure found before the outputs were compared: the errors so far, and the first
        comparison's tolerance (or the expected output dtype's)."""
        tolerance = self.first_tolerance or self.rule(getattr(expected, "dtype", None))
        return self.result(passed=False, tolerance=tolerance, failure=failure, **extra)

    def result(
        self,
        *,
        passed: bool,
        tolerance: Tolerance,
        failure: str | None = None,
        leaf: LeafReport | None = None,
        **extra: Any,
    ) -> CorrectnessResult:
        """The check's result now; `leaf`: the output it names (the failing or the worst)."""
        kernelbench = self.kernelbench and {
            "passed": self.kernelbench_failure is None,
            "rtol": KERNELBENCH.rtol,
            "atol": KERNELBENCH.atol,
            "max_abs_err": json_float(self.kernelbench_max_abs),
            "failure": self.kernelbench_failure,
        }
        return CorrectnessResult(
            passed=passed,
            trials=self.trials,
            trials_run=self.trials_run,
            max_abs_err=self.max_abs,
            max_rel_err=self.max_rel,
            tolerance=tolerance,
            failure=failure,
            worst_index=None if leaf is None else leaf.worst_index,
            output_path=None if leaf is None else leaf.path,
            worst_ratio=0.0 if leaf is None else leaf.worst_ratio,
            notes=tuple(self.notes),
            tf32=self.reduced == "tf32",
            kernelbench=kernelbench or None,
            rule_state=self.rule,
            **self.rule.summary(),
            **extra,
        )


def _implies(reports: Sequence[LeafReport], looser: Tolerance) -> bool:
    """Every leaf passed by an elementwise allclose no looser than `looser`."""
    return all(
        r.ok and r.tolerance.rtol <= looser.rtol and r.tolerance.atol <= looser.atol
        for r in reports
    )


def kept_rule(
    correctness: CorrectnessResult, *, rtol: float | None, atol: float | None
) -> CorrectnessRule:
    """The trials' rule as calibrated, for a later check of the same kernel; for a result
    made elsewhere, the dtype rule as its trials ran it, with the marker's `rtol`/`atol`."""
    rule = correctness.rule_state
    if isinstance(rule, CorrectnessRule):
        return rule
    rule = CorrectnessRule(rtol=rtol, atol=atol)
    rule.reduced = "tf32" if correctness.tf32 else None
    return rule


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
    """The failure text of the kernel once more after timing, on its timed inputs refilled in
    place, by the trials' rule; or None. A kernel correct only during the trials (counts its
    calls, caches by input address, leaves work for later) fails here."""
    import torch

    # A factory's fresh set lives only for the copy: one input set held, not two.
    fresh = fresh_inputs() if callable(fresh_inputs) else fresh_inputs
    for dst, src in zip(
        tensor_leaves(torch, timed_inputs), tensor_leaves(torch, fresh), strict=False
    ):
        # A broadcast input (elements sharing memory) cannot be refilled: it keeps its content.
        if dst.shape == src.shape and dst.dtype == src.dtype and not overlaps_itself(dst):
            dst.copy_(src)
    # The loop variables too: `src` would keep the last fresh tensor through the reference.
    dst = src = fresh = None
    _sync(torch, device)
    rule = kept_rule(correctness, rtol=rtol, atol=atol)
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
    text = "correct in the trials, but wrong once timed (timed inputs refilled in place): "
    return text + failure_text(failed)


@contextlib.contextmanager
def poisoned_allocations(torch: Any) -> Iterator[None]:
    """Uninitialized tensors NaN (floats) / max-int (ints) inside the block, by torch's
    deterministic mode (warn-only) with `fill_uninitialized_memory`; the warnings the mode
    itself causes are swallowed."""
    det_mod = torch.utils.deterministic
    prev = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        det_mod.fill_uninitialized_memory,
    )
    # The public setter also flips inductor's `deterministic` config (importing inductor and
    # changing what torch.compile makes); the C setter does only the dispatcher part.
    set_mode = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_mode is None:
        set_mode = torch.use_deterministic_algorithms
    with warnings.catch_warnings():
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
    """Fill freed caching-allocator blocks of the outputs' sizes with poison, for kernels
    that allocate raw (not through `at::empty`). Best effort: what does not fit or cannot be
    filled (float8) is skipped."""
    blocks = []
    for leaf in tensor_leaves(torch, expected):
        if not leaf.is_cuda or leaf.numel() == 0 or leaf.numel() * leaf.element_size() > 2**31:
            continue
        value = _poison_value(torch, leaf.dtype)
        # Three blocks for small outputs (temporaries share their sizes), one for large ones.
        for _ in range(3 if leaf.numel() * leaf.element_size() <= _POISON_SMALL_BYTES else 1):
            try:
                blocks.append(
                    torch.full((leaf.numel(),), value, dtype=leaf.dtype, device=leaf.device)
                )
            except RuntimeError:  # out of memory, or no fill kernel for this dtype
                break
    del blocks  # back to the cache, poisoned


def is_cuda_error(exc: BaseException) -> bool:
    """True for a CUDA runtime error (`torch.AcceleratorError` or "CUDA error: ..."), after
    which the process's CUDA context is unusable. Running out of memory is not one: the
    allocator's `OutOfMemoryError` and cudaErrorMemoryAllocation ("CUDA error: out of
    memory") leave the context usable once the failed item's memory is freed."""
    text = f"{type(exc).__name__}: {exc}"
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text:
        return False
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


def _chunks(torch: Any, a: Any, b: Any) -> list[tuple[Any, Any]]:
    """`a` and `b` (same shape) as pairs of flat views of `chunk_ranges`' size: CUDA's
    `torch.equal` and `==` make a temporary the size of their operands."""
    steps = chunk_ranges(a.numel(), a.device)
    if len(steps) <= 1 or not (a.is_contiguous() and b.is_contiguous()):
        return [(a, b)]
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)  # views: both are contiguous
    return [(flat_a[i : i + steps.step], flat_b[i : i + steps.step]) for i in steps]


def _changed_input(torch: Any, original: Any, used: Any, path: str = "input") -> str | None:
    """The first input tensor (path, elements changed) that differs bitwise between
    `original` and `used` (NaN equal to NaN), else None."""
    if isinstance(original, torch.Tensor) and isinstance(used, torch.Tensor):
        if original.shape != used.shape or original.dtype != used.dtype:
            return f"{path} (its shape or dtype changed)"
        diff = 0  # elements that differ bitwise, NaN equal to NaN
        for x, y in _chunks(torch, original.detach(), used.detach()):
            if not torch.equal(x, y):
                same = x == y
                if x.is_floating_point() or x.is_complex():
                    same = same | (torch.isnan(x) & torch.isnan(y))
                diff += int((~same).sum())
        return None if diff == 0 else f"{path} ({diff} of {original.numel()} elements changed)"
    if isinstance(original, (list, tuple)) and isinstance(used, (list, tuple)):
        for i, (x, y) in enumerate(zip(original, used, strict=False)):
            found = _changed_input(torch, x, y, f"{path}[{i}]" if path != "input" else f"input {i}")
            if found:
                return found
    elif isinstance(original, dict) and isinstance(used, dict):
        for key in original:
            found = key in used and _changed_input(
                torch, original[key], used[key], f"{path}[{key!r}]"
            )
            if found:
                return found
    return None


# The truth: the reference re-run on widened copies (fp32 outputs -> float64, narrower ->
# float32), its default dtype the wide one, fp32 matmuls in full fp32. Its cost against the
# reference's: float64 on a GPU runs at a fraction of the TF32 rate; on a CPU about 2x fp32.
SLOWDOWN = {"cuda": 64.0, "cpu": 4.0}
TIME_BUDGET_S = 30.0  # the re-run's estimated wall time above this: skipped


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
    its counterpart); other tensors copied, other objects shared."""

    def widened(tensor: Any) -> Any:
        if tensor.is_complex() and wide == torch.float64 and tensor.dtype != torch.complex128:
            return tensor.detach().to(torch.complex128)
        if (
            tensor.is_floating_point()
            and tensor.element_size() < torch.empty((), dtype=wide).element_size()
        ):
            return tensor.detach().to(wide)
        return tensor.detach().clone()

    return map_tensors(torch, value, widened)


def _widened_module(torch: Any, module: Any, wide: Any) -> Any:
    """A copy of `module` with its parameters, buffers and tensor attributes widened, not
    first copied in their own dtype (deepcopy's memo is pre-filled)."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for tensor in [*vars(sub).values(), *sub._parameters.values(), *sub._buffers.values()]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                widened = _widen(torch, tensor, wide)
                if isinstance(tensor, torch.nn.Parameter):
                    widened = torch.nn.Parameter(widened, requires_grad=False)
                memo[id(tensor)] = widened
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
    flags = None
    if device.startswith("cuda"):
        from pytest_kernelpro.measure.fp32_tensor_cores import (
            apply_fp32_precision_flags,
            fp32_precision_flags,
        )

        flags = fp32_precision_flags(torch)
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


def run_truth(
    torch: Any,
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    expected: Any,
    *,
    device: str,
    reference_s: float | None = None,
    arrange: Callable[[Any], Any] | None = None,
    consume_inputs: bool = False,
    remake: Callable[[], Any] | None = None,
) -> Truth:
    """Re-run `reference` on widened copies of `inputs` and measure `expected` against it; a
    `Truth` with the reason when it cannot. `reference_s`: the reference's call time (None:
    no time bound); `arrange`: what the caller did to the reference's output, done to the
    re-run's too; `consume_inputs`: `inputs` is a list nobody else holds, emptied once
    widened (one input set fewer during the re-run). `remake`: `expected` only describes the
    output (its tensors may be on the `meta` device) and the output measured is `remake()`,
    called once the re-run's output exists and its widened inputs are gone: the re-run then
    holds no reference output beside it (the caller keeps what `remake` returned)."""
    wide, why_not = wide_dtype(torch, expected)
    if wide is None:
        return Truth(precision=None, skipped=why_not)
    precision = str(wide).removeprefix("torch.")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if reference_s is not None and reference_s * SLOWDOWN[kind] > TIME_BUDGET_S:
        return Truth(
            precision,
            f"too slow: the reference's call took {reference_s:.3g} s; in {precision} about "
            f"{SLOWDOWN[kind]:g}x that on {kind}, above the {TIME_BUDGET_S:g} s budget",
        )
    cuda = device.startswith("cuda")
    if cuda:
        from pytest_kernelpro.measure.gpu_memory import truth_shortfall

        try:
            owner = getattr(reference, "__self__", reference)
            short = truth_shortfall(torch, (inputs, expected, owner), device)
        except RuntimeError as exc:
            short = f"device memory could not be read ({exc})"
        if short:
            return Truth(precision=precision, skipped=short)
        torch.cuda.synchronize(device)
        peak_before = torch.cuda.max_memory_allocated(device)
        start = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    truth = _rerun(
        torch, reference, inputs, expected, wide, device, arrange, consume_inputs, remake
    )
    if cuda:
        # The peak above the start; the counter is not reset (the item's memory record reads
        # it), so an earlier, higher peak gives an upper bound (exact False).
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        truth.peak_bytes, truth.peak_exact = max(0, peak - start), peak > peak_before
    truth.seconds = time.perf_counter() - started  # the re-run and the reference's errors
    return truth


def _rerun(
    torch: Any,
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    expected: Any,
    wide: Any,
    device: str,
    arrange: Callable[[Any], Any] | None,
    consume_inputs: bool = False,
    remake: Callable[[], Any] | None = None,
) -> Truth:
    """The re-run and each floating leaf's errors (`run_truth` times and meters it)."""
    precision = str(wide).removeprefix("torch.")
    try:
        with _wide_mode(torch, wide, device):
            wide_ref = widened_reference(torch, reference, wide)
            wide_inputs = _widen(torch, list(inputs), wide)
            if consume_inputs and isinstance(inputs, list):
                inputs.clear()
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
    if remake is not None:
        expected = remake()
    if arrange is not None:
        wide_out = arrange(wide_out)
    wide_leaves = dict(leaves_of(torch, wide_out))
    ref_leaves = list(leaves_of(torch, expected))
    if set(wide_leaves) != {p for p, _ in ref_leaves}:
        truth.skipped = "the re-run returned another output structure"
        return truth
    for path, ref in ref_leaves:
        if (
            not isinstance(ref, torch.Tensor)
            or not ref.is_floating_point()
            and not ref.is_complex()
            or ref.numel() == 0
        ):
            continue
        found = measure_reference_error(torch, path, ref, wide_leaves[path])
        if isinstance(found, str):
            truth.skipped, truth.leaves = found, {}
            return truth
        truth.leaves[path] = found
    return truth
