"""The search tree shared by MCTS and greedy: typed nodes, statistics, the result tuple."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation, Mode

NodeKind = Literal["root", "success", "failed"]


@dataclass(eq=False)
class SearchNode:
    """One concrete solution (or the virtual ROOT, which has no candidate).

    Statistics follow UCT: `visits` (N) counts the evaluations in this node's subtree, itself
    included; `reward_sum` (W) sums their rewards; `Q` = W / N is the mean reward.
    """

    id: int
    parent: SearchNode | None = None
    candidate: Candidate | None = None
    evaluation: Evaluation | None = None
    mode: Mode | None = None  # the mode that produced this node (None for ROOT)
    reward: float = 0.0  # this node's own reward (0.0 for ROOT, which has none)
    children: list[SearchNode] = field(default_factory=list)
    visits: int = 0  # N: evaluations in this subtree
    reward_sum: float = 0.0  # W: sum of their rewards
    terminal: bool = False  # failed node whose repairs all failed: never selected again
    exhausted: bool = False  # every child dead and widening closed: never selected again
    elapsed_s: float = 0.0  # search time when this node was recorded
    # Children generated for this node whose evaluation is still running (optimize/search/parallel.py):
    # they count against widening and keep the node from being declared a dead end.
    pending: int = 0
    # Virtual visits of those pending children on this node's path, already in `visits`, and
    # the reward they stand for (virtual loss), kept apart so `reward_sum` stays exact.
    virtual: int = 0
    virtual_reward: float = 0.0

    @property
    def Q(self) -> float:  # noqa: N802 - the conventional MCTS name
        """Mean reward of this subtree (0.0 before the first visit), virtual visits included."""
        return (self.reward_sum + self.virtual_reward) / self.visits if self.visits else 0.0

    @property
    def is_root(self) -> bool:
        """True for the virtual ROOT."""
        return self.parent is None

    @property
    def kind(self) -> NodeKind:
        """ "root", "success" (correct candidate) or "failed" (anything else)."""
        if self.parent is None:
            return "root"
        assert self.evaluation is not None
        return "success" if self.evaluation.ok else "failed"

    @property
    def child_mode(self) -> Mode:
        """The generator mode of a new child: ROOT → initial, failed → debug, success →
        optimize."""
        kind = self.kind
        if kind == "root":
            return "initial"
        return "optimize" if kind == "success" else "debug"

    @property
    def dead(self) -> bool:
        """Excluded from selection (terminal or exhausted)."""
        return self.terminal or self.exhausted

    @property
    def depth(self) -> int:
        """0 for ROOT, 1 for seeds, ..."""
        depth, node = 0, self
        while node.parent is not None:
            depth, node = depth + 1, node.parent
        return depth

    @property
    def speedup(self) -> float | None:
        """The candidate's speedup when correct, else None."""
        if self.evaluation is None or not self.evaluation.ok:
            return None
        return self.evaluation.speedup

    def path(self) -> list[SearchNode]:
        """Nodes from ROOT down to this one."""
        nodes = [self]
        while nodes[-1].parent is not None:
            nodes.append(nodes[-1].parent)
        return nodes[::-1]

    def subtree(self) -> Iterator[SearchNode]:
        """This node and all its descendants, depth first."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def __repr__(self) -> str:
        status = self.evaluation.status if self.evaluation else "root"
        return (
            f"SearchNode(id={self.id}, {status}, N={self.visits}, Q={self.Q:.3f}, "
            f"children={len(self.children)}{', terminal' if self.terminal else ''}"
            f"{', exhausted' if self.exhausted else ''})"
        )


class SearchResult(NamedTuple):
    """What a search returns."""

    best: SearchNode | None  # the fastest correct node, None when nothing was correct
    best_speedup: float | None
    root: SearchNode
    nodes: tuple[SearchNode, ...]  # every evaluated node in creation order (ROOT excluded)
    stop_reason: str
    evaluations: int
    seconds: float
    usd: float
    trajectory: Path | None


class SearchTree:
    """Nodes by id (ROOT is id 0) with the bookkeeping both algorithms share."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self.root = SearchNode(id=next(self._ids))
        self.nodes: list[SearchNode] = [self.root]

    def add(
        self,
        parent: SearchNode,
        candidate: Candidate,
        evaluation: Evaluation,
        reward: float,
        *,
        mode: Mode | None = None,
        node_id: int | None = None,
    ) -> SearchNode:
        """Attach an evaluated candidate under `parent` (statistics are not updated here)."""
        if node_id is None:
            node_id = next(self._ids)
        elif node_id != len(self.nodes):
            raise ValueError(f"node id {node_id} out of order (expected {len(self.nodes)})")
        else:
            next(self._ids)
        node = SearchNode(
            id=node_id,
            parent=parent,
            candidate=candidate,
            evaluation=evaluation,
            mode=mode or parent.child_mode,
            reward=reward,
        )
        parent.children.append(node)
        self.nodes.append(node)
        return node

    def backpropagate(self, node: SearchNode) -> None:
        """Add one visit and `node.reward` to the node and every ancestor up to ROOT."""
        current: SearchNode | None = node
        while current is not None:
            current.visits += 1
            current.reward_sum += node.reward
            current = current.parent

    def evaluated(self) -> list[SearchNode]:
        """All nodes but ROOT, in creation order."""
        return self.nodes[1:]

    def best(self) -> SearchNode | None:
        """The correct node with the highest speedup (the earliest one on ties)."""
        best: SearchNode | None = None
        for node in self.evaluated():
            speedup = node.speedup
            if speedup is None:
                continue
            if best is None or speedup > (best.speedup or 0.0):
                best = node
        return best

    def get(self, node_id: int) -> SearchNode:
        """The node with `node_id`."""
        return self.nodes[node_id]
