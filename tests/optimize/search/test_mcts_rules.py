"""MCTS rules: widening, the virtual child, ROOT re-expansion, dead ends, backpropagation."""

from __future__ import annotations

import math

import pytest

from pytest_kernelpro.errors import KernelproConfigError, KernelproError, KernelproWarning
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig
from pytest_kernelpro.optimize.search.reward import compute_reward
from pytest_kernelpro.optimize.search.tree import SearchNode

C = math.sqrt(2.0)


def outcome(spec: str) -> Evaluation:
    """'1.5' is a correct candidate with that speedup; anything else is that status."""
    try:
        return Evaluation(status="correct", speedup=float(spec))
    except ValueError:
        return Evaluation(status=spec, reason=f"scripted {spec}")


class CodeEvaluator:
    """The candidate's code is its outcome spec (see `outcome`), optionally '#n'-tagged."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def evaluate(self, candidate: Candidate) -> Evaluation:
        self.seen.append(candidate.code)
        return outcome(candidate.code.split("#")[0])


class Scripted:
    """Serves outcome specs in order; records every call's mode and parent."""

    def __init__(self, specs: list[str]) -> None:
        self.specs = list(specs)
        self.calls: list[tuple[str, str | None, str | None, int]] = []
        self.count = 0

    def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
        self.calls.append(
            (
                mode,
                parent.code if parent else None,
                evaluation.status if evaluation else None,
                max_candidates,
            )
        )
        out = []
        for _ in range(max_candidates):
            if not self.specs:
                break
            self.count += 1
            out.append(Candidate(code=f"{self.specs.pop(0)}#{self.count}"))
        return out


def add(mcts: MCTS, parent: SearchNode, spec: str) -> SearchNode:
    """Attach an evaluated child the way the run loop does (reward, backprop, marking)."""
    node = mcts.expand(parent, Candidate(code=spec), outcome(spec))
    mcts.backpropagate(node)
    return node


# ----- progressive widening -----


@pytest.mark.parametrize(
    ("kind_spec", "visits", "expected"),
    [
        (None, 0, 2),
        (None, 1, 2),
        (None, 2, 2),
        (None, 3, 3),
        (None, 4, 4),
        (None, 9, 6),
        ("wrong", 1, 2),
        ("build_error", 4, 4),
        ("timeout", 9, 6),
        ("cheat", 16, 8),
        ("1.0", 1, 3),
        ("1.0", 2, 4),
        ("1.0", 4, 6),
        ("1.0", 9, 9),
        ("1.0", 16, 12),
    ],
)
def test_widening_limit_by_status(kind_spec: str | None, visits: int, expected: int) -> None:
    mcts = MCTS()
    node = mcts.tree.root if kind_spec is None else add(mcts, mcts.tree.root, kind_spec)
    node.visits = visits
    assert mcts.max_children(node) == expected
    assert mcts.max_children(node) == max(
        1, math.floor(mcts.widening_constant(node) * max(visits, 1) ** 0.5 + 1e-9)
    )


def test_widening_constants_follow_the_node() -> None:
    mcts = MCTS()
    assert mcts.widening_constant(mcts.tree.root) == 2.0
    assert mcts.widening_constant(add(mcts, mcts.tree.root, "run_error")) == 2.0
    assert mcts.widening_constant(add(mcts, mcts.tree.root, "1.2")) == 3.0


def test_slots_are_capped_by_the_widening_room() -> None:
    mcts = MCTS(MCTSConfig(candidates_per_expansion=5))
    root = mcts.tree.root
    assert mcts.slots(root) == 2  # N = 0: two seeds allowed
    seed = add(mcts, root, "1.0")
    assert mcts.slots(seed) == 3  # a correct leaf with N = 1: 3 children
    assert MCTS().slots(seed) == 1  # default: one candidate per expansion


def test_widening_gates_expansion_even_when_the_virtual_child_wins() -> None:
    mcts = MCTS()
    root = mcts.tree.root
    a, b = add(mcts, root, "0.5"), add(mcts, root, "0.5")
    # ROOT: N = 2, two children, limit floor(2·√2) = 2.
    assert mcts.virtual_uct(root) > max(mcts.uct(a), mcts.uct(b))
    assert not mcts.can_widen(root)
    decision, child = mcts.decide(root)
    assert decision == "descend"
    assert child in (a, b)


# ----- the virtual child -----


def test_virtual_child_uses_parent_mean_and_a_fair_share_of_visits() -> None:
    mcts = MCTS()
    s = add(mcts, mcts.tree.root, "1.6487212707")  # ln = 0.5
    f = add(mcts, s, "build_error")  # reward -3
    assert s.visits == 2
    assert s.Q == pytest.approx((0.5 - 3.0) / 2)
    assert mcts.fair_share(s) == pytest.approx(2 / 2)  # N / (k + 1), k = 1 child
    expected_virtual = -1.25 + C * math.sqrt(math.log(2) / 1.0)
    expected_child = -3.0 + C * math.sqrt(math.log(2) / 1)
    assert mcts.virtual_uct(s) == pytest.approx(expected_virtual)
    assert mcts.uct(f) == pytest.approx(expected_child)
    assert mcts.decide(s) == ("expand", None)  # -0.073 beats -1.823: try another refinement


def test_a_better_child_is_descended_into() -> None:
    mcts = MCTS()
    s = add(mcts, mcts.tree.root, "1.6487212707")  # ln = 0.5
    better = add(mcts, s, "2.7182818285")  # ln = 1.0
    assert mcts.virtual_uct(s) == pytest.approx(0.75 + C * math.sqrt(math.log(2)))
    assert mcts.uct(better) == pytest.approx(1.0 + C * math.sqrt(math.log(2)))
    assert mcts.decide(s) == ("descend", better)


def test_a_worse_child_makes_the_parent_expand() -> None:
    mcts = MCTS()
    s = add(mcts, mcts.tree.root, "1.6487212707")  # ln = 0.5
    add(mcts, s, "1.2214027582")  # ln = 0.2: Q(s) = 0.35 > 0.2
    assert mcts.decide(s) == ("expand", None)


def test_fair_share_with_more_children() -> None:
    mcts = MCTS()
    root = mcts.tree.root
    for _ in range(3):
        add(mcts, root, "1.0")
    root.visits = 12
    assert mcts.fair_share(root) == 3.0  # 12 / (3 + 1)
    assert mcts.virtual_uct(root) == pytest.approx(root.Q + C * math.sqrt(math.log(12) / 3.0))


def test_unvisited_root_always_expands() -> None:
    mcts = MCTS()
    assert mcts.virtual_uct(mcts.tree.root) == math.inf
    assert mcts.select() is mcts.tree.root


# ----- ROOT re-expansion and modes -----


def test_root_is_re_expanded_with_fresh_seeds() -> None:
    gen = Scripted(["build_error", "build_error", "wrong", "1.5"])
    MCTS(seed=0).run(gen, CodeEvaluator(), "4")
    modes = [call[0] for call in gen.calls]
    # seed fails → ROOT: N=1, tie (virtual −3 vs child −3) → descend, debug the leaf;
    # then ROOT: N=2, virtual −3+√2·√(ln2/1) = −1.82 beats the child's −3+√2·√(ln2/2) → seed.
    assert modes[:3] == ["initial", "debug", "initial"]
    for mode, parent, status, _ in gen.calls:
        if mode == "initial":
            assert parent is None
            assert status is None


def test_modes_follow_the_node_status() -> None:
    specs = ["wrong", "1.2", "run_error", "1.4", "timeout", "2.0", "cheat", "1.1"] * 4
    gen = Scripted(specs)
    MCTS(seed=3).run(gen, CodeEvaluator(), "30")
    assert {call[0] for call in gen.calls} == {"initial", "debug", "optimize"}
    for mode, _, status, _ in gen.calls:
        expected = {None: "initial", "correct": "optimize"}.get(status, "debug")
        assert mode == expected


def test_root_is_forced_open_when_every_seed_is_dead() -> None:
    mcts = MCTS(MCTSConfig(c_pw_root=0.5))  # ROOT: at most floor(0.5·√N) (min 1) children
    root = mcts.tree.root
    seed = add(mcts, root, "wrong")
    for _ in range(3):
        add(mcts, seed, "build_error")
    assert seed.terminal
    assert root.visits == 4
    assert not mcts.can_widen(root)  # the gate is closed, yet ROOT is never exhausted
    assert mcts.decide(root) == ("expand", None)
    assert mcts.select() is root


# ----- backpropagation -----


def test_backpropagation_updates_every_ancestor() -> None:
    mcts = MCTS()
    root = mcts.tree.root
    a = add(mcts, root, "2.0")
    b = add(mcts, a, "wrong")
    c = add(mcts, b, "4.0")
    rewards = [math.log(2.0), -2.0, math.log(4.0)]
    assert (root.visits, a.visits, b.visits, c.visits) == (3, 3, 2, 1)
    assert root.reward_sum == pytest.approx(sum(rewards))
    assert a.Q == pytest.approx(sum(rewards) / 3)
    assert b.Q == pytest.approx((-2.0 + math.log(4.0)) / 2)
    assert c.reward == pytest.approx(compute_reward(outcome("4.0")))
    assert mcts.tree.best() is c
    assert c.path() == [root, a, b, c]


# ----- terminal marking and exhaustion -----


def test_failed_node_with_three_failed_repairs_is_terminal() -> None:
    mcts = MCTS()
    f = add(mcts, mcts.tree.root, "wrong")
    add(mcts, f, "build_error")
    add(mcts, f, "wrong")
    assert not f.terminal
    add(mcts, f, "timeout")
    assert f.terminal
    assert f.dead


def test_a_successful_repair_keeps_the_node_alive() -> None:
    mcts = MCTS()
    f = add(mcts, mcts.tree.root, "wrong")
    add(mcts, f, "build_error")
    add(mcts, f, "1.1")
    add(mcts, f, "wrong")
    add(mcts, f, "wrong")
    assert not f.terminal


def test_a_correct_grandchild_keeps_the_node_alive() -> None:
    mcts = MCTS()
    f = add(mcts, mcts.tree.root, "wrong")
    g = add(mcts, f, "build_error")
    add(mcts, g, "1.3")  # the repair of the repair works
    add(mcts, f, "wrong")
    add(mcts, f, "wrong")
    assert not f.terminal


def test_terminal_after_is_an_option() -> None:
    mcts = MCTS(MCTSConfig(terminal_after=1))
    f = add(mcts, mcts.tree.root, "wrong")
    add(mcts, f, "wrong")
    assert f.terminal


def test_exhaustion_propagates_up_the_tree() -> None:
    # Narrow widening so that nodes close: at most floor(0.5·√N) (min 1) children.
    mcts = MCTS(MCTSConfig(c_pw_failed=0.5, c_pw_success=0.5))
    root = mcts.tree.root
    s = add(mcts, root, "1.5")
    f1 = add(mcts, s, "wrong")
    f2 = add(mcts, f1, "wrong")
    for _ in range(3):
        add(mcts, f2, "build_error")
    assert f2.terminal
    assert f1.exhausted
    assert not f1.terminal
    assert s.exhausted  # and so on up to ROOT's child
    assert not root.exhausted
    assert not root.terminal
    assert mcts.select() is root  # the dead branch is never selected again


def test_dead_children_are_excluded_from_selection() -> None:
    mcts = MCTS(seed=1)
    root = mcts.tree.root
    dead = add(mcts, root, "wrong")
    for _ in range(3):
        add(mcts, dead, "wrong")
    alive = add(mcts, root, "1.2")
    for _ in range(20):
        node = mcts.select()
        assert node is not dead
        assert dead not in node.path()
        add(mcts, node, "1.1")
    assert alive.visits > 1


# ----- the run loop -----


def test_runs_are_deterministic_given_the_seed() -> None:
    specs = ["wrong", "1.2", "run_error", "1.4", "timeout", "2.0", "cheat", "1.1", "0.9"] * 3

    def shape(seed: int) -> list[tuple[int, int, str]]:
        result = MCTS(seed=seed).run(Scripted(specs), CodeEvaluator(), "25")
        return [(n.id, n.parent.id, n.mode) for n in result.nodes]

    assert shape(7) == shape(7)


def test_budget_stops_the_search_and_the_result_reports_it() -> None:
    result = MCTS().run(Scripted(["1.5"] * 50), CodeEvaluator(), "7")
    assert result.evaluations == 7
    assert len(result.nodes) == 7
    assert result.stop_reason == "evaluation budget spent (7/7)"
    assert result.best is not None
    assert result.best_speedup == 1.5
    assert result.root.visits == 7


def test_api_budget_counts_generation_cost() -> None:
    class Costly(Scripted):
        def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
            return [
                Candidate(code=c.code, cost_usd=0.4)
                for c in super().generate(mode, parent, evaluation, max_candidates=max_candidates)
            ]

    result = MCTS().run(Costly(["1.0"] * 10), CodeEvaluator(), "$1")
    assert result.evaluations == 3  # $0.4 + $0.4 + $0.4 passes $1 after the third
    assert result.usd == pytest.approx(1.2)
    assert result.stop_reason.startswith("API budget spent")


def test_time_budget_uses_the_injected_clock() -> None:
    now = [0.0]

    class SlowEvaluator(CodeEvaluator):
        def evaluate(self, candidate: Candidate) -> Evaluation:
            now[0] += 25.0
            return super().evaluate(candidate)

    result = MCTS().run(Scripted(["1.0"] * 10), SlowEvaluator(), "60s", clock=lambda: now[0])
    assert result.evaluations == 3
    assert result.stop_reason.startswith("time budget spent")


def test_extra_candidates_beyond_the_widening_room_are_ignored() -> None:
    class Greedy(Scripted):
        def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
            return super().generate(mode, parent, evaluation, max_candidates=5)

    gen = Greedy(["1.0"] * 20)
    result = MCTS().run(gen, CodeEvaluator(), "1")
    assert len(result.nodes) == 1
    assert gen.calls[0][3] == 5


def test_a_raising_evaluator_fails_only_that_candidate() -> None:
    class Flaky(CodeEvaluator):
        def evaluate(self, candidate: Candidate) -> Evaluation:
            if candidate.code.endswith("#2"):
                raise OSError("disk full")
            return super().evaluate(candidate)

    with pytest.warns(KernelproWarning, match="evaluator raised OSError: disk full"):
        result = MCTS().run(Scripted(["1.0"] * 5), Flaky(), "4")
    assert [n.evaluation.status for n in result.nodes].count("run_error") == 1
    assert result.evaluations == 4


def test_a_problem_error_from_the_evaluator_ends_the_search() -> None:
    class BrokenReference(CodeEvaluator):
        def evaluate(self, candidate: Candidate) -> Evaluation:
            raise KernelproError("The reference of task 'x' failed in the sandbox")

    with pytest.raises(KernelproError, match="reference of task 'x' failed"):
        MCTS().run(Scripted(["1.0"] * 3), BrokenReference(), "3")


def test_a_raising_generator_stops_the_search_with_what_it_found() -> None:
    class Outage(Scripted):
        def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
            if self.count >= 2:
                raise ConnectionError("API unreachable")
            return super().generate(mode, parent, evaluation, max_candidates=max_candidates)

    with pytest.warns(KernelproWarning, match="generator raised ConnectionError"):
        result = MCTS().run(Outage(["1.3"] * 5), CodeEvaluator(), "10")
    assert len(result.nodes) == 2
    assert result.best_speedup == 1.3
    assert result.stop_reason == "generator raised ConnectionError: API unreachable"


def test_an_empty_generation_ends_the_search() -> None:
    result = MCTS().run(Scripted([]), CodeEvaluator(), "10")
    assert result.nodes == ()
    assert result.best is None
    assert result.stop_reason == "generator returned no candidates for mode 'initial'"


@pytest.mark.parametrize(
    "kwargs", [{"c_uct": 0.0}, {"alpha": -1.0}, {"c_pw_root": math.nan}, {"terminal_after": 0}]
)
def test_bad_mcts_settings_are_rejected(kwargs: dict) -> None:
    with pytest.raises(KernelproConfigError, match=next(iter(kwargs))):
        MCTSConfig(**kwargs)
