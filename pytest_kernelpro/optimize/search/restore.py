"""A search rebuilt from its trajectory: the algorithm with its tree (to resume or inspect
it) and the tree as text (`kernelpro show`).

Above both the trajectory format and the algorithms: `trajectory.py` knows no algorithm, and
the engine reads trajectories without knowing which algorithm wrote them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.optimize.search.greedy import GreedySearch
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig
from pytest_kernelpro.optimize.search.reward import RewardConfig
from pytest_kernelpro.optimize.search.trajectory import Trajectory, load_trajectory

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.engine import SearchAlgorithm
    from pytest_kernelpro.optimize.search.tree import SearchNode


def restore_search(path: str | os.PathLike[str] | Trajectory) -> SearchAlgorithm:
    """The algorithm of a trajectory's header, with its tree rebuilt (statistics, dead ends)."""
    trajectory = path if isinstance(path, Trajectory) else load_trajectory(path)
    header = trajectory.header
    config = dict(header.get("config") or {})
    seed = int(config.pop("seed", 0))
    reward = RewardConfig(**(header.get("reward") or {}))
    algorithm: SearchAlgorithm
    if header.get("algorithm") == "greedy":
        algorithm = GreedySearch(
            candidates_per_step=int(config.get("candidates_per_step", 1)), reward=reward, seed=seed
        )
    else:
        algorithm = MCTS(MCTSConfig(**config), reward=reward, seed=seed)
    algorithm.restore(trajectory)
    return algorithm


def render_tree(
    path: str | os.PathLike[str] | Trajectory, *, width: int = 110, guidance: bool = True
) -> str:
    """The search tree and the best path as plain text (rich's tree layout, no colour); with
    `guidance`, each node's profiler findings (what its children's prompts were told)."""
    import io

    from rich.console import Console
    from rich.text import Text
    from rich.tree import Tree

    trajectory = path if isinstance(path, Trajectory) else load_trajectory(path)
    algorithm = restore_search(trajectory)
    tree = algorithm.tree
    best = tree.best()
    on_best_path = {n.id for n in best.path()} if best is not None else set()
    header = trajectory.header
    root = tree.root
    # Speedups are the search's, against the reference; the user's current kernel (measured
    # in the same sandbox) is the baseline a user cares about, so say both where it is known.
    current = (header.get("meta") or {}).get("current_speedup")
    title = (
        f"ROOT  {header.get('algorithm')}  {len(tree.nodes) - 1} nodes  "
        f"N={root.visits} Q={root.Q:+.3f}  speedups vs the reference"
        + (f"; the current kernel {current:.2f}x" if current else "")
    )

    def vs_current(speedup: float) -> str:
        return f" ({speedup / current:.2f}x current)" if current else ""

    rich_tree = Tree(Text(title))

    def label(node: SearchNode) -> Text:
        ev, cand = node.evaluation, node.candidate
        assert ev is not None
        assert cand is not None
        parts = [f"{'*' if node.id in on_best_path else ' '}#{node.id} {node.mode:<8}"]
        if ev.ok and ev.speedup is not None:
            parts.append(f"correct {ev.speedup:.2f}x{vs_current(ev.speedup)}")
        else:
            parts.append(ev.status)
        parts.append(f"r={node.reward:+.2f} N={node.visits} Q={node.Q:+.2f}")
        if node.terminal:
            parts.append("[terminal]")
        elif node.exhausted:
            parts.append("[exhausted]")
        if cand.strategy:
            parts.append(f'"{_one_line(cand.strategy, 40)}"')
        if ev.reason and not ev.ok:
            parts.append(f"- {_one_line(ev.reason, 60)}")
        text = "  ".join(parts)
        notes = _guidance_lines(ev.findings) if guidance else []
        if notes:
            text += "\n  guidance: " + "; ".join(notes)
        return Text(text)

    def add(branch: Tree, node: SearchNode) -> None:
        for child in node.children:
            add(branch.add(label(child)), child)

    add(rich_tree, root)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
    console.print(rich_tree)
    if best is None:
        console.print(Text("Best path: no correct solution"))
    else:
        steps = " -> ".join(
            f"#{n.id} {n.speedup:.2f}x" if n.speedup is not None else f"#{n.id} {n.kind}"
            for n in best.path()[1:]
        )
        console.print(
            Text(
                f"Best path: ROOT -> {steps}  "
                f"(best #{best.id}: {best.speedup:.2f}x{vs_current(best.speedup)})"
            )
        )
    return buffer.getvalue()


_SEVERITY_RANK = {"critical": 0, "high": 1, "medium": 2, "low": 3}


def _guidance_lines(findings: list[dict[str, Any]], limit: int = 3) -> list[str]:
    ordered = sorted(
        (f for f in findings if isinstance(f, dict)),
        key=lambda f: _SEVERITY_RANK.get(str(f.get("severity", "")).lower(), 9),
    )
    out = []
    for finding in ordered[:limit]:
        title = _one_line(str(finding.get("title") or finding.get("tool") or "finding"), 50)
        severity = str(finding.get("severity") or "").lower()
        out.append(f"[{severity}] {title}" if severity else title)
    return out


def _one_line(text: str, limit: int) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
