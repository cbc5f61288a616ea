"""The search trajectory: an append-only JSONL record of every node, written as it happens.

Line 1 is a header (`"kind": "header"`: format, version, algorithm and its settings, reward
tiers, budget, start time, optional meta). Every later line is one evaluated node
(`"kind": "node"`: id, parent id (0 = ROOT), mode, prompt id, strategy, code, status,
reason, reward, speedup, build log, logs, correctness, timing, metrics, findings, tokens,
cost, evaluation wall time, build time, search time). Each line is flushed and fsynced by
`fileio.append_jsonl`, so a crash or Ctrl-C loses at most the line in flight;
`load_trajectory` drops such a truncated last line with a warning, and a resumed search
first cuts it off the file so that new lines start clean.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.fileio import append_jsonl, atomic_write_text
from pytest_kernelpro.text_safety import safe_tree

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.budget import Budget
    from pytest_kernelpro.optimize.search.reward import RewardConfig
    from pytest_kernelpro.optimize.search.tree import SearchNode

FORMAT = "kernelpro-trajectory"
VERSION = 1


def header_record(
    algorithm: str,
    config: Mapping[str, Any],
    reward: RewardConfig,
    budget: Budget,
) -> dict[str, Any]:
    """The first line of a trajectory file."""
    return {
        "kind": "header",
        "format": FORMAT,
        "version": VERSION,
        "algorithm": algorithm,
        "config": dict(config),
        "reward": reward.to_dict(),
        "budget": asdict(budget),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def node_record(node: SearchNode) -> dict[str, Any]:
    """One node as a trajectory line."""
    assert node.parent is not None
    assert node.candidate is not None
    assert node.evaluation is not None
    cand, ev = node.candidate, node.evaluation
    record = {
        "kind": "node",
        "id": node.id,
        "parent": node.parent.id,
        "depth": node.depth,
        "mode": node.mode,
        "prompt_id": cand.prompt_id,
        "strategy": cand.strategy,
        "code": cand.code,
        "status": ev.status,
        "reason": ev.reason,
        "reward": node.reward,
        "speedup": ev.speedup,
        "build_log": ev.build_log,
        "logs": ev.logs,
        "correctness": ev.correctness,
        "timing": ev.timing,
        "metrics": ev.metrics,
        "findings": ev.findings,
        "tokens": cand.tokens,
        "cost_usd": cand.cost_usd,
        "meta": dict(cand.meta),
        "wall_s": ev.wall_s,
        "build_s": ev.build_s,
        "elapsed_s": node.elapsed_s,
    }
    # Everything but the code (replayed as is) in the form text_safety gives candidate text.
    code = record.pop("code")
    return {**safe_tree(record), "code": code}


@dataclass
class Trajectory:
    """A loaded trajectory file."""

    path: Path
    header: dict[str, Any]
    nodes: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False  # the last line was cut off (and is not in `nodes`)
    good_bytes: int = 0  # length of the file up to the end of the last complete line

    @property
    def spent_seconds(self) -> float:
        """Search time recorded with the last node."""
        return max((float(r.get("elapsed_s") or 0.0) for r in self.nodes), default=0.0)

    @property
    def spent_usd(self) -> float:
        """API spend of all recorded candidates."""
        return sum(float(r.get("cost_usd") or 0.0) for r in self.nodes)


def load_trajectory(path: str | os.PathLike[str]) -> Trajectory:
    """Read a trajectory; a truncated last line is dropped with a `KernelproWarning`.

    Raises `KernelproError` for a missing file, a missing header, or a corrupt line that
    is not the last one (that is damage, not an interrupted write).
    """
    target = Path(path)
    try:
        raw = target.read_bytes()
    except OSError as exc:
        raise KernelproError(f"Cannot read trajectory {target}: {exc}") from exc
    lines = raw.split(b"\n")
    header: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = []
    offset = 0
    good_bytes = 0
    truncated = False
    for number, line in enumerate(lines, start=1):
        is_last = number == len(lines)
        offset_next = offset + len(line) + (0 if is_last else 1)
        if not line.strip():
            offset = offset_next
            if not is_last:
                good_bytes = offset
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            remaining = [rest for rest in lines[number:] if rest.strip()]
            if remaining:
                raise KernelproError(
                    f"Trajectory {target} line {number} is corrupt ({exc}) and is not the last "
                    "line; the file was damaged, not interrupted. Repair or remove that line."
                ) from exc
            truncated = True
            warnings.warn(
                f"Trajectory {target}: the last line ({len(line)} bytes) is incomplete, "
                "probably cut off by a crash mid-write; it is ignored.",
                KernelproWarning,
                stacklevel=2,
            )
            break
        offset = offset_next
        good_bytes = offset
        if record.get("kind") == "header":
            header = record
        elif record.get("kind") == "node":
            nodes.append(record)
    if header is None or header.get("format") != FORMAT:
        raise KernelproError(
            f"{target} is not a kernelpro trajectory (no header line with format {FORMAT!r})."
        )
    return Trajectory(
        path=target, header=header, nodes=nodes, truncated=truncated, good_bytes=good_bytes
    )


class TrajectoryWriter:
    """Appends node lines to a trajectory file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: str | os.PathLike[str], header: Mapping[str, Any]) -> TrajectoryWriter:
        """Start a new trajectory with its header line."""
        target = Path(path)
        atomic_write_text(target, json.dumps(safe_tree(dict(header)), default=str) + "\n")
        return cls(target)

    @classmethod
    def reopen(cls, trajectory: Trajectory) -> TrajectoryWriter:
        """Continue a loaded trajectory; a truncated last line is cut off first (and a
        complete last line that lacks its newline gets one), so new lines start clean."""
        raw = trajectory.path.read_bytes()
        good = raw[: trajectory.good_bytes]
        if good and not good.endswith(b"\n"):
            good += b"\n"
        if good != raw:
            atomic_write_text(trajectory.path, good.decode("utf-8"))
        return cls(trajectory.path)

    def append_node(self, node: SearchNode) -> None:
        """Append one evaluated node (flushed to disk before returning)."""
        append_jsonl(self.path, node_record(node))


def resolve_trajectory(path: str | os.PathLike[str]) -> Path:
    """A trajectory file from a path to one, to a run folder, or to a kernel's folder of
    runs (its latest run)."""
    target = Path(path)
    if target.is_dir():
        if (target / "trajectory.jsonl").is_file():
            return target / "trajectory.jsonl"
        pointer = target / "LATEST"
        if pointer.is_file():
            run = target / pointer.read_text(encoding="utf-8").strip()
            if (run / "trajectory.jsonl").is_file():
                return run / "trajectory.jsonl"
        runs = sorted(p for p in target.glob("run-*") if (p / "trajectory.jsonl").is_file())
        if runs:
            return runs[-1] / "trajectory.jsonl"
        raise KernelproError(
            f"{target} holds no trajectory.jsonl (neither a run folder nor a kernel's folder "
            "of runs under .kernelpro/optimize/)"
        )
    return target
