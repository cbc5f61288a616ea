"""Replaying a recorded trajectory without a model or a GPU: the test suite's stand-ins for a
`CandidateGenerator` and an `Evaluator` (moved out of the package, which never replays)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation, Mode
from pytest_kernelpro.optimize.search.trajectory import Trajectory, load_trajectory


class RecordedNode(NamedTuple):
    """One node of a trajectory, as `replay` yields it."""

    id: int
    parent: int
    mode: Mode
    candidate: Candidate
    evaluation: Evaluation
    reward: float


def replay(path: str | os.PathLike[str] | Trajectory) -> Iterator[RecordedNode]:
    """Yield the recorded nodes of a trajectory in the order they were evaluated."""
    trajectory = path if isinstance(path, Trajectory) else load_trajectory(path)
    for record in trajectory.nodes:
        yield RecordedNode(
            id=int(record["id"]),
            parent=int(record["parent"]),
            mode=record["mode"],
            candidate=Candidate.from_dict(record),
            evaluation=Evaluation.from_dict(record),
            reward=float(record["reward"]),
        )


class ReplayGenerator:
    """A `CandidateGenerator` that serves the candidates of a trajectory in recorded order.

    With the same algorithm and seed, and `ReplayEvaluator`, it reproduces the recorded
    search without an LLM or a GPU. When the recorded candidates run out it returns none,
    which ends the search.
    """

    def __init__(self, path: str | os.PathLike[str] | Trajectory) -> None:
        self._queue = [node.candidate for node in replay(path)]

    def generate(
        self,
        mode: Mode,
        parent: Candidate | None,
        evaluation: Evaluation | None,
        *,
        max_candidates: int = 1,
    ) -> list[Candidate]:
        """The next recorded candidates (at most `max_candidates`)."""
        taken, self._queue = self._queue[:max_candidates], self._queue[max_candidates:]
        return taken


class ReplayEvaluator:
    """An `Evaluator` that returns the recorded evaluation of a candidate's code."""

    def __init__(self, path: str | os.PathLike[str] | Trajectory) -> None:
        self._by_code = {node.candidate.code: node.evaluation for node in replay(path)}

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """The recorded evaluation; a candidate never recorded is a run error."""
        recorded = self._by_code.get(candidate.code)
        if recorded is None:
            return Evaluation(status="run_error", reason="candidate not in the replayed trajectory")
        return Evaluation.from_dict(recorded.to_dict())
