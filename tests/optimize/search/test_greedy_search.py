"""Greedy search: refine the best so far; debug the last failure while nothing is correct."""

from __future__ import annotations

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.search.greedy import GreedySearch
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.mcts import MCTS


def outcome(spec: str) -> Evaluation:
    try:
        return Evaluation(status="correct", speedup=float(spec))
    except ValueError:
        return Evaluation(status=spec)


class CodeEvaluator:
    def evaluate(self, candidate: Candidate) -> Evaluation:
        return outcome(candidate.code.split("#")[0])


class Scripted:
    def __init__(self, specs: list[str]) -> None:
        self.specs = list(specs)
        self.calls: list[tuple[str, str | None]] = []
        self.count = 0

    def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
        self.calls.append((mode, parent.code if parent else None))
        out = []
        for _ in range(max_candidates):
            if self.specs:
                self.count += 1
                out.append(Candidate(code=f"{self.specs.pop(0)}#{self.count}"))
        return out


def test_debugs_the_last_failure_until_something_is_correct() -> None:
    gen = Scripted(["build_error", "wrong", "run_error", "1.2", "1.1"])
    GreedySearch().run(gen, CodeEvaluator(), "5")
    assert gen.calls == [
        ("initial", None),
        ("debug", "build_error#1"),
        ("debug", "wrong#2"),
        ("debug", "run_error#3"),
        ("optimize", "1.2#4"),
    ]


def test_always_refines_the_best_so_far() -> None:
    gen = Scripted(["1.0", "1.5", "1.2", "wrong", "2.0", "1.9", "0.5"])
    result = GreedySearch().run(gen, CodeEvaluator(), "7")
    parents = [parent for _, parent in gen.calls[1:]]
    # 1.0 → 1.5 (new best) → 1.2, wrong, 2.0 all from 1.5 → 1.9 and 0.5 from 2.0
    assert parents == ["1.0#1", "1.5#2", "1.5#2", "1.5#2", "2.0#5", "2.0#5"]
    assert result.best_speedup == 2.0
    assert all(mode != "initial" for mode, _ in gen.calls[1:])  # never back to ROOT


def test_greedy_commits_to_the_first_basin_where_mcts_reseeds() -> None:
    """A trap: the first seed works but refining it only gets worse; a second seed is
    much better. Greedy never writes a second seed; MCTS's ROOT re-expansion does."""

    class Trap:
        def __init__(self) -> None:
            self.seeds = 0

        def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
            if mode == "initial":
                self.seeds += 1
                return [Candidate(code="1.2" if self.seeds == 1 else "3.0")]
            if mode == "optimize":
                base = float(parent.code)
                return [Candidate(code=f"{base * (0.9 if base < 2 else 1.05):.4f}")]
            return [Candidate(code="1.0")]

    greedy = GreedySearch().run(Trap(), CodeEvaluator(), "12")
    mcts = MCTS().run(Trap(), CodeEvaluator(), "12")
    assert greedy.best_speedup == 1.2
    assert mcts.best_speedup is not None
    assert mcts.best_speedup >= 3.0


def test_candidates_per_step() -> None:
    gen = Scripted(["1.0"] * 6)
    result = GreedySearch(candidates_per_step=3).run(gen, CodeEvaluator(), "6")
    assert len(gen.calls) == 2
    assert result.evaluations == 6
    with pytest.raises(KernelproConfigError, match="candidates_per_step=0"):
        GreedySearch(candidates_per_step=0)


class LastTold(CodeEvaluator):
    """Records the evaluations and when it was told the next one is the budget's last."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def last_evaluation(self) -> None:
        self.events.append("last")

    def evaluate(self, candidate: Candidate) -> Evaluation:
        self.events.append(candidate.code)
        return super().evaluate(candidate)


@pytest.mark.parametrize("search", [GreedySearch, MCTS])
def test_the_evaluator_hears_once_right_before_the_budgets_last_evaluation(search) -> None:  # noqa: ANN001
    evaluator = LastTold()
    search().run(Scripted(["1.0", "1.5", "1.2"]), evaluator, "3")
    assert evaluator.events == ["1.0#1", "1.5#2", "last", "1.2#3"]


def test_a_budget_of_time_alone_never_says_last() -> None:
    # Whether an evaluation is the last of a time budget is not known before it runs.
    evaluator = LastTold()
    GreedySearch().run(Scripted(["1.0", "1.5"]), evaluator, "1h")
    assert "last" not in evaluator.events
