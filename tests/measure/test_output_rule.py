"""The correctness model (issue 27): the kernel against a float64 truth, within a factor of
the reference's own error, and outputs that carry no information fail.

The two KernelBench problems of the issue, with their real sizes where the CPU allows:
- level 1 `23_Softmax`: `torch.softmax(x, dim=1)` of `torch.rand(batch, 393216)`; every output
  is 1.5e-6..4e-6, below fp32's default atol (1e-4): zeros, a constant 1/n and twice the
  softmax all passed the dtype default.
- level 2 `14_Gemm_Divide_Sum_Scaling`: `(x @ W.T / 2).sum(1, keepdim=True) * 1.5` with
  K = N = 8192, `W = randn(N, K)` (its `__init__`), `x = torch.rand(batch, K)`; the sum over
  the GEMM's columns is `x @ W.sum(0)`, an exact rewrite the fp32 reference's own error made
  the dtype default reject.
Both problems' code as published in KernelBench (github.com/ScalingIntelligence/KernelBench,
`KernelBench/level1/23_Softmax.py`, `KernelBench/level2/14_Gemm_Divide_Sum_Scaling.py`); the
batch is cut to fit this CPU.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure import (  # noqa: E402
    correctness_check,
    fp32_precision,
    fp32_tensor_cores,
)
from pytest_kernelpro.measure.correctness_check import (  # noqa: E402
    check_correctness,
    recheck_after_timing,
    run_truth,
)
from pytest_kernelpro.measure.output_rule import (  # noqa: E402
    FACTOR,
    CorrectnessRule,
    default_tolerance,
)

TRUTH_RULE = "within 8x the reference's own error against its float64 re-run"
COLUMNS = 393_216  # 23_Softmax's dim


@pytest.fixture
def no_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    """No higher-precision re-run fits the time budget: the dtype tolerances decide."""
    monkeypatch.setattr(correctness_check, "TIME_BUDGET_S", -1.0)


def softmax_inputs(seed: int) -> tuple[Any, ...]:
    return (torch.rand(4, COLUMNS, generator=torch.Generator().manual_seed(seed)),)


def softmax(x: Any) -> Any:
    return torch.softmax(x, dim=1)


def softmax_by_hand(x: Any) -> Any:
    """The same math in another order: exp of the shifted row over its own sum."""
    e = torch.exp(x - x.max(dim=1, keepdim=True).values)
    return e / e.sum(dim=1, keepdim=True)


NO_INFORMATION = [
    pytest.param(torch.zeros_like, "the kernel returned all zeros", id="zeros"),
    pytest.param(
        lambda x: torch.full_like(x, 1.0 / x.shape[1]), "returned one value", id="constant-1/n"
    ),
    pytest.param(lambda x: 2 * torch.softmax(x, dim=1), "returned 2 times", id="twice"),
]


def test_the_dtype_default_alone_passed_them() -> None:
    """The bug of the issue, on these inputs: fp32's atol is above every softmax value."""
    (x,) = softmax_inputs(0)
    ref = softmax(x)
    tol = default_tolerance(torch.float32)
    assert float(ref.max()) < tol.atol
    for wrong in (torch.zeros_like(ref), torch.full_like(ref, 1 / COLUMNS), 2 * ref):
        assert torch.allclose(wrong, ref, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize(("kernel", "diagnosis"), NO_INFORMATION)
def test_wide_softmax_without_information_fails(kernel: Any, diagnosis: str) -> None:
    r = check_correctness(kernel, softmax, softmax_inputs, device="cpu", trials=1)
    assert not r.passed
    assert r.rule == TRUTH_RULE
    assert diagnosis in r.failure
    assert "farther from the float64 truth than 8x the reference's own error" in r.failure


@pytest.mark.parametrize(("kernel", "diagnosis"), NO_INFORMATION)
def test_without_a_truth_they_fail_too(no_truth: None, kernel: Any, diagnosis: str) -> None:
    r = check_correctness(kernel, softmax, softmax_inputs, device="cpu", trials=1)
    assert not r.passed
    assert r.rule is not None
    assert r.rule.startswith("dtype default (no truth: too slow")
    assert diagnosis in r.failure


@pytest.mark.parametrize(("kernel", "diagnosis"), NO_INFORMATION)
def test_a_generous_marker_tolerance_does_not_let_them_pass(kernel: Any, diagnosis: str) -> None:
    r = check_correctness(
        kernel, softmax, softmax_inputs, device="cpu", trials=1, rtol=1e-2, atol=1e-2
    )
    assert not r.passed
    assert r.rule == "marker rtol=0.01, atol=0.01 (override)"
    assert r.failure.startswith(f"output: {diagnosis}") or diagnosis in r.failure


def test_the_softmax_in_another_order_passes_and_the_record_says_why() -> None:
    r = check_correctness(softmax_by_hand, softmax, softmax_inputs, device="cpu", trials=2)
    assert r.passed, r.failure
    assert r.rule == TRUTH_RULE
    assert r.factor == FACTOR
    assert r.truth is not None
    assert r.truth["precision"] == "float64"
    assert r.truth["skipped"] is None
    assert r.truth["seconds"] > 0
    assert r.kernel_error is not None
    assert r.reference_error is not None
    assert r.kernel_error < FACTOR * r.reference_error + 2 * 2**-24
    # The second trial compared with the reference by the tolerance the first one measured.
    assert "calibrated on the first trial" in r.tolerance.source


def test_kernelbench_files_also_get_kernelbench_verdict() -> None:
    """The zeros kernel passes KernelBench's own allclose (atol 1e-2) and fails ours: the
    record holds both, for comparison with published numbers."""
    r = check_correctness(
        torch.zeros_like, softmax, softmax_inputs, device="cpu", trials=1, kernelbench=True
    )
    assert not r.passed
    assert r.kernelbench is not None
    assert r.kernelbench["passed"] is True
    assert (r.kernelbench["rtol"], r.kernelbench["atol"]) == (1e-2, 1e-2)
    wrong = check_correctness(
        lambda x: softmax(x) + 0.1,
        softmax,
        softmax_inputs,
        device="cpu",
        trials=1,
        kernelbench=True,
    )
    assert wrong.kernelbench is not None
    assert wrong.kernelbench["passed"] is False
    assert "outside rtol=0.01, atol=0.01" in wrong.kernelbench["failure"]
    good = check_correctness(
        softmax_by_hand, softmax, softmax_inputs, device="cpu", trials=2, kernelbench=True
    )
    assert good.kernelbench is not None
    assert good.kernelbench["passed"] is True
    assert good.kernelbench["max_abs_err"] == good.max_abs_err
    plain = check_correctness(softmax, softmax, softmax_inputs, device="cpu", trials=1)
    assert plain.kernelbench is None


def test_correct_only_once_fails_the_calibrated_later_trials() -> None:
    calls = []

    def correct_once(x: Any) -> Any:
        calls.append(1)
        return softmax(x) if len(calls) == 1 else torch.zeros_like(x)

    r = check_correctness(correct_once, softmax, softmax_inputs, device="cpu", trials=2)
    assert not r.passed
    assert r.trials_run == 2
    assert "calibrated on the first trial" in r.failure
    assert "all zeros" in r.failure


def test_the_recheck_after_timing_keeps_the_calibrated_rule() -> None:
    state = {"timed": False}

    def lazy_after_timing(x: Any) -> Any:
        return torch.zeros_like(x) if state["timed"] else softmax(x)

    r = check_correctness(lazy_after_timing, softmax, softmax_inputs, device="cpu", trials=1)
    assert r.passed, r.failure
    state["timed"] = True
    timed = softmax_inputs(7)
    failure = recheck_after_timing(
        lazy_after_timing, softmax, timed, lambda: softmax_inputs(8), device="cpu", correctness=r
    )
    assert failure is not None
    assert "all zeros" in failure


# ----- 14_Gemm_Divide_Sum_Scaling at K = N = 8192 -----

GEMM_K = GEMM_N = 8192
GEMM_ROWS = 256
SCALE = 1.5


class GemmDivideSumScaling(torch.nn.Module):
    """KernelBench level 2 `14_Gemm_Divide_Sum_Scaling.Model`, forward as published."""

    def __init__(self, input_size: int, hidden_size: int, scaling_factor: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden_size, input_size))
        self.scaling_factor = scaling_factor

    def forward(self, x: Any) -> Any:
        x = torch.matmul(x, self.weight.T)
        x = x / 2
        x = torch.sum(x, dim=1, keepdim=True)
        return x * self.scaling_factor


@pytest.fixture(scope="module")
def gemm14() -> tuple[Any, Any, Any, Any]:
    """The model, one input, the reference's output and its float64 truth (computed once:
    the GEMM is 34 GFLOP)."""
    torch.manual_seed(0)
    model = GemmDivideSumScaling(GEMM_K, GEMM_N, SCALE)
    x = torch.rand(GEMM_ROWS, GEMM_K, generator=torch.Generator().manual_seed(1))
    # The reference on one thread: how many partial sums the GEMM splits K into follows the
    # thread count, and with two threads an Intel Xeon's fp32 result came out within fp32's
    # default tolerance everywhere, so the rounding error the tests below are about vanished.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            expected = model(x)
    finally:
        torch.set_num_threads(threads)
    found = run_truth(torch, model, (x,), expected, device="cpu")
    assert found.available, found.skipped
    return model, x, expected, found


def matvec(model: Any, x: Any, *, halve: bool = True) -> Any:
    """sum_j (x W^T)_ij = x . colsum(W): one GEMV instead of a GEMM."""
    with torch.no_grad():
        y = x @ model.weight.sum(dim=0).unsqueeze(1)
        return (y / 2 if halve else y) * model.scaling_factor


def judged(found: Any, got: Any, expected: Any) -> tuple[bool, str | None, CorrectnessRule]:
    rule = CorrectnessRule()
    rule.set_truth(found)
    reports = rule.judge(torch, got, expected)
    failed = [r for r in reports if not r.ok]
    return not failed, failed[0].message if failed else None, rule


def test_the_exact_matvec_rewrite_passes(gemm14: tuple[Any, Any, Any, Any]) -> None:
    model, x, expected, found = gemm14
    ok, why, rule = judged(found, matvec(model, x), expected)
    assert ok, why
    assert rule.name == TRUTH_RULE
    assert rule.reference_error is not None
    assert rule.reference_error > 0  # the fp32 reference is itself inexact here


def test_the_rewrite_without_the_halving_fails(gemm14: tuple[Any, Any, Any, Any]) -> None:
    model, x, expected, found = gemm14
    ok, why, _ = judged(found, matvec(model, x, halve=False), expected)
    assert not ok
    assert "returned 2 times the reference" in why


def test_the_dtype_default_rejected_even_the_exact_answer(
    gemm14: tuple[Any, Any, Any, Any],
) -> None:
    """The issue's second bug: the fp32 reference is itself off by more than fp32's default
    tolerance somewhere (on these inputs), so the float64 answer rounded to fp32 failed it;
    it passes the new rule."""
    model, x, expected, found = gemm14
    with torch.no_grad():
        w64 = model.weight.detach().double()
        exact = ((x.double() @ w64.T / 2).sum(dim=1, keepdim=True) * SCALE).float()
    tol = default_tolerance(torch.float32)
    outside = (exact - expected).abs() > tol.atol + tol.rtol * expected.abs()
    assert int(outside.sum()) >= 1
    ok, why, _ = judged(found, exact, expected)
    assert ok, why


# ----- half precision: the truth is the float32 re-run -----


def bf16_inputs(seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(64, 2048, generator=g).bfloat16(),
        torch.randn(2048, 64, generator=g).bfloat16(),
    )


def bf16_accumulating(chunk: int) -> Any:
    """A bf16 matmul that keeps its running sum in bf16, rounded every `chunk` products."""

    def kernel(a: Any, b: Any) -> Any:
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
        for i in range(0, a.shape[1], chunk):
            acc = (acc.float() + a[:, i : i + chunk].float() @ b[i : i + chunk].float()).bfloat16()
        return acc

    return kernel


@pytest.mark.parametrize(
    ("kernel", "passes"),
    [
        pytest.param(lambda a, b: (a.float() @ b.float()).bfloat16(), True, id="fp32-accumulate"),
        pytest.param(bf16_accumulating(512), True, id="bf16-sum-every-512"),
        pytest.param(bf16_accumulating(8), False, id="bf16-sum-every-8"),
    ],
)
def test_bf16_matmul_against_its_float32_truth(kernel: Any, passes: bool) -> None:
    r = check_correctness(kernel, torch.matmul, bf16_inputs, device="cpu", trials=2)
    assert r.passed is passes, r.failure
    assert r.rule == "within 8x the reference's own error against its float32 re-run"


def fp16_inputs(seed: int) -> tuple[Any, ...]:
    return (torch.randn(16, 4096, generator=torch.Generator().manual_seed(seed)).half(),)


def test_fp16_softmax_half_a_percent_off_fails_against_the_truth() -> None:
    """0.5% is inside fp16's default rtol (1e-2) but about 10 fp16 roundings: a softmax
    computed in fp32 and rounded once is off by far less."""

    def high(x: Any) -> Any:
        return (torch.softmax(x.float(), dim=1) * 1.005).half()

    def fp32_then_round(x: Any) -> Any:
        return softmax_by_hand(x.float()).half()

    ok = check_correctness(fp32_then_round, softmax, fp16_inputs, device="cpu", trials=2)
    assert ok.passed, ok.failure
    assert ok.truth is not None
    assert ok.truth["precision"] == "float32"
    off = check_correctness(high, softmax, fp16_inputs, device="cpu", trials=2)
    assert not off.passed
    assert "1.00501 times the reference" in off.failure
    old = check_correctness(high, softmax, fp16_inputs, device="cpu", trials=2, truth=False)
    assert old.passed, "the dtype default let it pass"


# ----- TF32 references -----


def as_tf32(x: Any) -> Any:
    """What TF32 tensor cores do to an fp32 operand, simulated: the mantissa truncated to 10
    bits. Like the hardware, only fp32 is affected (a float64 re-run is exact)."""
    if x.dtype != torch.float32:
        return x
    return (x.contiguous().view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32)


def truncated(x: Any, bits: int) -> Any:
    return (x.contiguous().view(torch.int32) & ~((1 << (23 - bits)) - 1)).view(torch.float32)


def tf32_matmul(a: Any, b: Any) -> Any:
    return as_tf32(a) @ as_tf32(b)


def tf32_inputs(seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(128, 1024, generator=g), torch.randn(1024, 128, generator=g))


@pytest.mark.parametrize(
    ("kernel", "passes"),
    [
        pytest.param(lambda a, b: a @ b, True, id="full-fp32"),
        pytest.param(
            lambda a, b: sum(
                as_tf32(a[:, i : i + 128]) @ as_tf32(b[i : i + 128]) for i in range(0, 1024, 128)
            ),
            True,
            id="tf32-split-k",
        ),
        pytest.param(lambda a, b: truncated(a, 6) @ truncated(b, 6), False, id="6-bit-operands"),
    ],
)
def test_tf32_reference(kernel: Any, passes: bool) -> None:
    """A TF32 reference is off by about 1e-3 against its float64 truth: an fp32 kernel (more
    exact) and a TF32 kernel in another order pass, one 16x coarser does not."""
    r = check_correctness(kernel, tf32_matmul, tf32_inputs, device="cpu", trials=2)
    assert r.passed is passes, r.failure
    assert r.rule == TRUTH_RULE
    assert r.reference_error is not None
    assert 1e-4 < r.reference_error < 1e-2


# ----- where no truth can run: the reason is the rule's name -----


def _seeded_dropout(x: Any) -> Any:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def _insists_on_fp32(x: Any) -> Any:
    if x.dtype != torch.float32:
        raise TypeError(f"expected float32, got {x.dtype}")
    return x * 2


@pytest.mark.parametrize(
    ("reference", "inputs", "reason"),
    [
        (lambda x: x.double() * 2, (torch.randn(8),), "already computes in float64"),
        (lambda x: (x * 2).int(), (torch.randn(8),), "no floating-point output"),
        (_seeded_dropout, (torch.randn(4096),), "not a plain function of its inputs"),
        (_insists_on_fp32, (torch.randn(8),), "raised in float64: TypeError: expected float32"),
        (lambda x: (x * 2).float(), (torch.randn(8),), "the reference casts to its own dtype"),
    ],
)
def test_the_truth_says_why_it_cannot_run(reference: Any, inputs: Any, reason: str) -> None:
    expected = reference(*inputs)
    found = run_truth(torch, reference, inputs, expected, device="cpu")
    assert not found.available
    assert reason in found.skipped
    rule = CorrectnessRule()
    rule.set_truth(found)
    assert rule.name == f"dtype default (no truth: {found.skipped})"


def test_the_time_budget_skips_with_the_estimate() -> None:
    x = torch.randn(8)
    found = run_truth(
        torch, softmax, (x.view(2, 4),), softmax(x.view(2, 4)), device="cpu", reference_s=60.0
    )
    assert not found.available
    assert "too slow: the reference's call took 60 s" in found.skipped


def test_a_module_reference_is_widened_on_a_copy() -> None:
    lin = torch.nn.Linear(16, 4)
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected = lin(x)
    found = run_truth(torch, lin, (x,), expected, device="cpu")
    assert found.available
    assert lin.weight.dtype == torch.float32  # the reference itself is untouched
    assert x.dtype == torch.float32


def test_normwise_bound_fails_an_error_every_element_allows() -> None:
    """Every element 7x the reference's own error (inside 8x), all of one sign: the norm of
    that error is about 10x the reference's, beyond the normwise bound."""

    def row_sum(x: Any) -> Any:
        return x.sum(dim=1)

    x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(3))
    expected = row_sum(x)
    found = run_truth(torch, row_sum, (x,), expected, device="cpu")
    leaf = found.leaves["output"]
    d = leaf.difference.double()
    truth_values = expected.double() - d
    floor = leaf.reference_error_max + leaf.unit_roundoff * leaf.rms_truth
    got = (truth_values + 7 * (d.abs() + floor)).float()
    ok, why, _ = judged(found, got, expected)
    assert not ok
    assert why.startswith("output: normwise relative error against the float64 truth")
    assert "though every element is inside its bound" in why


# ----- a reference whose fp32 matmuls may run in TF32 -----


@pytest.fixture
def simulated_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU counts as a tensor-core device whose fp32 matmuls run in TF32 (as in
    tests/optimize/search/test_gate_sandbox_agreement.py)."""
    monkeypatch.setattr(fp32_precision, "TENSOR_CORE_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(
        fp32_tensor_cores,
        "fp32_reduced_mode",
        lambda torch, op: "tf32" if op == "matmul" else None,
    )


def test_tf32_allowed_accepts_the_tf32_tolerance_too(simulated_tf32: None) -> None:
    """On the H200 the same fp32 convolution gave TF32-size differences from one call to the
    next (the check's deterministic mode picks another cuDNN algorithm): where the flags let
    the reference's matmuls run in TF32, the TF32 tolerance accepts next to the truth's rule,
    and the record says so."""

    def positive(seed: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(128, 256, generator=g), torch.rand(256, 128, generator=g))

    # The reference runs in full fp32 here; the kernel as TF32 tensor cores would.
    coarse = check_correctness(tf32_matmul, torch.matmul, positive, device="cpu", trials=2)
    assert coarse.passed, coarse.failure
    assert coarse.tf32
    assert coarse.rule == (
        f"{TRUTH_RULE}, or the tf32 tolerance (its fp32 matmuls/convolutions may run in tf32)"
    )
    assert any("accepted, as the reference's fp32 matmuls" in n for n in coarse.notes)
    assert coarse.kernel_error > FACTOR * coarse.reference_error  # the truth's rule alone: no


def test_tf32_allowed_still_fails_outputs_without_information(simulated_tf32: None) -> None:
    """A softmax of a matmul over wide rows is about 1/n everywhere, below TF32's atol 1e-2:
    zeros pass that tolerance and fail the information check."""

    def inputs(seed: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(4, 64, generator=g), torch.rand(64, 4096, generator=g))

    def reference(a: Any, b: Any) -> Any:
        return torch.softmax(a @ b, dim=1)

    r = check_correctness(lambda a, b: torch.zeros(4, 4096), reference, inputs, device="cpu")
    assert not r.passed
    assert "the kernel returned all zeros" in r.failure


def _judge_text(rule: CorrectnessRule, got: Any, expected: Any) -> str | None:
    failed = [r for r in rule.judge(torch, got, expected) if not r.ok]
    return " ".join(r.message or "" for r in failed[:2]) if failed else None


def _rules() -> dict[str, CorrectnessRule]:
    from pytest_kernelpro.measure.output_rule import Calibration, InformationLimits, Tolerance

    marker = CorrectnessRule(rtol=1e-3, atol=1e-5)
    reduced = CorrectnessRule()
    reduced.reduced = "tf32"
    calibrated = CorrectnessRule()  # a truth's calibration, with a normwise bound
    calibrated.calibrated["output"] = Calibration(
        Tolerance(2.4e-7, 3e-4, "calibrated (test)", norm_rtol=2e-5),
        InformationLimits(1e-6, 1e-6, 0.0),
    )
    # An infinite limit: only a difference that is no number fails (the one-pass check's
    # shortcut must see an infinite difference, not only the limit).
    unbounded = CorrectnessRule(rtol=0.0, atol=math.inf)
    return {
        "dtype": CorrectnessRule(),
        "marker": marker,
        "tf32": reduced,
        "truth": calibrated,
        "unbounded": unbounded,
    }


def _outputs(dtype: Any) -> dict[str, tuple[Any, Any]]:
    """(got, expected) pairs at and across every edge of the element rule and the
    information rule: what a one-pass shortcut could get wrong."""
    gen = torch.Generator().manual_seed(7)
    exp = torch.randn(64, 33, generator=gen).to(dtype)
    tol = default_tolerance(dtype)
    limit = tol.atol + tol.rtol * exp.abs()
    cases: dict[str, tuple[Any, Any]] = {"same": (exp.clone(), exp)}
    cases["inside"] = ((exp.float() + 0.5 * limit.float()).to(dtype), exp)
    cases["at_the_limit"] = ((exp.float() + limit.float()).to(dtype), exp)
    cases["one_over"] = (exp.clone(), exp)
    cases["one_over"][0].view(-1)[5] += 4 * limit.view(-1)[5] + 1e-2
    for name, (g, e) in {
        "nan_kernel": (float("nan"), 0.5),
        "nan_reference": (0.5, float("nan")),
        "nan_both": (float("nan"), float("nan")),
        "inf_both": (float("inf"), float("inf")),
        "inf_kernel": (float("inf"), 0.5),
        "inf_signs": (float("-inf"), float("inf")),
        "inf_reference": (3.0, float("inf")),
    }.items():
        got, expected = exp.clone(), exp.clone()
        got.view(-1)[3], expected.view(-1)[3] = g, e
        cases[name] = (got, expected)
    cases["zeros"] = (torch.zeros_like(exp), exp)
    cases["constant"] = (torch.full_like(exp, 0.25), exp)
    cases["scaled"] = ((exp.float() * 1.01).to(dtype), exp)
    cases["shape"] = (exp[:-1].clone(), exp)
    cases["dtype"] = (exp.to(torch.float64 if dtype != torch.float64 else torch.float32), exp)
    cases["empty"] = (exp[:0].clone(), exp[:0])
    cases["tuple"] = ((exp.clone(), exp.clone()), (exp, exp))
    cases["spread"] = ((exp.float() + 0.9 * limit.float() * torch.sign(torch.randn(exp.shape, generator=gen))).to(dtype), exp)  # fmt: skip
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rule_name", ["dtype", "marker", "tf32", "truth", "unbounded"])
def test_the_timed_check_decides_as_the_full_rule(dtype: Any, rule_name: str) -> None:
    """`CorrectnessRule.timed_check` (one pass for a passing plain tensor) says what `judge`
    says, on every edge a shortcut could get wrong: NaN and infinities on one side or both,
    elements at and over the limit, zeros, a constant, a scaled copy, another shape or dtype,
    an empty output, a structure."""
    rule = _rules()[rule_name]
    check = rule.timed_check(torch)
    for case, (got, expected) in _outputs(dtype).items():
        assert check(got, expected) == _judge_text(rule, got, expected), (case, dtype, rule_name)


@pytest.mark.parametrize("rule_name", ["dtype", "truth", "unbounded"])
def test_the_timed_check_passes_finite_chunks_without_elementwise_masks(
    rule_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A passing output whose every element is a number takes no elementwise NaN or
    infinity mask (`torch.isfinite` only of the largest difference, 0-dim, per chunk); one NaN or infinity on either side brings the chunk's masks back, and the
    verdict is the rule's either way."""
    from pytest_kernelpro.measure import output_rule as rule_mod

    monkeypatch.setattr(rule_mod, "CPU_COMPARE_CHUNK", 256)
    sizes: list[int] = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: sizes.append(t.numel()) or real(t))
    rule = _rules()[rule_name]
    check = rule.timed_check(torch)  # binds torch.isfinite now: the counting one
    gen = torch.Generator().manual_seed(3)
    exp = torch.rand(4, 256, generator=gen) + 0.5
    got = (exp.double() + 1e-7 * torch.randn(4, 256, generator=gen, dtype=torch.float64)).float()
    assert check(got, exp) is None
    # One 0-dim test per chunk; where the rule runs its information pass (no truth's
    # calibration), that pass's own masks follow.
    assert sizes[:4] == [1, 1, 1, 1]
    assert 1 not in sizes[4:]
    assert len(sizes) == 4 or rule_name != "truth"
    for value in (float("nan"), float("inf")):
        sizes.clear()
        bad = got.clone()
        bad[2, 7] = value
        assert check(bad, exp) == _judge_text(rule, bad, exp)
        assert 256 in sizes  # the chunk with it took the masks
    assert check(bad, bad) is None  # an infinity where the reference has it passes


def test_the_timed_check_judges_a_passing_plain_tensor_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A passing plain tensor never reaches `judge` (the per-call cost of a timed check);
    a failing one does, for its message."""
    rule = CorrectnessRule()
    check = rule.timed_check(torch)
    exp = torch.randn(32, 32)
    judged_calls: list[int] = []
    full = rule.judge
    monkeypatch.setattr(rule, "judge", lambda *a: judged_calls.append(1) or full(*a))
    assert check(exp.clone(), exp) is None
    assert judged_calls == []
    assert check(exp + 1.0, exp) is not None
    assert judged_calls == [1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("chunk", [7, 1 << 22])
def test_the_passing_chunk_row_is_the_full_rows_where_it_is_used(
    dtype: Any, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_allclose_pass` takes every chunk unscreened first and keeps its row
    only where the largest ratio is a number at most 1; the table and the worst elements it
    returns equal the full pass's, row for row, on every edge `_outputs` has (NaN and
    infinities on either side, at and over the limit, zeros, a scaled copy) and on tolerances
    that give a zero limit (atol 0) and an infinite one."""
    from pytest_kernelpro.measure import output_rule as rule_mod
    from pytest_kernelpro.measure.output_rule import Tolerance

    monkeypatch.setattr(rule_mod, "COMPARE_CHUNK", chunk)
    tolerances = [
        default_tolerance(dtype),
        Tolerance(1e-3, 0.0, "atol 0 (test)"),
        Tolerance(0.0, math.inf, "values not judged (test)"),
    ]
    compared = 0
    for case, (got, expected) in _outputs(dtype).items():
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            continue
        if got.dtype != expected.dtype or not expected.numel():
            continue
        for tol in tolerances:
            work = rule_mod._work_dtype(torch, expected.dtype)
            g, e = got.reshape(-1), expected.reshape(-1)
            table, worst = rule_mod._allclose_pass(torch, g, e, tol, work)
            steps = rule_mod.chunk_ranges(e.numel())
            full = [rule_mod._allclose_chunk(torch, g[lo : lo + steps.step], e[lo : lo + steps.step], tol, work, screen=True) for lo in steps]  # fmt: skip
            assert torch.equal(table, torch.stack([row for row, _ in full])), (case, tol)
            assert worst.tolist() == [
                int(b) + lo for (_, b), lo in zip(full, steps, strict=True)
            ], case
            compared += 1
    assert compared >= 3 * 14


def test_a_failing_chunk_is_taken_again_and_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the chunks whose quick row does not pass are taken by the full pass; the message
    still names the NaN where the reference is a number and counts each miss."""
    from pytest_kernelpro.measure import output_rule as rule_mod

    monkeypatch.setattr(rule_mod, "COMPARE_CHUNK", 100)
    exp = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    got = exp.clone()
    got[250] = float("nan")
    got[720] += 1.0
    full_calls: list[int] = []
    chunk_row = rule_mod._allclose_chunk

    def counted(torch: Any, g: Any, *a: Any, screen: bool) -> Any:
        if screen:
            full_calls.append(g.numel())
        return chunk_row(torch, g, *a, screen=screen)

    monkeypatch.setattr(rule_mod, "_allclose_chunk", counted)
    report = rule_mod.compare_tensor(torch, "output", got, exp, default_tolerance(torch.float32))
    assert not report.ok
    assert len(full_calls) == 2  # chunks 2 and 7 of 10
    assert "2 of 1000 elements" in (report.message or "")
    assert "first at index (250,)" in (report.message or "")


@pytest.mark.parametrize("chunk", [5, 1 << 22])
def test_the_truth_pass_rows_equal_the_screened_rows(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_truth_pass` takes every chunk without the NaN and infinity screen first and keeps
    that row only where max |k - r| is a number; its table equals the screened pass's, row
    for row, with NaN, infinities and an overflowing difference in some chunks."""
    from pytest_kernelpro.measure import output_rule as rule_mod

    monkeypatch.setattr(rule_mod, "COMPARE_CHUNK", chunk)
    gen = torch.Generator().manual_seed(11)
    r = torch.randn(40, generator=gen)
    d = 1e-6 * torch.randn(40, generator=gen)
    cases = {"finite": (r + 1e-5 * torch.randn(40, generator=gen), r)}
    for name, (at, g_value, r_value) in {
        "nan_kernel": (3, float("nan"), None),
        "nan_both": (12, float("nan"), float("nan")),
        "inf_same": (21, float("inf"), float("inf")),
        "inf_kernel": (33, float("-inf"), None),
        "overflow": (7, 3e38, -3e38),
    }.items():
        g, ref = r.clone(), r.clone()
        g[at] = g_value
        if r_value is not None:
            ref[at] = r_value
        cases[name] = (g, ref)
    for name, (g, ref) in cases.items():
        table, best = rule_mod._truth_pass(torch, (g, ref, d), 1e-7, 8.0, 1e-6)
        steps = rule_mod.chunk_ranges(40)
        screened = [
            rule_mod._truth_chunk(
                torch,
                (g[lo : lo + steps.step], ref[lo : lo + steps.step], d[lo : lo + steps.step]),
                (1e-7, 8.0, 1e-6),
                torch.float32,
                screen=True,
            )
            for lo in steps
        ]
        expected = torch.stack([row for row, _ in screened])
        assert torch.equal(table.nan_to_num(nan=-1.0), expected.nan_to_num(nan=-1.0)), name
        assert best.tolist() == [int(b) + lo for (_, b), lo in zip(screened, steps, strict=True)]


@pytest.mark.parametrize("chunk", [5, 1 << 22])
def test_the_reference_error_equals_the_screened_one(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`measure_reference_error` takes chunks as finite first and screens again only where
    max |r - t| is not a number: its norms, maxima and kept difference equal the screened
    pass's, with the reference NaN or infinite in some chunks (left out, as before) and the
    re-run infinite where the reference is a number (no truth)."""
    from pytest_kernelpro.measure import output_rule as rule_mod

    monkeypatch.setattr(rule_mod, "COMPARE_CHUNK", chunk)
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(40, dtype=torch.float64, generator=gen)
    ref = wide.float()
    cases = {"finite": (ref, wide)}
    nan_ref = ref.clone()
    nan_ref[4], nan_ref[17] = float("nan"), float("inf")
    wide_nan = wide.clone()
    wide_nan[4], wide_nan[17] = float("nan"), float("inf")
    cases["reference not finite, re-run the same"] = (nan_ref, wide_nan)
    for name, (r, t) in cases.items():
        leaf = rule_mod.measure_reference_error(torch, "output", r, t)
        assert not isinstance(leaf, str), (name, leaf)
        steps = rule_mod.chunk_ranges(40)
        kept = torch.empty(40)
        rows = torch.stack(
            [
                rule_mod._reference_error_chunk(
                    torch,
                    (kept[lo : lo + steps.step], r[lo : lo + steps.step], t[lo : lo + steps.step]),
                    screen=True,
                )
                for lo in steps
            ]
        )
        assert torch.equal(leaf.difference, kept), name
        assert leaf.reference_error_norm == math.sqrt(float(rows[:, 0].sum())), name
        assert leaf.truth_norm == math.sqrt(float(rows[:, 1].sum())), name
        assert leaf.reference_error_max == float(rows[:, 2].max()), name
    lost = wide.clone()
    lost[30] = float("inf")
    assert "NaN or infinity" in str(rule_mod.measure_reference_error(torch, "output", ref, lost))
