"""What a kernel item runs: the unified `Problem` (`model.py`), and where it comes from (a
marker, a KernelBench file: `kernelbench.py`, another process: `locate.py`).

The names below are the package's interface; the generated sandbox modules import
`pytest_kernelpro.problem.load_problem`, so that path stays. The KernelBench reader (with
`import_file`) and the loader of other processes (with `lookup_qualname`) are imported when
first asked for (`__getattr__`): a check session of marked kernels uses neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_kernelpro.problem.model import (
    MARKER_NAME,
    MARKER_SIGNATURE,
    MarkerOptions,
    Problem,
    ProblemLocator,
    marker_of,
    problem_from_marker,
)

if TYPE_CHECKING:
    from pytest_kernelpro.problem.kernelbench import import_file
    from pytest_kernelpro.problem.locate import load_problem, lookup_qualname

# The names of the modules imported on first use, by the module that holds them.
_LAZY = {
    "import_file": "kernelbench",
    "load_problem": "locate",
    "lookup_qualname": "locate",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "MARKER_NAME",
    "MARKER_SIGNATURE",
    "MarkerOptions",
    "Problem",
    "ProblemLocator",
    "import_file",
    "load_problem",
    "lookup_qualname",
    "marker_of",
    "problem_from_marker",
]
