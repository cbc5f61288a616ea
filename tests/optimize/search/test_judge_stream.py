"""The judge checking outputs as they come (`judge.judge` over `handles.stream_outputs`):
each against the reference it computes itself, in the order of `required_outputs`, each once;
every output is taken even after one failed. Plain unit tests in this process (the real
path, a judge beside a sandboxed worker: test_handle_sandbox.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_kernelpro.optimize.sandbox import judge

torch = pytest.importorskip("torch")

REFERENCE = (
    "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.softmax(x, dim=-1)\n\n\n"
    "def get_inputs():\n    return [torch.randn(8, 32)]\n\n\ndef get_init_inputs():\n    return []\n"
)
TASK: dict[str, Any] = {
    "reference": REFERENCE,
    "device": "cpu",
    "seed": 42,
    "correct_trials": 3,
    "timing": {"warmup_ms": 1.0, "max_time_s": 0.02, "min_samples": 5, "max_samples": 10},
    "cpu_threads": 1,
}


def honest() -> list[tuple[str, list[Any]]]:
    """The reference's own outputs for every checked call, in order."""
    ref = judge._Reference(TASK)
    try:
        return [(name, ref.output(seed)) for name, seed in judge.required_outputs(TASK)]
    finally:
        sys.modules.pop("kernelpro_reference", None)


def run(
    outputs: list[tuple[str, list[Any]]],
    tell_truth: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """The judge's verdict and how many outputs it took from the stream (`tell_truth`: the
    judge's call once its truth is found, before the worker's first output is taken)."""
    taken = 0

    def stream() -> Iterator[tuple[str, list[Any]]]:
        nonlocal taken
        for item in outputs:
            taken += 1
            yield item

    try:
        return judge.judge(TASK, stream(), tell_truth), taken
    finally:
        sys.modules.pop("kernelpro_reference", None)


def test_honest_outputs_as_they_come_pass_and_each_is_checked() -> None:
    outputs = honest()
    verdict, taken = run(outputs)
    assert verdict["ok"], verdict
    assert verdict["checked"] == [name for name, _ in outputs]
    assert taken == len(outputs) == 5


@pytest.mark.parametrize("timed_before", [False, True])
def test_a_judge_times_the_reference_unless_an_earlier_judge_of_the_search_did(
    timed_before: bool,
) -> None:
    task = dict(TASK, reference_timed=timed_before)
    try:
        verdict = judge.judge(task, iter(honest()))
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert verdict["ok"], verdict
    if timed_before:
        assert "reference_timing" not in verdict
    else:
        assert verdict["reference_timing"]["median_s"] > 0


def test_a_bad_later_output_fails_and_the_rest_are_still_taken() -> None:
    outputs = honest()
    name, leaves = outputs[2]
    outputs[2] = (name, [leaves[0] + 0.5])
    verdict, taken = run(outputs)
    assert not verdict["ok"]
    assert verdict["reason"].startswith("trial-3: ")
    assert taken == 5  # the worker waiting for the judge's word is never left waiting


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda o: [o[0], o[2], o[1], *o[3:]], "trial-3: handed over where trial-2 was due"),
        (lambda o: [o[0], o[0], *o[1:]], "trial-1: handed over where trial-2 was due"),
        (lambda o: [*o, o[-1]], "after-timing: handed over where no further output was due"),
        (lambda o: [("trial-0", o[0][1]), *o], "trial-0: handed over where trial-1 was due"),
        (lambda o: o[:-1], "after-timing: no output after-timing was handed over"),
    ],
    ids=["swapped", "repeated", "one too many", "unknown name", "one missing"],
)
def test_outputs_out_of_order_repeated_unknown_or_missing_fail(change, says) -> None:
    verdict, _ = run(change(honest()))
    assert not verdict["ok"]
    assert verdict["reason"].startswith(says), verdict["reason"]


# Two comparison chunks on the CPU (`measure.output_rule.CPU_COMPARE_CHUNK` is 2^20 elements).
WIDE = REFERENCE.replace("torch.randn(8, 32)", "torch.randn(64, 32768)")


@pytest.mark.parametrize("name", ["trial-1", "trial-2"], ids=["by the truth", "calibrated"])
def test_an_output_good_in_its_first_chunk_and_wrong_in_its_last_fails(name: str) -> None:
    """The judge's comparisons are chunked: an output right in every chunk but its last
    (one element off at the end) fails, on the call the truth decides and on a later one."""
    from pytest_kernelpro.measure.output_rule import CPU_COMPARE_CHUNK

    task = {**TASK, "reference": WIDE}
    ref = judge._Reference(task)
    try:
        outputs = [(n, ref.output(seed)) for n, seed in judge.required_outputs(task)]
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert outputs[0][1][0].numel() > CPU_COMPARE_CHUNK
    at = [n for n, _ in outputs].index(name)
    bad = outputs[at][1][0].clone()
    bad.view(-1)[-1] += 0.5
    outputs[at] = (name, [bad])
    try:
        verdict = judge.judge(task, iter(outputs))
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert not verdict["ok"]
    assert verdict["reason"].startswith(f"{name}: "), verdict["reason"]


def test_the_judges_truth_drops_its_inputs_once_widened_and_decides_alike() -> None:
    """The judge gives its inputs to the truth's re-run, which empties the list once widened
    (one input set fewer at the judge's peak); the truth is the same as one made on inputs
    that are kept."""
    from pytest_kernelpro.optimize.sandbox import measurement
    from pytest_kernelpro.optimize.sandbox.checks import flatten

    ref = judge._Reference(TASK)
    try:
        out = ref.output(TASK["seed"] + 1, truth=False)
        kept, given = ref.inputs(TASK["seed"] + 1), ref.inputs(TASK["seed"] + 1)
        truths = []
        for inputs, consume in ((kept, False), (given, True)):
            rule = measurement.new_rule(TASK)
            measurement.find_truth(
                torch,
                rule,
                ref.model,
                inputs,
                out,
                ref.device,
                arrange=flatten,
                consume_inputs=consume,
            )
            truths.append(rule.truth)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert given == []
    assert len(kept) == 1
    assert all(t.available for t in truths), [t.skipped for t in truths]
    a, b = (next(iter(t.leaves.values())) for t in truths)
    assert torch.equal(a.difference, b.difference)
    assert a.reference_error_norm == b.reference_error_norm


def test_the_judges_truth_takes_the_first_draw_and_its_output_is_drawn_once_more() -> None:
    """The truth takes the inputs the judge drew for its first call (the call ran on a copy),
    instead of drawing them again; on the CPU the reference's output the truth measures is
    made once more after the float64 re-run (its own draw: the re-run holds no reference
    output beside it). Two draws for the first output, one for each later."""
    from pytest_kernelpro.optimize.sandbox import measurement

    drawn: list[int] = []
    make = measurement.make_inputs

    def counting(module: Any, seed: int, device: Any) -> list[Any]:
        drawn.append(seed)
        return make(module, seed, device)

    ref = judge._Reference(TASK)
    measurement.make_inputs = counting  # type: ignore[assignment]
    try:
        ref.output(TASK["seed"] + 1)
        ref.output(TASK["seed"] + 2)
    finally:
        measurement.make_inputs = make  # type: ignore[assignment]
        sys.modules.pop("kernelpro_reference", None)
    assert drawn == [TASK["seed"] + 1, TASK["seed"] + 1, TASK["seed"] + 2]
    assert ref.rule.truth is not None
    assert ref.rule.truth.available


WRITES_ITS_INPUT = REFERENCE.replace(
    "        return torch.softmax(x, dim=-1)",
    "        y = torch.softmax(x, dim=-1)\n        x.mul_(3.0)\n        return y",
)


def test_a_reference_writing_its_inputs_gives_the_judge_the_truth_of_the_drawn_ones() -> None:
    """The attack on keeping the first call's inputs: a reference that scales its input in
    place would hand the truth changed inputs (its float64 re-run would then differ from the
    reference's output and no truth, or a wrong one, would decide). The call runs on a copy,
    so the truth is made on the inputs as drawn: the same as on a fresh draw."""
    from pytest_kernelpro.optimize.sandbox import measurement
    from pytest_kernelpro.optimize.sandbox.checks import flatten

    task = dict(TASK, reference=WRITES_ITS_INPUT)
    ref = judge._Reference(task)
    try:
        out = ref.output(task["seed"] + 1)
        fresh = measurement.new_rule(task)
        measurement.find_truth(
            torch, fresh, ref.model, ref.inputs(task["seed"] + 1), out, ref.device, arrange=flatten
        )
    finally:
        sys.modules.pop("kernelpro_reference", None)
    judged, drawn = ref.rule.truth, fresh.truth
    assert judged is not None
    assert drawn is not None
    assert judged.available, judged.skipped
    assert drawn.available, drawn.skipped
    a, b = (next(iter(t.leaves.values())) for t in (judged, drawn))
    assert a.reference_error_norm == b.reference_error_norm
    assert a.reference_error_max == b.reference_error_max


# ----- the truth told to the worker (`judge.judge`'s `tell_truth`) -----


def told_run(outputs: list[tuple[str, list[Any]]]) -> tuple[dict[str, Any], list[Any], list[int]]:
    """The verdict, the truths told, and how many outputs had been taken when each was told."""
    taken, told, taken_when = 0, [], []

    def stream() -> Iterator[tuple[str, list[Any]]]:
        nonlocal taken
        for item in outputs:
            taken += 1
            yield item

    def tell(payload: Any) -> None:
        told.append(json.loads(json.dumps(payload)))  # as it crosses the channel
        taken_when.append(taken)

    try:
        return judge.judge(TASK, stream(), tell), told, taken_when
    finally:
        sys.modules.pop("kernelpro_reference", None)


def test_the_judge_tells_its_truth_before_it_takes_the_first_output() -> None:
    """The truth's re-run holds no handed-over output beside it: told once, before the first
    output is asked for; the honest outputs then pass as without it."""
    verdict, told, taken_when = told_run(honest())
    assert verdict["ok"], verdict
    assert taken_when == [0]
    (payload,) = told
    assert payload["truth"]["precision"] == "float64"
    assert set(payload["truth"]["leaves"]) == {"output"}  # the worker's output is a tensor
    assert "difference" not in payload["truth"]["leaves"]["output"]  # numbers only


def first_truth() -> tuple[Any, list[Any]]:
    """A judge's reference after its first output (its truth found), and that output."""
    ref = judge._Reference(TASK)
    try:
        return ref, ref.output(judge.required_outputs(TASK)[0][1])
    finally:
        sys.modules.pop("kernelpro_reference", None)


def test_a_worker_given_the_judges_truth_decides_later_calls_as_the_judge_does() -> None:
    """`take_truth` calibrates the worker's rule exactly as the judge's first comparison
    calibrates its own: the same tolerance for every later call and the timed ones."""
    from pytest_kernelpro.optimize.sandbox import measurement

    outputs = honest()
    ref, expected = first_truth()
    payload = json.loads(json.dumps(measurement.truth_payload(ref.rule)))
    assert measurement.verdict(torch, outputs[0][1], expected, ref.rule).ok  # calibrates
    worker_rule = measurement.new_rule(TASK)
    measurement.take_truth(worker_rule, payload)
    assert worker_rule.calibrated == ref.rule.calibrated
    assert worker_rule.name == ref.rule.name
    assert worker_rule.reduced == ref.rule.reduced


@pytest.mark.parametrize(
    "payload",
    [{}, {"reduced": 3, "truth": None}, {"reduced": None, "truth": {"leaves": {"o": {}}}}],
    ids=["empty", "reduced not a name", "leaf without numbers"],
)
def test_a_truth_of_another_shape_is_refused(payload: dict[str, Any]) -> None:
    """The worker finds its own truth then (`harness._Pipeline.judge_truth`)."""
    from pytest_kernelpro.optimize.sandbox import measurement

    with pytest.raises((KeyError, TypeError, ValueError)):
        measurement.take_truth(measurement.new_rule(TASK), payload)


def test_a_first_output_failing_the_truth_is_wrong_only_where_the_tolerance_told_passes_it() -> (
    None
):
    """The first output is compared with the truth in the judge only; the worker decided it
    by the truth calibrated, which allows the reference's own error on top. An output
    between the two fails as "wrong" (an honest worker would have passed it); one the
    calibrated tolerance fails too is a claim the worker broke."""
    from pytest_kernelpro.optimize.sandbox import measurement

    outputs = honest()
    ref, expected = first_truth()
    payload = measurement.truth_payload(ref.rule)
    (leaf,) = ref.rule.truth.leaves.values()
    told = measurement.new_rule(TASK)
    measurement.take_truth(told, payload)

    def off_by(steps: float) -> list[Any]:
        bad = expected[0].clone()
        bad.view(-1)[0] += steps * leaf.reference_error_max
        return [bad]

    def by_truth(out: list[Any]) -> bool:
        rule = measurement.new_rule(TASK)
        rule.set_truth(ref.rule.truth)
        return measurement.verdict(torch, out, expected, rule).ok

    between = [
        s
        for s in (2.0, 4.0, 8.0, 12.0, 16.0, 24.0)
        if not by_truth(off_by(s)) and measurement.verdict(torch, off_by(s), expected, told).ok
    ]
    assert between, "no output fails the truth and passes the calibrated tolerance"
    for first, wrong in ((off_by(between[0]), True), ([expected[0] + 0.5], False)):
        verdict, _, _ = told_run([("trial-1", first), *outputs[1:]])
        assert not verdict["ok"]
        assert verdict["reason"].startswith("trial-1: "), verdict["reason"]
        assert verdict["wrong"] is wrong


DICT_OUT = REFERENCE.replace(
    "return torch.softmax(x, dim=-1)",
    'return {"z": torch.softmax(x, dim=-1), "a": (x * 2, x.abs())}',
)


def test_the_truth_told_names_the_leaves_as_the_worker_sees_its_output() -> None:
    """The judge flattens outputs (dict keys sorted); the worker judges them unflattened
    (keys in order): the truth told is renamed to the worker's paths, or the worker would
    find no calibration for any leaf and decide by the dtype default."""
    from pytest_kernelpro.measure.output_rule import leaves_of
    from pytest_kernelpro.optimize.sandbox import measurement

    task = {**TASK, "reference": DICT_OUT}
    try:
        told: list[dict[str, Any]] = []
        judge.judge(task, iter(()), told.append)
        module = sys.modules["kernelpro_reference"]
        x = torch.randn(8, 32)
        raw = module.Model()(x)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    worker_paths = [path for path, _ in leaves_of(torch, raw)]
    assert worker_paths == ["output['z']", "output['a'][0]", "output['a'][1]"]
    (payload,) = told
    assert set(payload["truth"]["leaves"]) == set(worker_paths)
    worker_rule = measurement.new_rule(task)
    measurement.take_truth(worker_rule, payload)
    assert set(worker_rule.calibrated) == set(worker_paths)


def test_the_truths_difference_is_freed_once_the_first_call_is_decided() -> None:
    """reference - truth (one output's size) is needed for the first comparison only; the
    rule drops it then, but a reference cycle kept it until the cyclic collector happened to
    run (a whole output held by the judge, idle, through the worker's timing). `verdict`
    collects it: gone at once, with automatic collection off."""
    import gc
    import weakref

    from pytest_kernelpro.optimize.sandbox import measurement

    ref, expected = first_truth()
    (leaf,) = ref.rule.truth.leaves.values()
    gone = weakref.ref(leaf.difference)
    del leaf
    gc.disable()
    try:
        assert measurement.verdict(torch, [expected[0].clone()], expected, ref.rule).ok
        assert gone() is None
    finally:
        gc.enable()


def _output_sized(exclude: list[Any]) -> int:
    """Live tensors of the problem's output's shape (8 x 32) other than those in `exclude`."""
    import gc

    given = {id(t) for _, leaves in exclude for t in leaves}
    return sum(
        1
        for o in gc.get_objects()
        if type(o) is torch.Tensor and tuple(o.shape) == (8, 32) and id(o) not in given
    )


def test_the_judge_holds_one_output_while_the_worker_makes_its_first_call() -> None:
    """The worker's first call runs beside what the judge keeps for the first comparison:
    reference - truth only (one output's size). The reference's output the truth ran beside
    is made again when the first output comes, and that output still passes (its bytes are
    the ones the truth's difference was measured on)."""
    outputs = honest()
    held: list[int] = []
    verdict, _ = run(outputs, lambda payload: held.append(_output_sized(outputs)))
    assert verdict["ok"], verdict
    assert held == [1]


NOT_DETERMINISTIC = REFERENCE.replace(
    "        return torch.softmax(x, dim=-1)",
    "        self.calls = getattr(self, 'calls', 0) + 1\n"
    "        return torch.softmax(x, dim=-1) * (1 + 1e-6 * self.calls)",
)


def test_a_reference_giving_other_bytes_made_again_gets_its_truth_found_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack on making the first output's reference again: a reference whose output
    differs from call to call would be compared with a truth's difference measured on
    another output. Its digest differs, so the truth is found again on the output made
    again (two truths), where a deterministic reference's is found once."""
    from pytest_kernelpro.optimize.sandbox import measurement

    found: list[int] = []
    find_truth = measurement.find_truth

    def counting(*args: Any, **kwargs: Any) -> None:
        found.append(1)
        find_truth(*args, **kwargs)

    monkeypatch.setattr(measurement, "find_truth", counting)
    outputs = honest()
    for reference, truths in ((REFERENCE, 1), (NOT_DETERMINISTIC, 2)):
        found.clear()
        try:
            judge.judge(dict(TASK, reference=reference), iter(outputs[:1]), lambda payload: None)
        finally:
            sys.modules.pop("kernelpro_reference", None)
        assert len(found) == truths, reference


RECORDS_ITS_RERUN = REFERENCE.replace(
    "class Model(nn.Module):",
    "SEEN = []\n\n\nclass Model(nn.Module):",
).replace(
    "        return torch.softmax(x, dim=-1)",
    "        if x.dtype == torch.float64:  # the truth's re-run: float32 8x32 tensors alive\n"
    "            import gc\n"
    "            SEEN.append(sum(1 for o in gc.get_objects() if type(o) is torch.Tensor\n"
    "                            and o.dtype == torch.float32 and tuple(o.shape) == (8, 32)\n"
    "                            and not o.is_meta))\n"
    "        return torch.softmax(x, dim=-1)",
)


def test_the_judges_truth_rerun_holds_no_reference_output_beside_it() -> None:
    """The float64 re-run holds its widened inputs and output; the reference's output (and
    the drawn inputs, widened) are gone meanwhile: no float32 tensor of the output's shape is
    alive during it (the reference's output was, before it was made again after the
    re-run). The output returned is the reference's on a draw of that seed, and the truth's
    difference is measured on it."""
    task = dict(TASK, reference=RECORDS_ITS_RERUN)
    ref = judge._Reference(task)
    seed = judge.required_outputs(task)[0][1]
    try:
        (out,) = ref.output(seed)
        seen = list(sys.modules["kernelpro_reference"].SEEN)
        again = ref.output(seed, truth=False)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert seen == [0]
    assert torch.equal(out, again[0])
    truth = ref.rule.truth
    assert truth is not None
    assert truth.available, truth.skipped
    (leaf,) = truth.leaves.values()
    assert leaf.difference is not None
    assert leaf.reference_error_max > 0.0


def test_a_float64_reference_has_no_rerun_and_its_output_is_not_made_again() -> None:
    """An output with no wider type to re-run in has no truth's re-run: the judge keeps the
    output it made (one draw for the first output), as before the re-run dropped it."""
    from pytest_kernelpro.optimize.sandbox import measurement

    drawn: list[int] = []
    make = measurement.make_inputs

    def counting(module: Any, seed: int, device: Any) -> list[Any]:
        drawn.append(seed)
        return make(module, seed, device)

    task = dict(
        TASK, reference=REFERENCE.replace("torch.randn(8, 32)", "torch.randn(8, 32).double()")
    )
    ref = judge._Reference(task)
    measurement.make_inputs = counting  # type: ignore[assignment]
    try:
        (out,) = ref.output(task["seed"] + 1)
    finally:
        measurement.make_inputs = make  # type: ignore[assignment]
        sys.modules.pop("kernelpro_reference", None)
    assert out.dtype == torch.float64
    assert drawn == [task["seed"] + 1]
    assert ref.rule.truth is not None
    assert not ref.rule.truth.available


# ----- the first output's reference kept where one more output fits (large problems) -----


@pytest.fixture
def keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """This tiny problem judged as a large one is: one more output fits the memory bound."""
    from pytest_kernelpro.optimize.sandbox import footprint

    monkeypatch.setattr(footprint.Footprint, "room_for_kept_reference", lambda self: True)


def _draws_of_one_evaluation(
    monkeypatch: pytest.MonkeyPatch, beside_a_worker: bool = True
) -> tuple[dict[str, Any], list[int]]:
    """A judge of honest outputs, beside a worker (told its truth) or not (a mapping of
    outputs): its verdict and the seeds the input maker was called with, in order."""
    from pytest_kernelpro.optimize.sandbox import measurement

    outputs = honest()
    drawn: list[int] = []
    make = measurement.make_inputs

    def counting(module: Any, seed: int, device: Any) -> list[Any]:
        drawn.append(seed)
        return make(module, seed, device)

    monkeypatch.setattr(measurement, "make_inputs", counting)
    verdict, _ = run(outputs, lambda payload: None) if beside_a_worker else run(outputs)
    return verdict, drawn


def test_a_small_problem_draws_the_first_inputs_three_times_in_the_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where one more output does not fit (a small problem: the interpreters are most of the
    peak) the judge makes the first output's reference again after the truth's re-run and
    when the first output comes: three draws of the first inputs, one of each later's."""
    verdict, drawn = _draws_of_one_evaluation(monkeypatch)
    assert verdict["ok"], verdict
    first = [seed for _, seed in judge.required_outputs(TASK)]
    assert [drawn.count(seed) for seed in first] == [3, 1, 1, 1, 1]


def test_where_one_more_output_fits_the_judge_draws_the_first_inputs_once(
    keeps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge keeps the reference's output of its first call (the one the truth is
    measured on) to the first comparison: one draw of the first inputs and one reference
    call, not three; every checked output still on its own draw, and honest outputs pass."""
    verdict, drawn = _draws_of_one_evaluation(monkeypatch)
    assert verdict["ok"], verdict
    first = [seed for _, seed in judge.required_outputs(TASK)]
    assert [drawn.count(seed) for seed in first] == [1, 1, 1, 1, 1]


def test_the_kept_reference_is_held_beside_the_truths_rerun_and_the_first_call(
    keeps: None,
) -> None:
    """What keeping costs, counted: the reference's output is alive during the float64
    re-run (one float32 output-sized tensor; none where it is made again) and beside
    reference - truth while the worker makes its first call (two outputs, one otherwise)."""
    task = dict(TASK, reference=RECORDS_ITS_RERUN)
    ref = judge._Reference(task)
    ref.truth_first = True  # as `judge.judge` beside a worker
    try:
        ref.output(judge.required_outputs(task)[0][1])
        seen = list(sys.modules["kernelpro_reference"].SEEN)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert ref.keeps_reference
    assert seen == [1]
    del ref  # its truth's difference is an output-sized tensor
    outputs = honest()
    held: list[int] = []
    verdict, _ = run(outputs, lambda payload: held.append(_output_sized(outputs)))
    assert verdict["ok"], verdict
    assert held == [2]


def test_a_kept_reference_still_fails_a_wrong_first_output(keeps: None) -> None:
    """The kept output decides the first comparison as the one made again did: an output off
    by one element fails at trial-1, every later output is still taken."""
    outputs = honest()
    bad = outputs[0][1][0].clone()
    bad.view(-1)[-1] += 0.5
    outputs[0] = (outputs[0][0], [bad])
    verdict, taken = run(outputs, lambda payload: None)
    assert not verdict["ok"]
    assert verdict["reason"].startswith("trial-1: "), verdict["reason"]
    assert taken == 5


def test_a_kept_reference_is_the_truths_so_a_reference_not_deterministic_has_one_truth(
    keeps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made again, a reference whose output differs from call to call needs its truth found
    again (the digests differ); kept, the output compared is the one the truth's difference
    was measured on: one truth, and no digest compared."""
    from pytest_kernelpro.optimize.sandbox import checks, measurement

    found: list[int] = []
    find_truth = measurement.find_truth

    def counting(*args: Any, **kwargs: Any) -> None:
        found.append(1)
        find_truth(*args, **kwargs)

    digested: list[int] = []
    digest = checks.digest

    def counting_digest(*args: Any, **kwargs: Any) -> bytes:
        digested.append(1)
        return digest(*args, **kwargs)

    outputs = honest()
    monkeypatch.setattr(measurement, "find_truth", counting)
    monkeypatch.setattr(checks, "digest", counting_digest)
    try:
        judge.judge(dict(TASK, reference=NOT_DETERMINISTIC), iter(outputs[:1]), lambda p: None)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert len(found) == 1
    assert digested == []


def test_one_more_output_fits_the_issues_size_and_not_a_quarter_of_it() -> None:
    """`room_for_kept_reference` by the footprint's own count: a 16384x32768 float32 softmax
    (2 GiB in, 2 GiB out) keeps the reference, a 4096x32768 one and a small one do not."""
    from pytest_kernelpro.optimize.sandbox.footprint import Footprint

    def softmax(rows: int) -> Footprint:
        return Footprint(rows * 32768 * 4, rows * 32768 * 4)

    assert softmax(16384).room_for_kept_reference()
    assert not softmax(4096).room_for_kept_reference()
    assert not Footprint(8 * 32 * 4, 8 * 32 * 4).room_for_kept_reference()


def test_a_judge_finding_its_truth_on_a_handed_over_output_does_not_keep_the_reference(
    keeps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a worker to tell (the re-timing worker's judge, a mapping of outputs) the
    truth is found with the first output already held: keeping the reference's output too
    would hold two outputs beside the re-run, so it is made again after it (two draws of
    the first inputs, not one), even where one more output fits."""
    verdict, drawn = _draws_of_one_evaluation(monkeypatch, beside_a_worker=False)
    assert verdict["ok"], verdict
    first = judge.required_outputs(TASK)[0][1]
    assert drawn.count(first) == 2  # the truth's call and its output made again after it


# ----- the truth of an earlier judge of the search (`judge._Reference.take_known_truth`) -----


def test_a_later_judge_takes_the_first_judges_truth_and_finds_none_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The truth depends on the reference and the seed alone: the first judge's verdict
    carries it, a later judge given it runs no float64 re-run (`find_truth` raises here),
    tells the worker the same numbers, and passes the honest outputs by the calibrated
    tolerance."""
    from pytest_kernelpro.optimize.sandbox import measurement

    first, told_first, _ = told_run(honest())
    assert first["ok"], first
    known = json.loads(json.dumps(first["known_truth"]))  # as it crosses task.json

    def found_again(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the later judge found the truth again")

    outputs = honest()  # made with a truth (`ref.output`'s first call): before the patch
    monkeypatch.setattr(measurement, "find_truth", found_again)
    told: list[Any] = []
    try:
        later = judge.judge({**TASK, "known_truth": known}, iter(outputs), told.append)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert later["ok"], later
    assert later["truth_taken"] is True
    assert "known_truth" not in later  # only a judge that found it gives it on
    assert later["checked"] == [name for name, _ in outputs]
    assert json.loads(json.dumps(told)) == told_first


def test_a_judge_that_took_the_truth_still_fails_a_bad_first_output_as_a_broken_claim() -> None:
    """With no truth of its own the first output is decided by the tolerance the worker was
    told: one that fails it is a claim the worker broke, not "wrong"; so is a later one."""
    first, _, _ = told_run(honest())
    for at in (0, 3):
        outputs = honest()
        name, leaves = outputs[at]
        outputs[at] = (name, [leaves[0] * 1.001])
        try:
            verdict = judge.judge({**TASK, "known_truth": first["known_truth"]}, iter(outputs), id)
        finally:
            sys.modules.pop("kernelpro_reference", None)
        assert not verdict["ok"]
        assert verdict["reason"].startswith(f"{name}: "), verdict["reason"]
        assert verdict["wrong"] is False


@pytest.mark.parametrize(
    "known",
    [{}, {"payload": {"reduced": None}, "paths": {}}, {"payload": {}, "paths": None}],
    ids=["empty", "no truth in the payload", "no payload"],
)
def test_a_known_truth_of_another_shape_is_found_again(known: dict[str, Any]) -> None:
    verdict, _ = run(honest())
    try:
        again = judge.judge({**TASK, "known_truth": known}, iter(honest()), id)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert again["ok"], again
    assert "truth_taken" not in again
    found, first = (v["known_truth"]["payload"]["truth"] for v in (again, verdict))
    assert found["leaves"] == first["leaves"]  # the same truth, found again


@pytest.mark.parametrize(
    ("reference", "writes"), [(REFERENCE, False), (WRITES_ITS_INPUT, True)], ids=["reads", "writes"]
)
def test_the_worker_is_told_whether_the_reference_writes_its_inputs(
    reference: str, writes: bool
) -> None:
    """Found on the truth's call (it runs on a copy of the inputs as drawn) and told with the
    truth; a later judge that takes the truth tells its worker the same."""
    told = _told_by_the_first_judge_and_a_later_one(reference)
    assert [payload["modifies_inputs"] for payload in told] == [writes, writes]


def _told_by_the_first_judge_and_a_later_one(reference: str) -> list[dict[str, Any]]:
    """What the first judge of a search tells its worker, then what a later judge that takes
    the first one's truth tells its own (no output is handed over to either)."""
    task = {**TASK, "reference": reference}
    told: list[dict[str, Any]] = []
    try:
        first = judge.judge(task, iter(()), told.append)
        judge.judge({**task, "known_truth": first["known_truth"]}, iter(()), told.append)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    return told


# Returns its input itself: its output aliases its input.
RETURNS_ITS_INPUT = REFERENCE.replace("return torch.softmax(x, dim=-1)", "return x.relu_()")


@pytest.mark.parametrize(
    ("reference", "aliases"),
    [(REFERENCE, False), (RETURNS_ITS_INPUT, True)],
    ids=["a new output", "its input"],
)
def test_the_worker_is_told_whether_the_references_output_aliases_its_inputs(
    reference: str, aliases: bool
) -> None:
    """Found on the truth's call and told with the truth, by the first judge and by a later
    one: the worker, which makes no reference call of its own for the calls the judge
    decides, then knows whether a candidate's output may alias its inputs."""
    told = _told_by_the_first_judge_and_a_later_one(reference)
    assert [payload["aliases_inputs"] for payload in told] == [aliases, aliases]


def test_the_judge_says_why_it_refused_each_output_before_it_takes_the_next() -> None:
    """`failures`: the reason for a refused output is set by the time the judge asks for the
    next one (the stream sends it with that acknowledgment, `handles.stream_outputs`), its
    leaves named as the worker names them; passed outputs have none, and an output taken
    after the first refusal carries the verdict's reason."""
    failures: dict[str, str] = {}
    seen: list[dict[str, str]] = []
    outputs = honest()
    name, leaves = outputs[1]
    outputs[1] = (name, [leaves[0] + 0.5])

    def stream() -> Iterator[tuple[str, list[Any]]]:
        for item in outputs:
            seen.append(dict(failures))  # what the acknowledgment of the last one carries
            yield item
        seen.append(dict(failures))

    try:
        verdict = judge.judge(TASK, stream(), None, failures)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert not verdict["ok"]
    assert seen[1] == {}  # trial-1 passed
    assert list(seen[2]) == ["trial-2"]
    assert "outside rtol=" in seen[2]["trial-2"]
    # Named as the worker names its output (a tensor: "output"), not as flattened here.
    assert verdict["reason"].startswith("trial-2: output[0]: "), verdict["reason"]
    assert seen[2]["trial-2"] == "output: " + verdict["reason"].removeprefix("trial-2: output[0]: ")
    assert seen[-1]["after-timing"] == verdict["reason"]


def test_a_judge_that_took_the_truth_decides_a_refused_first_output_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its rule is the tolerance the worker was told: the verdict on a refused first output is
    the worker's claim's too, so it is not made a second time (the rule's failure passes over
    a large wrong output took 40 s each at 16384x32768). The first judge, which decides the
    first output by the truth itself, still asks what the told tolerance says of it."""
    from pytest_kernelpro.optimize.sandbox import measurement

    first, _, _ = told_run(honest())
    calls: list[int] = []
    decide = measurement.verdict

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return decide(*args, **kwargs)

    monkeypatch.setattr(measurement, "verdict", counted)
    for known, made in ((first["known_truth"], 1), (None, 2)):
        outputs = honest()
        name, leaves = outputs[0]
        outputs[0] = (name, [leaves[0] * 1.001])
        calls.clear()
        try:
            verdict = judge.judge({**TASK, "known_truth": known}, iter(outputs), id)
        finally:
            sys.modules.pop("kernelpro_reference", None)
        assert not verdict["ok"]
        assert verdict["reason"].startswith("trial-1: "), verdict["reason"]
        assert len(calls) == made, (known is None, calls)


def test_the_reason_sent_to_the_worker_names_every_leaf_as_the_worker_does() -> None:
    """An output off by a constant factor: the rule's reason names the leaf twice (its note on
    the factor, then the leaf's own comparison); both mentions are the worker's name of it
    ("output"), none the flattened one ("output[0]"), as in a reason the worker made."""
    failures: dict[str, str] = {}
    outputs = honest()
    name, leaves = outputs[1]
    outputs[1] = (name, [leaves[0] * 1.01])
    try:
        verdict = judge.judge(TASK, iter(outputs), None, failures)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert not verdict["ok"]
    said = failures["trial-2"]
    assert "the kernel returned 1.01 times the reference" in said, said
    assert said.count("output:") >= 2, said
    assert "output[0]" not in said, said
