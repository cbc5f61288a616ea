"""The order the suite's files run in (tests/conftest.py): the longest files first.

`.ci/run` runs `pytest -n 3 --dist loadfile --no-loadscope-reorder`: xdist hands whole files
to the workers in collection order, a worker taking the next file when it is almost out of
work. A long file that goes out late keeps its worker busy after the others have run out of
files; so the files that take longest go out first, longest first (`LONGEST_FILES`), then
the other files with a test marked `slow`, then the rest, each file's tests in their own
order. The list is by the time each file took in whole-suite runs
(bench/results/2026-12-06-suite-time-cpu.md); a file missing from it only goes out later
than it could, and a listed file that no longer exists fails
`tests/test_suite_order.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent

# Relative to tests/, longest first.
LONGEST_FILES: tuple[str, ...] = (
    "plugin/test_optimize_handoff.py",
    "test_readme_commands.py",
    "plugin/test_optimize_honest_attacks.py",
    "plugin/test_optimize.py",
    "optimize/search/test_sandbox_attacks.py",
    "plugin/test_optimize_dask.py",
    "optimize/search/test_sandbox_links.py",
    "plugin/test_optimize_sandbox_canaries.py",
    "optimize/search/test_dask_search.py",
    "optimize/search/test_sandbox_worker.py",
)


def file_rank(path: Path, slow_files: set[Path], longest: Sequence[str] | None = None) -> int:
    """The place of the file `path` in the queue: its index in `longest` (LONGEST_FILES
    unless given; paths relative to tests/), after them the files in `slow_files`, then
    every other file. Equal ranks keep collection order (the caller's stable sort), so a
    file's tests stay together and in order."""
    longest = LONGEST_FILES if longest is None else longest
    try:
        relative = path.resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        relative = None
    if relative in longest:
        return longest.index(relative)
    return len(longest) + (0 if path in slow_files else 1)
