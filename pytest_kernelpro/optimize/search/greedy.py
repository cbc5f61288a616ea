"""Greedy search, the ablation baseline of MCTS (same generator, evaluator and budget).

Policy: always refine the best correct solution found so far (mode "optimize"); while
nothing is correct yet, debug the most recent failure (mode "debug"); at the very start,
write a seed (mode "initial"). It never goes back to ROOT once it has a node, so it commits
to the first basin that yields a correct solution: the behaviour the seed's ablation
measures against MCTS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.search.engine import SearchAlgorithm

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.reward import RewardConfig
    from pytest_kernelpro.optimize.search.tree import SearchNode


class GreedySearch(SearchAlgorithm):
    """Refine the best so far; debug the last failure while nothing is correct."""

    name = "greedy"

    def __init__(
        self,
        *,
        candidates_per_step: int = 1,
        reward: RewardConfig | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(reward=reward, seed=seed)
        if candidates_per_step < 1:
            raise KernelproConfigError(
                f"Invalid greedy candidates_per_step={candidates_per_step!r}: it must be >= 1."
            )
        self.candidates_per_step = candidates_per_step

    def config_dict(self) -> dict[str, Any]:
        """Greedy settings, for the trajectory header."""
        return {"seed": self.seed, "candidates_per_step": self.candidates_per_step}

    def select(self) -> SearchNode:
        """The best correct node, else the last evaluated node, else ROOT."""
        best = self.tree.best()
        if best is not None:
            return best
        evaluated = self.tree.evaluated()
        return evaluated[-1] if evaluated else self.tree.root

    def slots(self, node: SearchNode) -> int:
        """`candidates_per_step` children per step."""
        return self.candidates_per_step
