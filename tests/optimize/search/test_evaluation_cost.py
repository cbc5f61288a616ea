"""What an evaluation skips on a large problem changes no verdict: a bit-identical output passes
without the rule's passes only where the rule would pass it, the timed outputs' one-pass check
runs chunk by chunk and decides as the rule does, the CPU comparison's chunks stay short, and
a second input shape the reference refuses is skipped without a second reference call."""

from __future__ import annotations

import pytest
from harness_runs import run_in_process

from pytest_kernelpro.measure import output_rule
from pytest_kernelpro.optimize.sandbox import harness, measurement

torch = pytest.importorskip("torch")


def _softmax(x: object) -> object:
    return torch.softmax(x, dim=-1)  # type: ignore[arg-type]


def _calibrated(x: object) -> tuple[output_rule.CorrectnessRule, object]:
    """A rule after its truth decided the first call (the state of every later call)."""
    rule = measurement.new_rule({})
    expected = _softmax(x)
    measurement.find_truth(torch, rule, _softmax, [x], expected, "cpu")
    assert measurement.verdict(torch, expected.clone(), expected, rule).ok  # type: ignore[attr-defined]
    assert rule.calibrated
    return rule, expected


def test_a_bit_identical_output_passes_without_the_rule_only_after_the_truths_call() -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    pending = measurement.new_rule({})
    expected = _softmax(x)
    measurement.find_truth(torch, pending, _softmax, [x], expected, "cpu")
    # The truth's call calibrates the later ones: never skipped.
    assert measurement.identical_reports(torch, expected.clone(), expected, pending) is None
    rule, expected = _calibrated(x)
    reports = measurement.identical_reports(torch, expected.clone(), expected, rule)
    assert reports is not None
    assert all(r.ok for r in reports)
    assert reports[0].tolerance == rule.for_leaf("output", expected.dtype)  # type: ignore[attr-defined]
    decided = measurement.verdict(torch, expected.clone(), expected, rule)
    assert decided.ok
    assert decided.max_abs == 0.0


@pytest.mark.parametrize(
    "got_of",
    [
        pytest.param(lambda e: e + 1e-3, id="one rounding off: the rule decides"),
        pytest.param(lambda e: e.double(), id="another dtype"),
        pytest.param(lambda e: e.reshape(-1), id="another shape"),
        pytest.param(lambda e: (e,), id="another structure"),
        pytest.param(lambda e: (e + 0.5).as_subclass(_Lies), id="a subclass that lies"),
    ],
)
def test_anything_but_a_plain_identical_tensor_goes_through_the_rule(got_of: object) -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    rule, expected = _calibrated(x)
    got = got_of(expected)  # type: ignore[operator]
    assert measurement.identical_reports(torch, got, expected, rule) is None
    assert not measurement.verdict(torch, got, expected, rule).ok


class _Lies(torch.Tensor):
    """A tensor subclass whose `torch.equal` says what it likes."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.equal:
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def test_nan_where_the_reference_has_nan_is_the_rules_to_explain() -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    rule, expected = _calibrated(x)
    with_nan = expected.clone()  # type: ignore[attr-defined]
    with_nan[0, 0] = float("nan")
    assert measurement.identical_reports(torch, with_nan.clone(), with_nan, rule) is None
    decided = measurement.verdict(torch, with_nan.clone(), with_nan, rule)
    assert decided.ok  # NaN at the reference's own NaN: accepted, with its note
    assert any(n for r in decided.reports for n in r.notes)


def test_the_cpu_comparisons_chunks_are_short_and_the_gpus_unchanged() -> None:
    total = 1 << 27  # a 4096x32768 output
    gpu = output_rule.chunk_ranges(total)
    cpu = output_rule.chunk_ranges(total, torch.device("cpu"))
    assert gpu.step == max(output_rule.COMPARE_CHUNK, total // output_rule.COMPARE_MAX_CHUNKS)
    assert cpu.step == output_rule.CPU_COMPARE_CHUNK < gpu.step
    assert output_rule.chunk_ranges(total, "cpu") == cpu
    assert len(output_rule.chunk_ranges(1000, "cpu")) == 1  # a small output: one chunk


@pytest.mark.parametrize("where", [0, 4095, 2 * 4096 + 17, 8 * 4096 - 1])
def test_the_timed_check_in_chunks_decides_as_the_rule(
    where: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output of many chunks (the chunks shrunk): one element off in any chunk fails the
    one-pass check and the rule alike, and the clean output passes both."""
    monkeypatch.setattr(output_rule, "CPU_COMPARE_CHUNK", 4096)
    x = torch.randn(8, 4096, generator=torch.Generator().manual_seed(4))
    rule, expected = _calibrated(x)
    check = rule.timed_check(torch)
    assert check(expected.clone(), expected) is None  # type: ignore[attr-defined]
    wrong = expected.clone()  # type: ignore[attr-defined]
    wrong.view(-1)[where] += 0.5
    found = check(wrong, expected)
    assert found is not None
    assert "elements" in found
    assert not measurement.verdict(torch, wrong, expected, rule).ok
    # Under the normwise bound only: every element inside, the sum of them outside.
    spread = expected * (1 + 40 * torch.finfo(torch.float32).eps)  # type: ignore[operator]
    assert (check(spread, expected) is None) == measurement.verdict(
        torch, spread, expected, rule
    ).ok


SHAPE_REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        assert x.shape[0] == 16, "only a batch of 16"
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
"""

SHAPE_CANDIDATE = """import torch
from torch import nn

BATCHES = []


class ModelNew(nn.Module):
    def forward(self, x):
        BATCHES.append(x.shape[0])
        return torch.softmax(x, dim=-1)
"""


def test_a_shape_the_reference_refuses_is_skipped_before_the_candidate_runs() -> None:

    result, batches = run_in_process(
        SHAPE_REFERENCE, SHAPE_CANDIDATE, read=lambda module: module.BATCHES
    )
    assert result["status"] == "correct", result.get("reason")
    skipped = result["correctness"]["shape_skipped"]
    assert skipped == ["batch 8 instead of 16: reference raises AssertionError"]
    assert result["correctness"]["shape_check"] == "none applicable"
    assert 8 not in batches
    assert 16 in batches


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_finite_chunks_on_the_cpu_give_the_general_passs_table(
    dtype: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_allclose_pass` (a quick row per chunk, the full one where a chunk misses) against
    the full row of every chunk: the same table to the bit and the same worst positions,
    over chunks of finite numbers, some over the tolerance, and chunks with NaN, infinities
    and zeros, in the CPU's chunk size."""
    monkeypatch.setattr(output_rule, "CPU_COMPARE_CHUNK", 1000)
    gen = torch.Generator().manual_seed(5)
    e = torch.randn(8000, generator=gen).to(dtype)  # type: ignore[arg-type]
    g = e + (1e-3 * torch.randn(8000, generator=gen)).to(dtype)  # type: ignore[arg-type]
    e[10] = 0.0  # a zero reference: rel masked
    g[20] = e[20]  # an exact element: ratio masked
    g[2500], e[2600] = float("nan"), float("inf")  # chunk 2 goes the general way
    e[5000] = g[5000] = float("nan")  # chunk 5: both NaN
    tol = output_rule.Tolerance(1e-4, 1e-4, "test", norm_rtol=1e-3)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    fast = output_rule._allclose_pass(torch, g, e, tol, work)
    steps = output_rule.chunk_ranges(8000, e.device)
    assert steps.step == 1000
    full = [
        output_rule._allclose_chunk(
            torch, g[lo : lo + steps.step], e[lo : lo + steps.step], tol, work, screen=True
        )
        for lo in steps
    ]
    assert torch.equal(fast[0], torch.stack([row for row, _ in full]))
    assert fast[1].tolist() == [int(best) + lo for (_, best), lo in zip(full, steps, strict=True)]
    assert fast[0][:, 3].sum() > 0  # elements over the tolerance in the finite chunks too


def _thread_count_kept(threads: int) -> object:
    """Set the process's count for a test and give it back after (the suite shares it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return before


def test_the_rules_passes_run_on_one_thread_and_the_count_comes_back() -> None:
    """The truth and the verdict see one CPU thread (`measurement.one_thread`); the count the
    task set (the candidate's calls and the timing use it) is back after each, also after the
    rule raised."""
    seen: list[int] = []

    def recording_softmax(x: object) -> object:
        seen.append(torch.get_num_threads())
        return _softmax(x)

    before = _thread_count_kept(2)
    try:
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
        rule = measurement.new_rule({})
        expected = _softmax(x)
        measurement.find_truth(torch, rule, recording_softmax, [x], expected, "cpu")
        assert seen == [1]
        assert torch.get_num_threads() == 2
        judged = rule.judge

        def recording_judge(*args: object) -> object:
            seen.append(torch.get_num_threads())
            return judged(*args)

        rule.judge = recording_judge  # type: ignore[method-assign]
        assert measurement.verdict(torch, expected.clone(), expected, rule).ok  # type: ignore[attr-defined]
        assert seen == [1, 1]
        assert torch.get_num_threads() == 2

        def raising_judge(*args: object) -> object:
            raise RuntimeError("the rule failed")

        rule.judge = raising_judge  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="the rule failed"):
            measurement.verdict(torch, expected * 2, expected, rule)  # type: ignore[operator]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)  # type: ignore[arg-type]


@pytest.mark.parametrize("scale", [1.0, 1.0 + 1e-6, 1.0 + 1e-3])
def test_one_thread_decides_as_the_tasks_count(scale: float) -> None:
    """The same verdict and largest error on one thread as on two: an honest output, one a
    hair off and one plainly wrong (the rule's bounds do not depend on the count; the
    messages' figures from float64 sums may differ in their last digits, as the sums are
    taken in another order)."""
    x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(4))
    expected = _softmax(x)
    got = expected * scale  # type: ignore[operator]
    decided = []
    before = _thread_count_kept(2)
    try:
        for threads in (1, 2):
            rule = measurement.new_rule({})
            measurement.find_truth(torch, rule, _softmax, [x], expected, "cpu")
            torch.set_num_threads(threads)
            # The rule's own judge at this count, around the one-thread wrapper.
            reports = rule.judge(torch, got, expected)
            decided.append([(r.ok, r.max_abs, r.kind) for r in reports])
            torch.set_num_threads(2)
    finally:
        torch.set_num_threads(before)  # type: ignore[arg-type]
    assert decided[0] == decided[1]
    assert decided[0][0][0] is (scale == 1.0)


SOFTMAX_REFERENCE = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""

SOFTMAX_CANDIDATE = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.softmax(x, dim=-1)
"""

# A reference that writes into its input after reading it: the truth must still be made on
# the inputs as drawn, and the candidate (which does the same) gets them as drawn too.
WRITING_REFERENCE = SOFTMAX_REFERENCE.replace(
    "        return torch.softmax(x, dim=-1)",
    "        y = torch.softmax(x, dim=-1)\n        x.mul_(3.0)\n        return y",
)
WRITING_CANDIDATE = SOFTMAX_CANDIDATE.replace(
    "        return torch.nn.functional.softmax(x, dim=-1)",
    "        y = torch.nn.functional.softmax(x, dim=-1)\n        x.mul_(3.0)\n        return y",
)


def _run_recording_the_truth(
    reference: str, candidate: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """`harness.run_task` in this process, with what each truth saw: whether it was given
    its inputs, how many sealed input sets were open meanwhile, its inputs' values."""

    from pytest_kernelpro.optimize.sandbox import input_handles

    open_sets: list[object] = []
    sealed_init, sealed_close = (
        input_handles.SealedInputs.__init__,
        input_handles.SealedInputs.close,
    )

    def opening(self: object, *args: object, **kwargs: object) -> None:
        sealed_init(self, *args, **kwargs)  # type: ignore[arg-type]
        open_sets.append(self)

    def closing(self: object) -> None:
        if self in open_sets:
            open_sets.remove(self)
        sealed_close(self)  # type: ignore[arg-type]

    seen: list[dict[str, object]] = []
    find_truth = measurement.find_truth

    def recording(torch_: object, rule: object, reference_: object, inputs: list, *args: object, **kwargs: object) -> None:  # type: ignore[type-arg]  # fmt: skip
        seen.append(
            {
                "consumed": kwargs.get("consume_inputs", False),
                "sealed_open": len(open_sets),
                "inputs": [t.clone() for t in inputs],
            }
        )
        find_truth(torch_, rule, reference_, inputs, *args, **kwargs)  # type: ignore[arg-type]
        seen[-1]["left"] = len(inputs)

    monkeypatch.setattr(input_handles.SealedInputs, "__init__", opening)
    monkeypatch.setattr(input_handles.SealedInputs, "close", closing)
    monkeypatch.setattr(measurement, "find_truth", recording)
    result, _ = run_in_process(reference, candidate, seed=42)
    return result, seen


def test_the_workers_truth_takes_its_own_draw_while_no_sealed_set_is_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's first checked call makes the truth before the candidate's sealed inputs
    exist (one input set fewer at its peak): the truth is given the drawn inputs and drops
    them once widened; the truth's inputs are the first trial's draw."""
    from pytest_kernelpro.optimize.sandbox.measurement import make_inputs

    result, seen = _run_recording_the_truth(SOFTMAX_REFERENCE, SOFTMAX_CANDIDATE, monkeypatch)
    assert result["status"] == "correct", result.get("reason")
    assert len(seen) == 1
    assert seen[0]["consumed"] is True
    assert seen[0]["sealed_open"] == 0
    assert seen[0]["left"] == 0
    module = __import__("types").ModuleType("reference_for_the_draw")
    exec(SOFTMAX_REFERENCE, module.__dict__)
    drawn = make_inputs(module, 43, "cpu")  # trial 1's seed: the task's + 1
    assert torch.equal(seen[0]["inputs"][0], drawn[0])  # type: ignore[index]


def test_a_reference_writing_its_inputs_leaves_the_workers_truth_the_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack on giving the truth the first call's inputs: a reference that scales its
    input in place. Its first call runs on a copy, so the truth sees the draw (else its
    re-run on the scaled inputs would disagree with the reference and no truth would
    decide), and a candidate doing what the problem does passes."""
    result, seen = _run_recording_the_truth(WRITING_REFERENCE, WRITING_CANDIDATE, monkeypatch)
    assert result["status"] == "correct", result.get("reason")
    accuracy = result["correctness"]["accuracy"]  # type: ignore[index]
    assert accuracy["truth"]["skipped"] is None, accuracy  # type: ignore[index]
    assert accuracy["factor"] is not None, accuracy  # type: ignore[index]
    module = __import__("types").ModuleType("reference_for_the_draw")
    exec(WRITING_REFERENCE, module.__dict__)
    drawn = measurement.make_inputs(module, 43, "cpu")
    assert torch.equal(seen[0]["inputs"][0], drawn[0])  # type: ignore[index]


def test_the_worker_waits_for_the_judge_holding_no_sealed_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the judge checks an output, the worker's memory is the judge's to use: every
    sealed input set's mapping is gone by then (closing its descriptors alone would leave the
    pages mapped while a tensor views them)."""
    import gc
    import weakref

    from pytest_kernelpro.optimize.sandbox import input_handles

    views: list[weakref.ref[object]] = []
    sealed_init = input_handles.SealedInputs.__init__

    def opening(self: input_handles.SealedInputs, *args: object, **kwargs: object) -> None:
        sealed_init(self, *args, **kwargs)  # type: ignore[arg-type]
        views.extend(weakref.ref(v) for v in self.values if isinstance(v, torch.Tensor))

    alive_at_wait: list[int] = []

    def waiting(self: object, name: str, label: str, ahead: object = None) -> None:
        gc.collect()
        alive_at_wait.append(sum(ref() is not None for ref in views))

    monkeypatch.setattr(input_handles.SealedInputs, "__init__", opening)
    monkeypatch.setattr(harness._Pipeline, "save_output", lambda self, label, holder: label)
    monkeypatch.setattr(harness._Pipeline, "await_judge", waiting)
    result, _ = run_in_process(SOFTMAX_REFERENCE, SOFTMAX_CANDIDATE)
    assert result["status"] == "correct", result.get("reason")
    assert len(alive_at_wait) >= 5  # three trials, the in-place call, the call after timing
    assert views  # the inputs were sealed
    assert alive_at_wait == [0] * len(alive_at_wait)
