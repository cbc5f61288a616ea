"""Monte Carlo tree search over concrete solutions, as the KernelPro seed specifies.

Every node is a concrete, evaluated solution; the virtual ROOT stands for "write a fresh
solution from scratch". One iteration:

1. **select**: from ROOT, at each node compare the UCT of the best live child,
   UCT(c) = Q(c) + C·sqrt(ln N(parent) / N(c)), C = √2,
   with the UCT of a *virtual child*: a hypothetical new child that inherits the node's mean
   reward Q(node) as its prior and a fair share of the node's visits,
   share = N(node) / (k + 1), k = the node's number of children (the new child would be
   the (k+1)-th; an equal split of the visits among k+1 children). Its UCT is
   Q(node) + C·sqrt(ln N(node) / share). If progressive widening allows another child and
   the virtual child's UCT is strictly higher, the search expands this node; otherwise it
   descends into the best child. A node without live children expands when widening
   allows. Exact ties between children are broken by the seeded RNG.
2. **expand**: the generator writes a candidate in the node's mode (ROOT → "initial",
   failed → "debug", correct → "optimize"); `candidates_per_expansion` > 1 asks for more
   at once, never more than widening allows now.
3. **simulate**: each candidate is evaluated (built, checked, timed); its reward is the
   three-tier reward of `reward.py`.
4. **backpropagate**: each new node adds one visit and its reward to itself and every
   ancestor up to ROOT.

Progressive widening: a node with N visits may have at most floor(C_pw · max(N, 1)^α)
children (α = 0.5), C_pw = 2 for ROOT and failed nodes, 3 for correct ones. max(N, 1) lets
the unvisited ROOT get its first seeds.

Dead ends: a failed node with three or more children, none of which (nor any deeper
descendant) is correct, is *terminal*: its repairs keep failing, the approach is broken.
A non-ROOT node whose children are all terminal or exhausted and that may not widen is
*exhausted*: its visit count can no longer grow (nothing below it is ever selected), so it
never could widen again. Both are excluded from selection, and marking runs up the tree
after every backpropagation, so whole branches die at once. ROOT is never exhausted: when
every top-level solution is dead, the search writes a fresh seed even if the widening gate
is closed (otherwise a search with budget left would stop).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.search.engine import SearchAlgorithm

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.reward import RewardConfig
    from pytest_kernelpro.optimize.search.tree import SearchNode

Decision = Literal["expand", "descend", "dead"]


@dataclass(frozen=True)
class MCTSConfig:
    """Constants of the search (the seed's values by default)."""

    c_uct: float = math.sqrt(2.0)  # exploration constant of UCT
    alpha: float = 0.5  # progressive widening exponent
    c_pw_root: float = 2.0  # widening constant of ROOT (fresh seeds)
    c_pw_failed: float = 2.0  # ... of failed nodes (repairs)
    c_pw_success: float = 3.0  # ... of correct nodes (optimizations)
    terminal_after: int = 3  # failed repairs that make a failed node terminal
    # Candidates asked of the generator per expansion, capped by the widening room. The
    # seed expands "a new solution" per decision; an agent that writes N completions per
    # call can set N (each is evaluated and backpropagated on its own).
    candidates_per_expansion: int = 1

    def __post_init__(self) -> None:
        for name in ("c_uct", "alpha", "c_pw_root", "c_pw_failed", "c_pw_success"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise KernelproConfigError(
                    f"Invalid MCTS setting {name}={value!r}: it must be a positive number."
                )
        for name in ("terminal_after", "candidates_per_expansion"):
            if getattr(self, name) < 1:
                raise KernelproConfigError(
                    f"Invalid MCTS setting {name}={getattr(self, name)!r}: it must be >= 1."
                )


class MCTS(SearchAlgorithm):
    """UCT search with progressive widening, ROOT re-expansion and dead-end pruning."""

    name = "mcts"

    def __init__(
        self,
        config: MCTSConfig | None = None,
        *,
        reward: RewardConfig | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(reward=reward, seed=seed)
        self.config = config or MCTSConfig()

    def config_dict(self) -> dict[str, Any]:
        """MCTS constants and seed, for the trajectory header."""
        return {"seed": self.seed, **asdict(self.config)}

    # ----- progressive widening -----

    def widening_constant(self, node: SearchNode) -> float:
        """C_pw of `node`: by its kind (ROOT, failed, success)."""
        kind = node.kind
        if kind == "root":
            return self.config.c_pw_root
        return self.config.c_pw_success if kind == "success" else self.config.c_pw_failed

    def max_children(self, node: SearchNode) -> int:
        """floor(C_pw · max(N, 1)^α): the most children `node` may have at its visit count."""
        allowed = self.widening_constant(node) * max(node.visits, 1) ** self.config.alpha
        # The epsilon keeps exact products (2·√4 = 4) from flooring one short.
        return max(1, math.floor(allowed + 1e-9))

    def room(self, node: SearchNode) -> int:
        """Children `node` may still get at its visit count; children still being evaluated
        (`pending`, several expansions in flight) take their place already."""
        return self.max_children(node) - len(node.children) - node.pending

    def can_widen(self, node: SearchNode) -> bool:
        """True when `node` may get one more child now."""
        return self.room(node) > 0

    def slots(self, node: SearchNode) -> int:
        """Children `node` gets in this step: `candidates_per_expansion`, capped by the
        widening room (at least 1: a ROOT forced open when everything else is dead)."""
        return max(1, min(self.config.candidates_per_expansion, self.room(node)))

    # ----- UCT -----

    def uct(self, child: SearchNode) -> float:
        """Q(c) + C·sqrt(ln N(parent) / N(c)); +inf for an unvisited child."""
        assert child.parent is not None
        if child.visits == 0:
            return math.inf
        parent_visits = max(child.parent.visits, 1)
        return child.Q + self.config.c_uct * math.sqrt(math.log(parent_visits) / child.visits)

    def fair_share(self, node: SearchNode) -> float:
        """Visits a new child of `node` is credited with: N(node) / (k + 1), with the
        children still being evaluated among the k."""
        return node.visits / (len(node.children) + node.pending + 1)

    def virtual_uct(self, node: SearchNode) -> float:
        """UCT of a hypothetical new child: prior Q(node), visits `fair_share(node)`.

        +inf for an unvisited node (nothing is known, so a new child is worth trying).
        """
        if node.visits == 0:
            return math.inf
        return node.Q + self.config.c_uct * math.sqrt(math.log(node.visits) / self.fair_share(node))

    def decide(self, node: SearchNode) -> tuple[Decision, SearchNode | None]:
        """At `node`: expand it, descend into a child (returned), or declare it dead."""
        live = [child for child in node.children if not child.dead]
        if self.in_flight:
            # With expansions in flight, a subtree whose every node is waiting for its
            # children is closed for now: descending into it would find nothing to expand.
            live = [child for child in live if self._open(child)]
        widen = self.can_widen(node)
        if not live:
            if widen or node.is_root:
                return "expand", None
            return "dead", None
        scores = [self.uct(child) for child in live]
        top = max(scores)
        best = self.rng.choice([c for c, s in zip(live, scores, strict=True) if s == top])
        if widen and self.virtual_uct(node) > top:
            return "expand", None
        return "descend", best

    def select(self) -> SearchNode:
        """Walk from ROOT by `decide` until a node is to be expanded."""
        node = self.tree.root
        while True:
            decision, child = self.decide(node)
            if decision == "expand":
                return node
            if decision == "descend":
                assert child is not None
                node = child
                continue
            # A dead node reached by selection (its state changed without a backpropagation
            # through it, e.g. after `restore`): mark it and start again from ROOT, which
            # always expands, so the walk ends.
            node.exhausted = True
            self._mark_dead_ends(node.parent)
            node = self.tree.root

    def _open(self, node: SearchNode) -> bool:
        """True when some node of `node`'s subtree may get a child now."""
        if self.can_widen(node):
            return True
        return any(self._open(child) for child in node.children if not child.dead)

    # ----- dead ends -----

    def is_dead_end(self, node: SearchNode) -> bool:
        """A failed node with >= `terminal_after` children and no correct descendant."""
        if node.kind != "failed" or len(node.children) < self.config.terminal_after:
            return False
        return not any(n.kind == "success" for n in node.subtree())

    def on_backpropagated(self, node: SearchNode) -> None:
        """Mark terminal and exhausted nodes from the new node's parent up to ROOT."""
        self._mark_dead_ends(node.parent)

    def _mark_dead_ends(self, start: SearchNode | None) -> None:
        node = start
        while node is not None and not node.is_root:
            # A node still waiting for a child's result is neither: that child may be correct.
            if not node.dead and not node.pending:
                if self.is_dead_end(node):
                    node.terminal = True
                elif (
                    node.children
                    and all(child.dead for child in node.children)
                    and not self.can_widen(node)
                ):
                    node.exhausted = True
            node = node.parent
