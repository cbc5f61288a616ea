"""What a kernel item runs: the unified `Problem` (`model.py`), and where it comes from (a
marker, a KernelBench file: `kernelbench.py`, imported where a KernelBench file is collected:
a check session of marked kernels never uses it).

The names below are the package's interface.
"""

from __future__ import annotations

from pytest_kernelpro.problem.model import (
    MARKER_NAME,
    MARKER_SIGNATURE,
    MarkerOptions,
    Problem,
    ProblemLocator,
    marker_of,
    problem_from_marker,
)

__all__ = [
    "MARKER_NAME",
    "MARKER_SIGNATURE",
    "MarkerOptions",
    "Problem",
    "ProblemLocator",
    "marker_of",
    "problem_from_marker",
]
