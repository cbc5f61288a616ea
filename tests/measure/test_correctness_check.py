"""check_correctness: trials, poisoning, NaN rules, structure checks, tolerances."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.errors import KernelproError  # noqa: E402
from pytest_kernelpro.measure.correctness_check import (  # noqa: E402
    check_correctness,
    is_cuda_error,
    poisoned_allocations,
)
from pytest_kernelpro.measure.fp32_tensor_cores import fp32_reduced_mode  # noqa: E402
from pytest_kernelpro.measure.output_rule import Tolerance, default_tolerance  # noqa: E402
from pytest_kernelpro.record import CorrectnessPart, part_of  # noqa: E402


def _record_form(result: Any) -> Any:
    """The result as the record keeps it (`record.part_of`), in builtins for `json.dumps`."""
    return msgspec.to_builtins(part_of(CorrectnessPart, result))


def randn_inputs(seed: int) -> tuple[Any, ...]:
    return (torch.randn(64, 32, generator=torch.Generator().manual_seed(seed)),)


def double(x: Any) -> Any:
    return x * 2


def test_exact_pass_reports_zero_error() -> None:
    r = check_correctness(double, double, randn_inputs, device="cpu")
    assert r.passed
    assert r.failure is None
    assert (r.trials, r.trials_run) == (3, 3)
    assert r.max_abs_err == 0.0
    assert r.max_rel_err == 0.0
    # Changed with issue 27: an fp32 reference that runs in float64 is judged against that
    # truth (measure/accuracy.py), no longer by the dtype default; the record says so.
    assert r.rule == "within 8x the reference's own error against its float64 re-run"
    assert r.tolerance.source.startswith(r.rule)
    assert r.truth is not None
    assert r.truth["precision"] == "float64"
    assert r.kernel_error == r.reference_error == 0.0  # x * 2 is exact in both precisions
    json.dumps(_record_form(r), allow_nan=False)


@pytest.mark.parametrize(("offset", "passes"), [(0.9e-3, True), (1.1e-3, False)])
def test_tolerance_edge(offset: float, passes: bool) -> None:
    def inputs(seed: int) -> tuple[Any, ...]:
        return (
            torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)),
        )

    tol = Tolerance(rtol=0.0, atol=1e-3, source="marker")
    r = check_correctness(
        lambda x: x + offset, lambda x: x, inputs, device="cpu", rtol=tol.rtol, atol=tol.atol
    )
    assert r.passed is passes
    assert r.worst_ratio == pytest.approx(offset / 1e-3, rel=1e-6)
    assert r.max_abs_err == pytest.approx(offset, rel=1e-6)
    assert r.tolerance == tol
    if not passes:
        assert "100 of 100 elements" in r.failure
        assert "atol=0.001 (marker)" in r.failure


def test_relative_tolerance_follows_allclose() -> None:
    def inputs(seed: int) -> tuple[Any, ...]:
        return (torch.tensor([1.0, 100.0, 1000.0], dtype=torch.float64),)

    ok = check_correctness(
        lambda x: x * (1 + 0.9e-3), lambda x: x, inputs, device="cpu", rtol=1e-3, atol=0.0
    )
    bad = check_correctness(
        lambda x: x * (1 + 1.1e-3), lambda x: x, inputs, device="cpu", rtol=1e-3, atol=0.0
    )
    assert ok.passed
    assert not bad.passed
    assert bad.max_rel_err == pytest.approx(1.1e-3, rel=1e-6)
    assert bad.max_abs_err == pytest.approx(1.1, rel=1e-6)


def test_nan_in_output_fails() -> None:
    def kernel(x: Any) -> Any:
        out = x * 2
        out[5, 7] = float("nan")
        return out

    r = check_correctness(kernel, double, randn_inputs, device="cpu")
    assert not r.passed
    assert r.worst_index == (5, 7)
    assert r.output_path == "output"
    assert "1 NaN where the reference is a number, first at index (5, 7)" in r.failure
    assert "got nan" in r.failure
    json.dumps(_record_form(r), allow_nan=False)


def test_nan_in_reference_and_output_at_same_place_passes_with_a_note() -> None:
    r = check_correctness(torch.log, torch.log, randn_inputs, device="cpu")
    assert r.passed
    assert len(r.notes) == 1
    assert "reference itself produced NaN" in r.notes[0]


def test_reference_nan_where_kernel_is_finite_fails() -> None:
    r = check_correctness(lambda x: torch.log(x.abs()), torch.log, randn_inputs, device="cpu")
    assert not r.passed
    assert "where the reference is NaN and the kernel is not" in r.failure


def test_poisoning_catches_an_unwritten_element() -> None:
    def partial(x: Any) -> Any:
        out = torch.empty_like(x)
        out.view(-1)[:-1] = (x * 2).view(-1)[:-1]
        return out

    r = check_correctness(partial, double, randn_inputs, device="cpu")
    assert not r.passed
    assert r.trials_run == 1
    assert r.worst_index == (63, 31)
    assert "first at index (63, 31)" in r.failure
    assert "never written" in r.failure


def test_poisoning_catches_unwritten_integers() -> None:
    def inputs(seed: int) -> tuple[Any, ...]:
        return (torch.arange(10, dtype=torch.int32),)

    def partial(x: Any) -> Any:
        out = x.new_empty(x.shape)
        out[:-1] = x[:-1] + 1
        return out

    r = check_correctness(partial, lambda x: x + 1, inputs, device="cpu")
    assert not r.passed
    assert r.worst_index == (9,)
    assert "2147483647 is the poison value for int32" in r.failure
    assert r.tolerance.source == "exact for torch.int32"


def test_poison_scope_restores_settings() -> None:
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    with poisoned_allocations(torch):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.isnan(torch.empty(4)).all()
    after = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    assert before == after


def test_in_place_kernel_cannot_corrupt_the_reference() -> None:
    def in_place_kernel(x: Any) -> Any:
        return x.mul_(2)

    def in_place_reference(x: Any) -> Any:
        return x.add_(x)

    r = check_correctness(in_place_kernel, in_place_reference, randn_inputs, device="cpu")
    assert r.passed
    assert r.max_abs_err == 0.0


def test_shape_mismatch_message() -> None:
    r = check_correctness(lambda x: x.t() * 2, double, randn_inputs, device="cpu")
    assert not r.passed
    assert (
        "kernel returned shape (32, 64) dtype float32; reference returned (64, 32) float32"
        in r.failure
    )
    assert "rtol=" not in r.failure  # no tolerance hint for a structural error


def test_dtype_mismatch_message() -> None:
    def inputs(seed: int) -> tuple[Any, ...]:
        return (torch.randn(8, 4),)

    r = check_correctness(lambda x: (x * 2).half(), double, inputs, device="cpu")
    assert not r.passed
    assert (
        "kernel returned shape (8, 4) dtype float16; reference returned (8, 4) float32" in r.failure
    )


def test_tuple_outputs_name_the_failing_item() -> None:
    ok = check_correctness(lambda x: (x, x * 2), lambda x: (x, x * 2), randn_inputs, device="cpu")
    assert ok.passed
    bad = check_correctness(lambda x: [x, x * 3], lambda x: (x, x * 2), randn_inputs, device="cpu")
    assert not bad.passed
    assert bad.output_path == "output[1]"
    # Since issue 27 the diagnosis of an output that is the reference times a constant
    # leads the message; the element count follows.
    assert bad.failure.startswith("output[1]: the kernel returned 1.5 times the reference")
    assert "output[1]: 2048 of 2048 elements" in bad.failure


def test_nested_and_length_mismatch() -> None:
    def ref(x: Any) -> Any:
        return {"y": (x, x + 1), "n": 3}

    assert check_correctness(ref, ref, randn_inputs, device="cpu").passed
    r = check_correctness(lambda x: {"y": (x,), "n": 3}, ref, randn_inputs, device="cpu")
    assert not r.passed
    assert r.output_path == "output['y']"
    assert "kernel returned a tuple of 1 items; reference returned a tuple of 2 items" in r.failure


def test_kernel_raising_is_a_failed_result() -> None:
    def broken_kernel(x: Any) -> Any:
        raise ValueError("BLOCK_SIZE must be a power of two, got 96")

    r = check_correctness(broken_kernel, double, randn_inputs, device="cpu")
    assert not r.passed
    assert r.trials_run == 1
    assert r.exception == "ValueError: BLOCK_SIZE must be a power of two, got 96"
    assert "in broken_kernel" in r.failure  # the kernel's own frame is in the traceback
    assert not r.cuda_error
    json.dumps(_record_form(r), allow_nan=False)


def test_cuda_errors_are_recognised() -> None:
    assert is_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_cuda_error(RuntimeError("shape mismatch"))


def test_running_out_of_gpu_memory_does_not_mark_the_context_broken() -> None:
    """An H100 sweep once failed 240 problems "not run: the CUDA context was broken" after one
    problem ran out of memory: out of memory is recoverable, the context stays usable."""
    assert not is_cuda_error(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
    )
    assert not is_cuda_error(RuntimeError("CUDA error: out of memory"))
    assert is_cuda_error(RuntimeError("CUDA error: unspecified launch failure"))


def test_reference_or_inputs_raising_is_a_kernelpro_error() -> None:
    def bad_reference(x: Any) -> Any:
        raise RuntimeError("reference broke")

    with pytest.raises(KernelproError, match="the reference raised RuntimeError") as info:
        check_correctness(double, bad_reference, randn_inputs, device="cpu")
    assert isinstance(info.value.__cause__, RuntimeError)

    def bad_inputs(seed: int) -> tuple[Any, ...]:
        raise OSError("no data")

    with pytest.raises(KernelproError, match="input factory raised OSError for seed 0"):
        check_correctness(double, double, bad_inputs, device="cpu")


def test_fresh_inputs_each_trial_and_stop_at_first_failure() -> None:
    seeds: list[int] = []

    def inputs(seed: int) -> tuple[Any, ...]:
        seeds.append(seed)
        return (torch.full((4,), float(seed)),)

    def wrong_on_six(x: Any) -> Any:
        return x + 1 if x[0] != 6 else x

    r = check_correctness(wrong_on_six, lambda x: x + 1, inputs, device="cpu", seed=5, trials=4)
    assert seeds == [5, 6]
    assert not r.passed
    assert (r.trials, r.trials_run) == (4, 2)
    assert "trial 2 of 4 (inputs seed 6)" in r.failure


def test_inputs_are_seeded_and_global_rng_restored() -> None:
    seen = []

    def unseeded_inputs(seed: int) -> tuple[Any, ...]:
        x = torch.randn(3)  # uses the global generator, which check_correctness seeds
        seen.append(x.clone())
        return (x,)

    torch.manual_seed(123)
    expected_next = torch.randn(2)
    torch.manual_seed(123)
    check_correctness(double, double, unseeded_inputs, device="cpu", trials=2)
    assert torch.equal(torch.randn(2), expected_next)  # the caller's stream is untouched
    torch.manual_seed(0)  # trial 1 ran under seed 0
    assert torch.equal(seen[0], torch.randn(3))
    assert not torch.equal(seen[0], seen[1])


def test_bf16_kernel_with_fp32_accumulation_passes_default_tolerance() -> None:
    def inputs(seed: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        return (
            torch.randn(64, 256, generator=g).bfloat16(),
            torch.randn(256, 64, generator=g).bfloat16(),
        )

    def fp32_accumulate(a: Any, b: Any) -> Any:
        return (a.float() @ b.float()).bfloat16()

    r = check_correctness(fp32_accumulate, torch.matmul, inputs, device="cpu")
    assert r.passed, r.failure
    # Changed with issue 27: a bf16 reference is judged against its float32 re-run.
    assert r.tolerance.source.startswith(
        "within 8x the reference's own error against its float32 re-run"
    )
    off = check_correctness(lambda a, b: (a @ b) * 1.03, torch.matmul, inputs, device="cpu")
    assert not off.passed


@pytest.mark.parametrize(
    ("dtype", "rtol", "atol", "source"),
    [
        (torch.float64, 1e-7, 1e-7, "default for torch.float64"),
        (torch.float32, 1e-4, 1e-4, "default for torch.float32"),
        (torch.float16, 1e-2, 1e-2, "default for torch.float16"),
        (torch.bfloat16, 1.6e-2, 1e-2, "default for torch.bfloat16"),
        (torch.int32, 0.0, 0.0, "exact for torch.int32"),
        (torch.bool, 0.0, 0.0, "exact for torch.bool"),
        ("float32", 1e-4, 1e-4, "default for torch.float32"),
    ],
)
def test_default_tolerances(dtype: Any, rtol: float, atol: float, source: str) -> None:
    assert default_tolerance(dtype) == Tolerance(rtol, atol, source)


def test_tf32_and_bf16_matmul_tolerances() -> None:
    tf32 = default_tolerance(torch.float32, reduced="tf32")
    assert (tf32.rtol, tf32.atol) == (1e-2, 1e-2)
    assert "TF32" in tf32.source
    assert default_tolerance(torch.bfloat16, "tf32").source == "default for torch.bfloat16"
    medium = default_tolerance(torch.float32, reduced="bf16")
    assert medium.rtol == 1.6e-2
    assert "bf16" in medium.source
    # bf16's flag governs real fp32 matmuls only: complex64 keeps its own tolerance.
    assert default_tolerance(torch.complex64, "bf16") == default_tolerance(torch.complex64)
    with pytest.raises(KernelproError, match="rtol= and atol= on the kernelpro marker"):
        default_tolerance("quint8")


def test_tf32_mode_follows_torch_flags() -> None:
    matmul = torch.backends.cuda.matmul
    if getattr(matmul, "fp32_precision", "none") not in ("none", "ieee"):
        pytest.skip("this process set the new fp32_precision API")
    previous = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        assert fp32_reduced_mode(torch, "matmul") == "tf32"
        matmul.allow_tf32 = False
        assert fp32_reduced_mode(torch, "matmul") is None
    finally:
        matmul.allow_tf32 = previous
    expected = "tf32" if torch.backends.cudnn.allow_tf32 else None  # cuDNN's default is True
    assert fp32_reduced_mode(torch, "conv") == expected


def test_non_tensor_outputs_compare_exactly() -> None:
    assert default_tolerance(None) == Tolerance(0.0, 0.0, "exact for non-tensor outputs")
    r = check_correctness(
        lambda x: (x * 2, "ok"), lambda x: (x * 2, "okay"), randn_inputs, device="cpu"
    )
    assert not r.passed
    assert r.output_path == "output[1]"
    assert "kernel returned str 'ok'; reference returned str 'okay'" in r.failure


@pytest.mark.gpu
def test_cuda_poisoning_tf32_and_nondeterministic_ops() -> None:
    def inputs(seed: int) -> tuple[Any, ...]:
        return (torch.randn(256, 256, device="cuda"),)

    def partial(x: Any) -> Any:
        out = torch.empty_like(x)
        out[:, :-1] = x[:, :-1] * 2
        return out

    r = check_correctness(partial, double, inputs, device="cuda")
    assert not r.passed
    assert r.worst_index == (0, 255)

    def index_add(x: Any) -> Any:  # nondeterministic on CUDA: warns in the poison scope
        return torch.zeros_like(x).index_add_(0, torch.arange(256, device="cuda"), x * 2)

    assert check_correctness(index_add, double, inputs, device="cuda").passed

    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        mm_inputs = lambda s: (*inputs(s), *inputs(s))  # noqa: E731
        with_truth = check_correctness(torch.mm, torch.mm, mm_inputs, device="cuda")
        without = check_correctness(torch.mm, torch.mm, mm_inputs, device="cuda", truth=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert_tf32_reference_judged(with_truth, without)
    # A real TF32 matmul is off by about 1e-4..1e-3 against its float64 truth (fp32: ~1e-6).
    assert with_truth.reference_error > 1e-5


TF32_TRUTH_RULE = (
    "within 8x the reference's own error against its float64 re-run, or the tf32 tolerance"
    " (its fp32 matmuls/convolutions may run in tf32)"
)


def assert_tf32_reference_judged(with_truth: Any, without: Any) -> None:
    """A kernel equal to a reference whose fp32 matmuls may run in TF32: with the float64 truth
    (issue 27's default) the truth's rule decides and the TF32 tolerance is named next to it;
    without a truth, the dtype default for TF32 decides. The CUDA test and its CPU twin
    (simulated TF32) share these assertions, so a change of the rule fails on the CPU too."""
    assert with_truth.passed, with_truth.failure
    assert with_truth.tf32
    assert with_truth.rule == TF32_TRUTH_RULE
    assert with_truth.tolerance.source.startswith("within 8x the reference's own error")
    assert without.passed, without.failure
    assert without.tf32
    assert without.rule == "dtype default (no higher-precision truth was run)"
    assert "TF32" in without.tolerance.source


def test_tf32_reference_judged_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU twin of the TF32 part of test_cuda_poisoning_tf32_and_nondeterministic_ops:
    this CPU counts as a device whose fp32 matmuls run in TF32 (as tests/measure/
    test_output_rule.py's simulated_tf32)."""
    from pytest_kernelpro.measure import fp32_precision, fp32_tensor_cores

    monkeypatch.setattr(fp32_precision, "TENSOR_CORE_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(
        fp32_tensor_cores,
        "fp32_reduced_mode",
        lambda torch, op: "tf32" if op == "matmul" else None,
    )

    def mm_inputs(seed: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g))

    with_truth = check_correctness(torch.mm, torch.mm, mm_inputs, device="cpu")
    without = check_correctness(torch.mm, torch.mm, mm_inputs, device="cpu", truth=False)
    assert_tf32_reference_judged(with_truth, without)


def test_marker_rtol_alone_keeps_the_dtype_default_atol() -> None:
    """rtol= from a marker replaces only rtol; atol stays the default of the output dtype."""
    import torch

    from pytest_kernelpro.measure.correctness_check import check_correctness
    from pytest_kernelpro.measure.output_rule import default_tolerance

    result = check_correctness(
        torch.neg, torch.neg, lambda seed: (torch.randn(8),), device="cpu", trials=1, rtol=0.5
    )
    assert result.passed
    assert result.tolerance.rtol == 0.5
    assert result.tolerance.atol == default_tolerance(torch.float32).atol
    assert result.tolerance.source == "marker"


# The correctness rule has two homes (`measure/output_rule.py`, `measure/correctness_check.py`);
# the five modules it was spread over are gone, with no re-export left under their names.
@pytest.mark.parametrize("old", ["correctness", "accuracy", "truth", "tolerance", "compare"])
def test_the_old_homes_of_the_rule_are_gone(old: str) -> None:
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"pytest_kernelpro.measure.{old}")


def test_input_copies_and_the_truths_widening_walk_the_same_structures() -> None:
    """One walk (`map_tensors`) for the kernel's copies and the truth's widened inputs: nested
    lists, tuples, namedtuples and dicts rebuilt, tensors copied (strides kept, never the
    caller's storage), other objects shared."""
    from collections import namedtuple

    from pytest_kernelpro.measure import correctness_check

    Pair = namedtuple("Pair", "a b")
    scale = object()
    strided = torch.randn(4, 6).t()
    ints = torch.arange(5)
    inputs = [Pair(strided, {"k": (ints, scale)}), torch.randn(3, dtype=torch.float16)]

    copied = correctness_check.clone_inputs(torch, inputs)
    assert isinstance(copied, list)
    assert type(copied[0]) is Pair
    assert copied[0].a.stride() == strided.stride()
    assert copied[0].a.data_ptr() != strided.data_ptr()
    assert torch.equal(copied[0].a, strided)
    assert copied[0].b["k"][1] is scale
    assert copied[0].b["k"][0].data_ptr() != ints.data_ptr()

    wide = correctness_check._widen(torch, inputs, torch.float64)
    assert type(wide[0]) is Pair
    assert wide[0].a.dtype == torch.float64
    assert wide[1].dtype == torch.float64
    assert wide[0].b["k"][0].dtype == torch.int64  # integers are not floats: kept, but copied
    assert wide[0].b["k"][0].data_ptr() != ints.data_ptr()
    assert wide[0].b["k"][1] is scale
    assert strided.dtype == torch.float32  # the caller's inputs are never written


def test_a_result_without_its_rule_rechecks_by_the_dtype_rule_it_was_judged_by() -> None:
    """A result read back from JSON keeps no rule: the re-check after timing then decides by
    the dtype tolerances, TF32-relaxed where the trials' reference ran in TF32, with the
    marker's rtol/atol (`kept_rule`)."""
    import dataclasses

    from pytest_kernelpro.measure.correctness_check import kept_rule

    result = check_correctness(double, double, randn_inputs, device="cpu", trials=1)
    assert kept_rule(result, rtol=None, atol=None) is result.rule_state
    bare = dataclasses.replace(result, rule_state=None, tf32=True)
    rule = kept_rule(bare, rtol=0.5, atol=None)
    assert rule is not result.rule_state
    assert rule.reduced == "tf32"
    tol = rule(torch.float32)
    assert (tol.rtol, tol.atol) == (0.5, default_tolerance(torch.float32, "tf32").atol)


def test_a_recheck_failure_counts_the_outputs_it_does_not_show() -> None:
    """Wrong once timed on five outputs: the message shows three and counts the rest, as the
    trials' failure does (one `failure_text`)."""
    from pytest_kernelpro.measure.correctness_check import recheck_after_timing

    calls = [0]

    def five(x: Any) -> Any:
        return tuple(x + i for i in range(5))

    def honest_then_off(x: Any) -> Any:
        calls[0] += 1
        return five(x) if calls[0] <= 3 else tuple(o + 1.0 for o in five(x))

    result = check_correctness(honest_then_off, five, randn_inputs, device="cpu")
    assert result.passed, result.failure
    failure = recheck_after_timing(
        honest_then_off,
        five,
        randn_inputs(7),
        lambda: randn_inputs(8),
        device="cpu",
        correctness=result,
    )
    assert failure is not None
    assert failure.startswith("correct in the trials, but wrong once timed")
    assert "output[0]" in failure
    assert "output[2]" in failure
    assert "output[3]" not in failure
    assert "(2 more outputs differ.)" in failure
