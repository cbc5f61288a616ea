"""The search's winner must survive `SandboxEvaluator.confirm` (optimize_ranking.confirm_winner).

The evaluator here is a stand-in that returns a fixed confirmation: what is tested is what
the ranking does with it (`tests/optimize/search/test_sandbox_attacks.py` runs the real `confirm`).
"""

from __future__ import annotations

from types import SimpleNamespace

from pytest_kernelpro.optimize.loop.ranking import confirm_winner
from pytest_kernelpro.optimize.sandbox.confirm_winner import WinnerConfirmation
from pytest_kernelpro.optimize.sandbox.task import SandboxLimits
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.ranking import RankedCandidate, SearchRanking


class FixedConfirmation:
    def __init__(self, outcome: Evaluation) -> None:
        self.outcome = outcome
        self.asked: list[Candidate] = []

    def confirm(self, candidate: Candidate, evaluation: Evaluation) -> Evaluation:
        self.asked.append(candidate)
        return self.outcome


def _search() -> tuple[SearchRanking, SimpleNamespace, Candidate]:
    cand = Candidate("class ModelNew: ...")
    node = SimpleNamespace(id=3, candidate=cand, evaluation=Evaluation("correct", speedup=9.0))
    winner = RankedCandidate(node_id=3, code=cand.code, rank=1, verdict="faster")
    second = RankedCandidate(node_id=5, code="other", rank=2, verdict="no clear difference")
    ranking = SearchRanking(
        kernel="k", status="improved", reason="node 3 is faster", candidates=(winner, second)
    )
    return ranking, SimpleNamespace(nodes=(node,)), cand


def test_a_disqualified_winner_loses_the_win_and_its_rank() -> None:
    ranking, result, cand = _search()
    sandbox = FixedConfirmation(Evaluation("cheat", reason="timing not confirmed: 1000x"))
    new, info = confirm_winner(ranking, result, sandbox)
    assert sandbox.asked == [cand]
    assert new.status == "no improvement found"
    assert new.winner is None
    assert new.reason == "the winner (node 3) was disqualified: timing not confirmed: 1000x"
    assert [c.node_id for c in new.remeasured] == [5]  # no patch for the disqualified one
    assert [c.verdict for c in new.candidates] == ["no clear difference", "failed"]
    assert info["status"] == "disqualified"
    assert info["reason"] == "timing not confirmed: 1000x"
    assert info["disqualified"] == [{"node": 3, "reason": "timing not confirmed: 1000x"}]


def test_a_confirmed_winner_keeps_the_win() -> None:
    ranking, result, _ = _search()
    ok = Evaluation("correct", timing={"confirmed": {"median_s": 1e-5, "speedup": 8.7}})
    new, info = confirm_winner(ranking, result, FixedConfirmation(ok))
    assert new is ranking
    assert info == {"status": "confirmed", "median_s": 1e-5, "speedup": 8.7}


def test_a_re_timing_faster_than_the_tolerance_is_a_disagreement_not_confirmed() -> None:
    """The winner stays (correct, and a faster re-timing helps no cheat), but the summary
    and the terminal line say "disagreement", never "confirmed"."""
    from pytest_kernelpro.optimize.loop.report_texts import render_optimize_text
    from pytest_kernelpro.optimize.sandbox.confirm import confirm_timing

    outcome = confirm_timing(234.7e-6, [11.28e-6] * 5, device_kind="cpu")
    retimed = {**outcome.record, "reason": outcome.reason}
    ranking, result, _ = _search()
    new, info = confirm_winner(
        ranking, result, FixedConfirmation(Evaluation("correct", timing={"confirmed": retimed}))
    )
    assert new is ranking  # still the winner
    assert info["status"] == "disagreement"
    line = next(
        line
        for line in render_optimize_text({"status": "improved", "confirmation": info}).splitlines()
        if "re-timed in a fresh process" in line
    )
    assert line.strip().startswith("winner disagreement: re-timed in a fresh process at 11.28 µs")
    assert "confirmed:" not in line
    assert "not confirmed" in line


class ConfirmationsByNode:
    def __init__(self, outcomes: dict[str, Evaluation]) -> None:
        self.outcomes = outcomes
        self.asked: list[str] = []

    def confirm(self, candidate: Candidate, evaluation: Evaluation) -> Evaluation:
        self.asked.append(candidate.code)
        return self.outcomes[candidate.code]


def test_a_disqualified_winner_hands_the_win_to_the_next_clear_winner() -> None:
    """A cheating winner is caught at confirmation; the honest candidate that was also clearly
    faster is confirmed in turn and wins (an honest winner is never lost to a cheat)."""
    cheat, honest = Candidate("cheat"), Candidate("honest")
    nodes = (
        SimpleNamespace(id=3, candidate=cheat, evaluation=Evaluation("correct", speedup=900.0)),
        SimpleNamespace(id=5, candidate=honest, evaluation=Evaluation("correct", speedup=2.0)),
    )
    ranking = SearchRanking(
        kernel="k",
        status="improved",
        reason="node 3 is faster",
        candidates=(
            RankedCandidate(node_id=3, code="cheat", rank=1, verdict="faster"),
            RankedCandidate(
                node_id=5, code="honest", rank=2, verdict="faster", speedup_vs_current=2.0,
                reason="50% faster",
            ),
        ),
    )  # fmt: skip
    sandbox = ConfirmationsByNode({
        "cheat": Evaluation("cheat", reason="timing not confirmed: 900x"),
        "honest": Evaluation("correct", timing={"confirmed": {"median_s": 1e-3}}),
    })  # fmt: skip
    new, info = confirm_winner(ranking, SimpleNamespace(nodes=nodes), sandbox)
    assert sandbox.asked == ["cheat", "honest"]
    assert new.status == "improved"
    assert new.winner is not None
    assert new.winner.node_id == 5
    assert new.winner.rank == 1
    assert "the winner (node 3) was disqualified: timing not confirmed: 900x" in new.reason
    assert info["status"] == "confirmed"
    assert info["disqualified"] == [{"node": 3, "reason": "timing not confirmed: 900x"}]


class ScriptedRetimings(WinnerConfirmation):
    """`WinnerConfirmation.confirm` itself, its fresh workers replaced by re-timings whose
    medians are given: what is tested is the rule over several re-timings."""

    def __init__(self, medians_s: list[float]) -> None:
        self.limits = SandboxLimits()
        self.medians_s = list(medians_s)
        self.runs = 0

    def _needs_cuda(self) -> bool:
        return False

    def _retime_once(self, candidate: Candidate) -> Evaluation | str:
        median = self.medians_s[self.runs]
        self.runs += 1
        return Evaluation("correct", timing={"retimed": {"samples_s": [median] * 5}})


def _searched(median_s: float) -> Evaluation:
    return Evaluation("correct", timing={"candidate": {"median_s": median_s}})


def test_one_slow_re_timing_is_repeated_and_the_next_one_decides() -> None:
    # A load spike: the first fresh process 3.13x the search's median, the second 1.1x.
    confirmation = ScriptedRetimings([48.45e-6, 17e-6])
    outcome = confirmation.confirm(Candidate("c"), _searched(15.5e-6))
    assert confirmation.runs == 2
    assert outcome.status == "correct"
    confirmed = outcome.timing["confirmed"]
    assert confirmed["agreement"] == "confirmed"
    assert confirmed["median_s"] == 17e-6
    assert [r["median_s"] for r in confirmed["earlier_retimings"]] == [48.45e-6]


def test_a_search_time_slow_in_every_fresh_process_is_disqualified() -> None:
    confirmation = ScriptedRetimings([150e-6, 160e-6])
    outcome = confirmation.confirm(Candidate("c"), _searched(15.5e-6))
    assert confirmation.runs == 2
    assert outcome.status == "cheat"
    assert "re-timed in a fresh process at 160 µs" in (outcome.reason or "")
    assert outcome.timing["confirmation"]["earlier_retimings"][0]["median_s"] == 150e-6


def test_a_re_timing_within_the_tolerance_runs_once() -> None:
    confirmation = ScriptedRetimings([20e-6, 1.0])
    outcome = confirmation.confirm(Candidate("c"), _searched(15.5e-6))
    assert confirmation.runs == 1
    assert outcome.status == "correct"
    assert "earlier_retimings" not in outcome.timing["confirmed"]
