"""The loop every search algorithm shares: select → generate → simulate → expand → backpropagate.

An algorithm (MCTS, greedy) only decides which node to work on next (`select`) and how many
children it may get (`slots`); this module asks the generator for candidates in the node's
mode, evaluates them, attaches them with their reward, propagates statistics, records every
node in the trajectory as soon as it exists, and stops when the budget ends.
"""

from __future__ import annotations

import random
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.optimize.search.budget import Budget, BudgetTracker, parse_budget
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.reward import RewardConfig, compute_reward
from pytest_kernelpro.optimize.search.tree import SearchNode, SearchResult, SearchTree

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.interfaces import CandidateGenerator, Evaluator, Mode
    from pytest_kernelpro.optimize.search.trajectory import Trajectory


class SearchAlgorithm(ABC):
    """Base of MCTS and greedy search: the tree, the reward, the run loop, resume."""

    name: ClassVar[str] = "search"

    def __init__(self, *, reward: RewardConfig | None = None, seed: int = 0) -> None:
        self.reward_config = reward or RewardConfig()
        self.seed = seed
        self.tree = SearchTree()
        # Used only to break exact ties between equally scored nodes, so that a search is a
        # deterministic function of its seed (and of the generator and evaluator).
        self.rng = random.Random(seed)
        # Evaluations running now (several expansions in flight, optimize/search/parallel.py); 0 in
        # the one-at-a-time loop.
        self.in_flight = 0

    # ----- the algorithm's decisions -----

    @abstractmethod
    def select(self) -> SearchNode:
        """The node to expand next (ROOT means: generate fresh seed solutions)."""

    def slots(self, node: SearchNode) -> int:
        """How many children `node` may get in this step (at least 1)."""
        return 1

    def room(self, node: SearchNode) -> int:
        """Children `node` may get now, counting those still being evaluated; with
        expansions in flight, a selected node without room waits for a result."""
        return self.slots(node)

    def on_backpropagated(self, node: SearchNode) -> None:  # noqa: B027 - optional hook
        """Hook after a new node's statistics reached ROOT (MCTS marks dead ends here)."""

    def config_dict(self) -> dict[str, Any]:
        """The algorithm's settings, for the trajectory header."""
        return {"seed": self.seed}

    # ----- the four steps -----

    def simulate(self, evaluator: Evaluator, candidate: Candidate) -> Evaluation:
        """Evaluate one candidate. An evaluator that raises fails only that candidate,
        except with `KernelproError`: a problem no candidate can fix (a broken reference),
        which ends the search."""
        start = time.perf_counter()
        try:
            evaluation = evaluator.evaluate(candidate)
        except (KeyboardInterrupt, SystemExit, KernelproError):
            raise
        except Exception as exc:  # a bug in the evaluator must not end the search
            warnings.warn(
                f"kernelpro search: the evaluator raised {type(exc).__name__}: {exc}; "
                "the candidate is recorded as a run error.",
                KernelproWarning,
                stacklevel=2,
            )
            evaluation = Evaluation(
                status="run_error",
                reason=f"evaluator raised {type(exc).__name__}: {exc}",
            )
        if not evaluation.wall_s:
            evaluation.wall_s = time.perf_counter() - start
        return evaluation

    def expand(
        self,
        node: SearchNode,
        candidate: Candidate,
        evaluation: Evaluation,
        *,
        mode: Mode | None = None,
        node_id: int | None = None,
    ) -> SearchNode:
        """Attach an evaluated candidate as a child of `node`, with its reward."""
        reward = compute_reward(evaluation, self.reward_config)
        return self.tree.add(node, candidate, evaluation, reward, mode=mode, node_id=node_id)

    def backpropagate(self, node: SearchNode) -> None:
        """Propagate a new node's visit and reward to ROOT, then run the algorithm's hook."""
        self.tree.backpropagate(node)
        self.on_backpropagated(node)

    # ----- running and resuming -----

    def reset(self) -> None:
        """Forget the tree (a fresh search)."""
        self.tree = SearchTree()
        self.rng = random.Random(self.seed)

    def restore(self, trajectory: Trajectory) -> None:
        """Rebuild the tree and its statistics from a loaded trajectory."""
        self.reset()
        for record in trajectory.nodes:
            parent = self.tree.get(int(record["parent"]))
            node = self.tree.add(
                parent,
                Candidate.from_dict(record),
                Evaluation.from_dict(record),
                float(record["reward"]),
                mode=record.get("mode"),
                node_id=int(record["id"]),
            )
            node.elapsed_s = float(record.get("elapsed_s") or 0.0)
            self.backpropagate(node)
        # Re-seed from the number of nodes so that a resumed search is deterministic too.
        self.rng = random.Random(f"{self.seed}:{len(self.tree.nodes)}")

    def run(
        self,
        generator: CandidateGenerator,
        evaluator: Evaluator,
        budget: Budget | str,
        *,
        trajectory: str | Path | None = None,
        resume: bool = False,
        clock: Callable[[], float] = time.monotonic,
        meta: Mapping[str, Any] | None = None,
        in_flight: int = 1,
    ) -> SearchResult:
        """Search until the budget ends; return the best node and the whole tree.

        With `trajectory`, every node is appended to that JSONL file as soon as it is
        evaluated. `resume=True` continues the search recorded there (tree, statistics and
        spent budget; the budget counts the whole search, earlier sessions included); a
        missing file starts a fresh search. Without `resume`, an existing file is an error
        rather than silently overwritten.

        `in_flight` > 1 keeps that many evaluations running at once (`optimize/search/parallel.py`:
        virtual visits on pending children, results taken in the order they arrive, for an
        evaluator that runs candidates elsewhere, such as `search.distributed.DaskEvaluator`).
        """
        from pytest_kernelpro.optimize.search.trajectory import (
            TrajectoryWriter,
            header_record,
            load_trajectory,
        )

        if isinstance(budget, str):
            budget = parse_budget(budget)
        path = None if trajectory is None else Path(trajectory)
        writer: TrajectoryWriter | None = None
        tracker = BudgetTracker(budget, clock=clock)
        if path is not None and path.exists():
            if not resume:
                raise KernelproError(
                    f"Trajectory {path} already exists; pass resume=True to continue that "
                    "search, or choose another path for a new one."
                )
            loaded = load_trajectory(path)
            recorded = loaded.header.get("algorithm")
            if recorded != self.name:
                raise KernelproError(
                    f"Trajectory {path} was written by {recorded!r}, not {self.name!r}; "
                    f"resume it with the same algorithm or start a new trajectory."
                )
            self.restore(loaded)
            tracker = BudgetTracker(
                budget,
                clock=clock,
                spent_evaluations=len(loaded.nodes),
                spent_seconds=loaded.spent_seconds,
                spent_usd=loaded.spent_usd,
            )
            writer = TrajectoryWriter.reopen(loaded)
        else:
            self.reset()
            if path is not None:
                header = header_record(self.name, self.config_dict(), self.reward_config, budget)
                if meta:
                    header["meta"] = dict(meta)
                writer = TrajectoryWriter.create(path, header)

        tracker.start()
        if in_flight > 1:
            from pytest_kernelpro.optimize.search.parallel import run_in_flight

            stop_reason = run_in_flight(
                self, generator, evaluator, tracker, writer, in_flight=in_flight
            )
        else:
            stop_reason = self._loop(generator, evaluator, tracker, writer)
        best = self.tree.best()
        return SearchResult(
            best=best,
            best_speedup=None if best is None else best.speedup,
            root=self.tree.root,
            nodes=tuple(self.tree.evaluated()),
            stop_reason=stop_reason,
            evaluations=tracker.evaluations,
            seconds=tracker.seconds,
            usd=tracker.usd,
            trajectory=path,
        )

    def _loop(
        self,
        generator: CandidateGenerator,
        evaluator: Evaluator,
        tracker: BudgetTracker,
        writer: Any,
    ) -> str:
        while True:
            reason = tracker.exhausted()
            if reason:
                return reason
            node = self.select()
            slots = self.slots(node)
            # A generator that wants to know the node (to name it in errors) says so.
            at_node = getattr(generator, "at_node", None)
            if callable(at_node):
                at_node(node.id)
            try:
                candidates = list(
                    generator.generate(
                        node.child_mode, node.candidate, node.evaluation, max_candidates=slots
                    )
                )
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # e.g. an API outage: keep what was found so far
                warnings.warn(
                    f"kernelpro search stopped: the candidate generator raised "
                    f"{type(exc).__name__}: {exc}. The trajectory can be resumed.",
                    KernelproWarning,
                    stacklevel=3,
                )
                return f"generator raised {type(exc).__name__}: {exc}"
            # Every generated candidate was paid for, even one dropped beyond `slots`.
            tracker.add_cost(sum(c.cost_usd for c in candidates))
            if not candidates:
                return f"generator returned no candidates for mode {node.child_mode!r}"
            # An evaluator that can build ahead (SandboxEvaluator.prepare) compiles the
            # siblings on the CPU cores while the first ones run on the GPU.
            prepare = getattr(evaluator, "prepare", None)
            if callable(prepare):
                prepare(candidates[:slots])
            for candidate in candidates[:slots]:
                # Candidates already paid for are still evaluated when only the API budget
                # ran out; evaluations and wall time stop them.
                reason = tracker.exhausted(("evaluations", "seconds"))
                if reason:
                    return reason
                if tracker.one_evaluation_left():
                    # An evaluator that starts processes ahead for the next evaluation
                    # (`SandboxEvaluator.last_evaluation`) starts none after this one.
                    last = getattr(evaluator, "last_evaluation", None)
                    if callable(last):
                        last()
                evaluation = self.simulate(evaluator, candidate)
                child = self.expand(node, candidate, evaluation)
                self.backpropagate(child)
                tracker.record_evaluation()
                child.elapsed_s = tracker.seconds
                if writer is not None:
                    writer.append_node(child)
