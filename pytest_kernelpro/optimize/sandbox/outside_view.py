"""A worker's timing claim checked against what its parent sees from outside.

The sandbox worker runs candidate code, so what it writes is a claim. Its parent watches the
worker's progress file and its process tree, and sees two things the candidate cannot change:
its own clock, and the CPU time the kernel charged to the worker's processes. The worker
claims its timing phase took `phase_s` seconds by its own clock. The parent's window is from
the first to the last of its polls that saw the worker in that phase: the phase surely
covered it, and a loaded machine that delays the parent's polls only shortens it, so load
cannot make an honest claim look short. An honest claim is at least that window less the
edge slack (the worker's clock starts just after it announces the phase and stops just before
it leaves it), and never below the CPU time the worker's tree used in the window divided by
the cores it may run on (CPU time cannot pass cores x wall time). A claim below `CLAIM_SHARE`
of either bound is refused: the worker's numbers are not its measurements (a rebound clock, a
shrunk result).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# A claimed phase shorter than this share of what the parent saw is refused (honest claims
# are within the polling slack of it; a cheat's shrunk numbers are several times shorter).
CLAIM_SHARE = 0.5


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (/proc/<pid>/stat), 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return 0.0
    return ticks / float(os.sysconf("SC_CLK_TCK"))


def tree_cpu_s(pid: int, children: Callable[[int], Iterable[int]]) -> float:
    """CPU seconds of `pid` and its live descendants."""
    total, todo, seen = 0.0, [pid], set()
    while todo and len(seen) < 4096:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += process_cpu_s(current)
        todo += list(children(current))
    return total


def usable_cores(pid: int) -> int:
    try:
        return max(1, len(os.sched_getaffinity(pid)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class PhaseMark:
    """When the parent first saw a phase: its clock, and the worker tree's CPU seconds."""

    at_s: float
    cpu_s: float


def claim_failure(
    claimed_s: float | None,
    start: PhaseMark | None,
    end: PhaseMark | None,
    *,
    poll_s: float,
    cores: int,
) -> str | None:
    """Why the worker's claimed timing phase cannot be true, or None (module docstring)."""
    if claimed_s is None or start is None or end is None:
        return None
    window = end.at_s - start.at_s
    # The edge slack: the worker may be descheduled between announcing the phase and
    # starting its clock, and between stopping it and announcing the next phase.
    wall_floor = window - 2.0 * poll_s
    cpu_floor = (end.cpu_s - start.cpu_s) / max(1, cores)
    floor = max(wall_floor, cpu_floor)
    if floor <= 0 or claimed_s >= CLAIM_SHARE * floor:
        return None
    return (
        f"timing not believed: the worker claims its timing phase took {claimed_s:.3g} s, but "
        f"its parent saw it in that phase for {window:.3g} s (its own clock, polled every {poll_s:g} s) and "
        f"{end.cpu_s - start.cpu_s:.3g} s of CPU time used on {cores} core(s): the numbers it "
        "wrote are not its measurements (a rebound clock or a rewritten result)"
    )
