"""A checked call's order in the worker on the CPU (`harness._Pipeline.candidate_first`): the
candidate runs before the reference, so its call and temporaries never sit beside the
reference's output; the reference's output still decides the call."""

from __future__ import annotations

import types
from typing import Any

import pytest
from harness_runs import run_in_process

from pytest_kernelpro.optimize.sandbox import harness, measurement

torch = pytest.importorskip("torch")

# The reference's output (16,) has a shape no input has: its live outputs are counted by weak
# reference, from the candidate's call.
REFERENCE = """import weakref

import torch
from torch import nn

OUTPUTS = []


class Model(nn.Module):
    def forward(self, x):
        out = torch.logsumexp(x, dim=-1)
        OUTPUTS.append(weakref.ref(out))
        return out


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""

CANDIDATE = """import sys

import torch
from torch import nn

SEEN = []


class ModelNew(nn.Module):
    def forward(self, x):
        outputs = sys.modules["kernelpro_reference"].OUTPUTS
        alive = sum(1 for ref in outputs if ref() is not None)
        SEEN.append((float(x.reshape(-1)[0]), x.shape[0], alive))
        return torch.logsumexp(x, dim=-1)
"""

# Right on its first call (the truth's, reference first), wrong from its second on.
WRONG = CANDIDATE.replace(
    "        return torch.logsumexp(x, dim=-1)",
    "        self.calls = getattr(self, 'calls', 0) + 1\n"
    "        return torch.logsumexp(x, dim=-1) if self.calls == 1 else x.amax(dim=-1)",
)


def _run(candidate: str) -> tuple[dict[str, Any], list[tuple[float, int, int]]]:
    return run_in_process(REFERENCE, candidate, read=lambda module: list(module.SEEN), seed=42)


def _first_value(seed: int) -> float:
    module = types.ModuleType("reference_for_the_draw")
    exec(REFERENCE, module.__dict__)
    return float(measurement.make_inputs(module, seed, "cpu")[0].reshape(-1)[0])


def _first_judges_word() -> dict[str, Any]:
    """What the first judge of a search tells its worker before its first call (the truth,
    whether the reference writes or aliases its inputs), made by the judge's own code."""
    import sys

    from pytest_kernelpro.optimize.sandbox import judge

    task = {"reference": REFERENCE, "device": "cpu", "seed": 42}
    try:
        ref = judge._Reference(task)
        ref.output(judge.required_outputs(task)[0][1])
        return ref.worker_truth()
    finally:
        sys.modules.pop("kernelpro_reference", None)


def test_no_reference_output_is_alive_while_the_candidate_makes_a_later_checked_call() -> None:
    """Trials 2 and 3 and the call after timing (seeds 44, 45, 343): the reference's output
    of the call is made after the candidate's, so none is alive during the candidate's call
    (one was, when the reference ran first). Trial 1 here is this worker's own truth's call
    (no judge beside it in this process): the reference runs first there, as before."""
    result, seen = _run(CANDIDATE)
    assert result["status"] == "correct", result.get("reason")
    by_content = {value: alive for value, batch, alive in seen if batch == 16}
    for seed in (44, 45, 343):
        assert by_content[_first_value(seed)] == 0, (seed, seen)
    assert by_content[_first_value(43)] == 1  # the truth's call: the reference first


def test_a_wrong_candidate_run_first_is_still_wrong() -> None:
    """The reference's output made after the candidate's call still decides it: a candidate
    wrong from its second call fails at trial 2, which runs the candidate first."""
    result, seen = _run(WRONG)
    assert result["status"] == "wrong", result
    assert "trial 2/3" in result["reason"], result["reason"]
    assert seen[1] == (_first_value(44), 16, 0)  # trial 2: no reference output yet


def test_no_input_is_alive_when_a_checked_calls_output_is_handed_to_the_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The judge starts on an output as soon as it is handed over (it makes that call's inputs
    and the reference's output): the worker has dropped the call's inputs by then, for the
    three trials and the check with inputs changed in place, so the two never sit beside the
    judge's (the evaluation's peak was there)."""
    import gc

    found: dict[str, int] = {}
    save = harness._Pipeline.save_output

    def counting(self: Any, label: str, holder: list[Any]) -> str | None:
        gc.collect()
        inputs = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.shape == (16, 64)]
        found[label] = len(inputs)
        return save(self, label, holder)

    monkeypatch.setattr(harness._Pipeline, "save_output", counting)
    result, _seen = _run(CANDIDATE)
    assert result["status"] == "correct", result.get("reason")
    for label in ("trial 2/3", "trial 3/3", "inputs changed in place"):
        assert found[label] == 0, found


def test_the_judges_word_on_input_writes_saves_the_workers_own_reference_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The judge finds on its truth's call whether the reference writes its inputs and tells
    the worker with the truth (`judge._Reference.worker_truth`): the worker's first checked
    call then runs the reference once, not once more to find that out. Told the same truth
    without that word, it makes the extra call. The judge beside the worker is this process's
    judge code; no output is handed over (no channel here)."""
    from pytest_kernelpro.optimize.sandbox import handles

    told = _first_judges_word()
    assert told["modifies_inputs"] is False
    calls: dict[str, int] = {}
    run_reference = harness._Pipeline.run_reference

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[name] += 1  # the checked calls' reference calls (the timing's checks are not)
        return run_reference(self, *args, **kwargs)

    monkeypatch.setenv(handles.HANDLE_FD_ENV, "-1")  # a judge beside: its truth is asked for
    monkeypatch.setattr(harness._Pipeline, "save_output", lambda self, label, holder: None)
    monkeypatch.setattr(harness._Pipeline, "run_reference", counted)
    for name, payload in (
        ("told", told),
        ("not told", {k: v for k, v in told.items() if k != "modifies_inputs"}),
    ):
        calls[name] = 0
        monkeypatch.setattr(handles, "await_truth", lambda channel=None, p=payload: p)
        result, _seen = _run(CANDIDATE)
        assert result["status"] == "correct", (name, result.get("reason"))
        assert result["correctness"]["truth"] == "the judge's, calibrating every check here"
    assert calls["not told"] == calls["told"] + 1, calls


def _judged_run(
    monkeypatch: pytest.MonkeyPatch,
    refusals: dict[str, str] | None = None,
    *,
    judge_beside: bool = True,
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The harness in this process beside a stand-in of the judge's channel: the first
    judge's word (`judge._Reference.worker_truth`, made here by the judge's own code), and
    an acknowledgment for every handed-over output carrying `refusals[name]` where given.
    Returns the result and the events in order: ("reference", None) for each reference call
    of the worker's checked calls, ("draw", seed) for each draw, ("handed", name) and
    ("acknowledged", name)."""
    from pytest_kernelpro.optimize.sandbox import handles, judge

    told = _first_judges_word()
    events: list[tuple[str, Any]] = []
    run_reference = harness._Pipeline.run_reference
    inputs = harness._Pipeline.inputs

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        events.append(("reference", None))
        return run_reference(self, *args, **kwargs)

    def drawing(self: Any, seed: int) -> list[Any]:
        events.append(("draw", seed))
        return inputs(self, seed)

    def handing(self: Any, label: str, holder: list[Any]) -> str | None:
        name = judge.output_name(label)
        holder.clear()
        if name is not None:
            events.append(("handed", name))
        return name

    def acknowledging(name: str, channel: Any = None) -> str | None:
        events.append(("acknowledged", name))
        return (refusals or {}).get(name)

    monkeypatch.setenv(handles.HANDLE_FD_ENV, "-1")
    monkeypatch.setattr(handles, "await_truth", lambda channel=None: told)
    monkeypatch.setattr(handles, "await_checked", acknowledging)
    monkeypatch.setattr(harness._Pipeline, "save_output", handing)
    monkeypatch.setattr(harness._Pipeline, "run_reference", counted)
    monkeypatch.setattr(harness._Pipeline, "inputs", drawing)
    result, _seen = _run_with(CANDIDATE, judge_beside=judge_beside)
    return result, events


def _run_with(candidate: str, **task_keys: Any) -> tuple[dict[str, Any], Any]:
    return run_in_process(
        REFERENCE, candidate, read=lambda module: list(module.SEEN), seed=42, **task_keys
    )


def test_a_call_the_judge_decides_makes_no_reference_output_in_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a judge beside it that says why it refuses an output, the worker compares none of
    the calls the judge decides (the three trials, the check with inputs changed in place,
    the call after timing): the judge computes the reference anyway. Only the second shape,
    which no judge checks, runs the worker's reference. Without a judge beside it (the same
    channel, `judge_beside` off), every checked call runs it."""
    result, events = _judged_run(monkeypatch)
    assert result["status"] == "correct", result.get("reason")
    assert [e for e in events if e[0] == "reference"] == [("reference", None)], events
    alone, events_alone = _judged_run(monkeypatch, judge_beside=False)
    assert alone["status"] == "correct", alone.get("reason")
    assert len([e for e in events_alone if e[0] == "reference"]) == 6, events_alone


@pytest.mark.parametrize(
    ("refused", "status", "starts"),
    [
        ("trial-2", "wrong", "wrong result (trial 2/3): "),
        ("inplace", "cheat", "returns a stale output when its inputs change in place"),
        ("after-timing", "cheat", "wrong once timed (behaves differently after repeated calls)"),
    ],
)
def test_the_judges_refusal_stops_the_worker_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, refused: str, status: str, starts: str
) -> None:
    """The worker stops at the call the judge refused, with the judge's reason, under the
    name that call's failure has (a stale output, a kernel wrong once timed), and hands over
    nothing after it."""
    why = "max abs error 0.5 above the tolerance 1e-05 (the judge's words)"
    result, events = _judged_run(monkeypatch, {refused: why})
    assert result["status"] == status, result
    assert result["reason"].startswith(starts), result["reason"]
    assert why in result["reason"]
    handed = [name for kind, name in events if kind == "handed"]
    assert handed[-1] == refused, handed


def test_the_next_calls_inputs_are_drawn_while_the_judge_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the judge checks a trial's output the worker draws the next call's inputs (the
    next trial's, after the last the in-place check's first set): the draw is most of a
    large problem's call, and the judge's own draw leaves a core idle. Each set is drawn
    once; after a refusal the set drawn ahead is dropped, not used."""
    result, events = _judged_run(monkeypatch)
    assert result["status"] == "correct", result.get("reason")
    order = [e for e in events if e[0] in ("draw", "handed", "acknowledged")]
    for name, next_seed in (("trial-1", 44), ("trial-2", 45), ("trial-3", 42 + 101)):
        handed = order.index(("handed", name))
        assert order[handed + 1] == ("draw", next_seed), order
        assert order[handed + 2] == ("acknowledged", name), order
    draws = [seed for kind, seed in events if kind == "draw"]
    for seed in (43, 44, 45, 42 + 101):
        assert draws.count(seed) == 1, draws
