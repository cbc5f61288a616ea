"""The optimizer's engine: MCTS and greedy search, reward, budget, sandboxed evaluator,
trajectories. Nothing here imports torch at import time (the worker side does, in its own
process)."""

from __future__ import annotations

from pytest_kernelpro.optimize.search.budget import Budget, BudgetError, BudgetTracker, parse_budget
from pytest_kernelpro.optimize.search.greedy import GreedySearch
from pytest_kernelpro.optimize.search.interfaces import (
    Candidate,
    CandidateGenerator,
    Evaluation,
    Evaluator,
    Mode,
    Status,
)
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig
from pytest_kernelpro.optimize.search.reward import RewardConfig, compute_reward
from pytest_kernelpro.optimize.search.tree import SearchNode, SearchResult

__all__ = [
    "MCTS",
    "Budget",
    "BudgetError",
    "BudgetTracker",
    "Candidate",
    "CandidateGenerator",
    "Evaluation",
    "Evaluator",
    "GreedySearch",
    "MCTSConfig",
    "Mode",
    "RewardConfig",
    "SearchNode",
    "SearchResult",
    "Status",
    "compute_reward",
    "parse_budget",
]
