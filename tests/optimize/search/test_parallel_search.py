"""Several expansions in flight (optimize/search/parallel.py), with an in-process evaluator whose
evaluations wait for each other: no cluster, no timing thresholds. Overlap is proven by a
barrier that only opens when two evaluations run at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.search.greedy import GreedySearch
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig
from pytest_kernelpro.optimize.search.restore import restore_search
from pytest_kernelpro.optimize.search.trajectory import load_trajectory

WAIT_S = 60.0  # generous: a loaded 2-core machine; the tests never wait this long when green


class NumberedGenerator:
    """Candidates "c1", "c2", ... in the order asked for."""

    def __init__(self) -> None:
        self.count = 0
        self.asked: list[int] = []  # the node each call was for

    def at_node(self, node_id: int) -> None:
        self.asked.append(node_id)

    def generate(self, mode, parent, evaluation, *, max_candidates=1):
        out = []
        for _ in range(max_candidates):
            self.count += 1
            out.append(Candidate(code=f"c{self.count}", strategy=f"candidate {self.count}"))
        return out


class GatedEvaluator:
    """Evaluations that record who ran at once; `speedups` decides each result."""

    def __init__(self, algorithm, speedups=None, barrier_parties: int = 0) -> None:
        self.algorithm = algorithm
        self.speedups = speedups or {}
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.barrier = threading.Barrier(barrier_parties) if barrier_parties else None
        self.seen_pending: list[int] = []  # pending children in the tree while one ran
        self.seen_virtual: list[int] = []  # ROOT's virtual visits then
        self.gates: dict[str, threading.Event] = {}

    def evaluate(self, candidate: Candidate) -> Evaluation:
        from pytest_kernelpro.optimize.search.parallel import released

        # Under the loop's lock here: the tree may be read.
        self.seen_pending.append(sum(n.pending for n in self.algorithm.tree.nodes))
        self.seen_virtual.append(self.algorithm.tree.root.virtual)
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            with released():  # what a remote evaluator does while it waits
                if self.barrier is not None:
                    try:
                        self.barrier.wait(timeout=WAIT_S)
                    except threading.BrokenBarrierError:
                        pass  # the last candidates have no partner left
                gate = self.gates.get(candidate.code)
                if gate is not None:
                    assert gate.wait(WAIT_S), f"{candidate.code} never released"
        finally:
            with self.lock:
                self.running -= 1
        speedup = self.speedups.get(candidate.code, 1.0)
        if speedup is None:
            return Evaluation(status="wrong", reason="wrong")
        return Evaluation(status="correct", speedup=speedup)


class TreeHas:
    """A gate that opens once a candidate is recorded in the search tree."""

    def __init__(self, algorithm, code: str) -> None:
        self.algorithm, self.code = algorithm, code

    def wait(self, timeout: float) -> bool:
        done = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if any(n.candidate.code == self.code for n in self.algorithm.tree.evaluated()):
                return True
            done.wait(0.01)
        return False


def test_two_evaluations_run_at_once_and_the_evaluation_budget_is_never_exceeded(
    tmp_path: Path,
) -> None:
    algorithm = MCTS()
    evaluator = GatedEvaluator(algorithm, barrier_parties=2)
    result = algorithm.run(
        NumberedGenerator(), evaluator, "6", trajectory=tmp_path / "t.jsonl", in_flight=2
    )
    assert result.stop_reason == "evaluation budget spent (6/6)"
    assert len(result.nodes) == 6
    assert len(evaluator.seen_pending) == 6  # no evaluation started beyond the budget
    # The barrier of two opened: two evaluations were running at the same moment, and never
    # more than the two allowed.
    assert evaluator.most == 2
    assert not evaluator.barrier.broken
    # Pending children were visible to the search while evaluations ran; none are left.
    assert max(evaluator.seen_pending) == 2
    assert max(evaluator.seen_virtual) == 2
    assert all(n.pending == 0 for n in algorithm.tree.nodes)
    assert algorithm.in_flight == 0
    # Virtual visits were all taken back: ROOT's visits are the evaluations, its reward sum
    # the real rewards.
    root = algorithm.tree.root
    assert (root.visits, root.virtual, root.virtual_reward) == (6, 0, 0.0)
    assert root.reward_sum == pytest.approx(sum(n.reward for n in result.nodes))


def test_results_arrive_out_of_order_and_the_trajectory_rebuilds_the_same_tree(
    tmp_path: Path,
) -> None:
    algorithm = MCTS(MCTSConfig(candidates_per_expansion=1))
    evaluator = GatedEvaluator(algorithm, speedups={"c1": 2.0, "c2": None, "c3": 1.5})
    # c1 finishes only once c2 is in the tree: c2 becomes node 1, c1 node 2.
    evaluator.gates["c1"] = TreeHas(algorithm, "c2")
    path = tmp_path / "t.jsonl"
    result = algorithm.run(NumberedGenerator(), evaluator, "5", trajectory=path, in_flight=2)
    by_code = {n.candidate.code: n for n in result.nodes}
    assert result.nodes[0].candidate.code == "c2"  # sent second, back first: node 1
    assert by_code["c1"].id > by_code["c2"].id
    assert by_code["c2"].evaluation.metrics["in_flight"] == {"submitted": 2, "alongside": 1}
    assert by_code["c1"].evaluation.metrics["in_flight"]["submitted"] == 1

    # The file rebuilds the tree as it ended: parents, visits and reward sums.
    restored = restore_search(load_trajectory(path))
    assert _shape(restored.tree.nodes) == _shape(algorithm.tree.nodes)

    # And a resumed search continues it under the same budget.
    resumed = MCTS(MCTSConfig(candidates_per_expansion=1))
    more = resumed.run(
        NumberedGenerator(), GatedEvaluator(resumed), "7", trajectory=path, resume=True,
        in_flight=2,
    )  # fmt: skip
    assert more.evaluations == 7
    assert len(load_trajectory(path).nodes) == 7


def _shape(nodes) -> dict[int, tuple]:
    return {n.id: (n.parent.id if n.parent else None, n.visits, n.reward_sum) for n in nodes}


def test_virtual_visits_send_the_second_worker_elsewhere() -> None:
    """While ROOT's first seed is pending, the second selection does not wait for it: the
    pending child takes a widening slot and a virtual visit, so ROOT is expanded again."""
    algorithm = MCTS()
    generator = NumberedGenerator()
    evaluator = GatedEvaluator(algorithm, barrier_parties=2)
    algorithm.run(generator, evaluator, "2", in_flight=2)
    assert generator.asked == [0, 0]  # two seeds, both in flight at once
    assert evaluator.most == 2
    assert [n.parent.id for n in algorithm.tree.evaluated()] == [0, 0]


def test_a_node_with_a_pending_child_is_not_a_dead_end() -> None:
    algorithm = MCTS(MCTSConfig(terminal_after=1))
    failed = algorithm.tree.add(
        algorithm.tree.root, Candidate("bad"), Evaluation(status="wrong"), -2.0
    )
    algorithm.backpropagate(failed)
    repair = algorithm.tree.add(failed, Candidate("fix1"), Evaluation(status="wrong"), -2.0)
    failed.pending = 1  # a second repair is still being evaluated
    algorithm.backpropagate(repair)
    assert not failed.terminal
    failed.pending = 0
    algorithm.on_backpropagated(repair)
    assert failed.terminal


def test_greedy_search_runs_in_flight_too(tmp_path: Path) -> None:
    algorithm = GreedySearch()
    evaluator = GatedEvaluator(algorithm, barrier_parties=2)
    result = algorithm.run(NumberedGenerator(), evaluator, "4", in_flight=2)
    assert len(result.nodes) == 4
    assert evaluator.most == 2


def test_a_broken_reference_still_ends_the_search() -> None:
    class Broken:
        def evaluate(self, candidate: Candidate) -> Evaluation:
            raise KernelproError("the reference fails in a trusted process")

    with pytest.raises(KernelproError, match="reference fails"):
        MCTS().run(NumberedGenerator(), Broken(), "4", in_flight=2)


def test_the_time_budget_stops_new_work_and_keeps_what_ran() -> None:
    """A clock that moves only when an evaluation ends: two at a time, 10 s each."""
    now = [0.0]
    algorithm = MCTS()
    evaluator = GatedEvaluator(algorithm, barrier_parties=2)
    original = evaluator.evaluate

    def evaluate(candidate: Candidate) -> Evaluation:
        evaluation = original(candidate)
        now[0] += 10.0
        return evaluation

    evaluator.evaluate = evaluate  # type: ignore[method-assign]
    generator = NumberedGenerator()
    result = algorithm.run(generator, evaluator, "25s", clock=lambda: now[0], in_flight=2)
    # 0 s: c1 and c2 run; 20 s: both back, time left, c3 and c4 run; 40 s: spent. Both
    # running evaluations finished and were recorded, none was started after.
    assert result.stop_reason.startswith("time budget spent")
    assert sorted(n.candidate.code for n in result.nodes) == ["c1", "c2", "c3", "c4"]
    assert generator.count == 4
