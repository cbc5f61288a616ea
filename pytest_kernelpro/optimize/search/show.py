"""`kernelpro show TRAJECTORY`: print a search tree and its best path."""

from __future__ import annotations

import argparse
import sys

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.search.restore import render_tree
from pytest_kernelpro.optimize.search.trajectory import load_trajectory, resolve_trajectory


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `kernelpro show`."""
    parser = argparse.ArgumentParser(
        prog="kernelpro show",
        description="Print the search tree recorded in a trajectory file and its best path.",
    )
    parser.add_argument(
        "trajectory",
        help="Trajectory JSONL file written by a search, its run folder, or a kernel's folder "
        "under .kernelpro/optimize/ (its latest run)",
    )
    parser.add_argument(
        "--no-guidance",
        action="store_true",
        help="Leave out each node's profiler guidance",
    )
    parser.add_argument(
        "--code",
        type=int,
        metavar="NODE",
        help="Print the code (and reason, logs) of node NODE instead of the tree",
    )
    parser.add_argument(
        "--width", type=int, default=110, help="Line width of the tree. Default: %(default)r"
    )
    return parser


def show_main(argv: list[str]) -> int:
    """Print a search trajectory's tree and best path (`kernelpro show`).

    `argv` holds the arguments after the subcommand name.
    Returns 0 on success, 2 when the file cannot be read or the node does not exist.
    """
    args = build_parser().parse_args(argv)
    try:
        trajectory = load_trajectory(resolve_trajectory(args.trajectory))
        if args.code is None:
            sys.stdout.write(
                render_tree(trajectory, width=args.width, guidance=not args.no_guidance)
            )
            return 0
        for record in trajectory.nodes:
            if int(record["id"]) == args.code:
                sys.stdout.write(_node_text(record))
                return 0
        known = ", ".join(str(r["id"]) for r in trajectory.nodes) or "none"
        raise KernelproError(
            f"Node {args.code} is not in {args.trajectory} (nodes: {known}); "
            "run without --code to see the tree."
        )
    except KernelproError as exc:
        sys.stderr.write(f"kernelpro show: error: {exc}\n")
        return 2


def _node_text(record: dict) -> str:
    lines = [
        f"# node {record['id']} (parent {record['parent']}, mode {record.get('mode')}, "
        f"status {record.get('status')}, reward {float(record.get('reward', 0.0)):+.3f}"
        + (f", speedup {record['speedup']:.3f}x" if record.get("speedup") else "")
        + ")",
    ]
    if record.get("strategy"):
        lines.append(f"# strategy: {record['strategy']}")
    if record.get("prompt_id"):
        lines.append(f"# prompt: {record['prompt_id']}")
    if record.get("reason"):
        lines.append(f"# reason: {record['reason']}")
    if record.get("build_s"):
        lines.append(f"# build: {float(record['build_s']):.2f} s")
    lines.append(record.get("code", ""))
    if record.get("build_log"):
        lines += ["# ----- build log -----", record["build_log"]]
    return "\n".join(lines).rstrip("\n") + "\n"
