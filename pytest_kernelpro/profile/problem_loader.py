"""The one problem loader: a kernel item's Problem rebuilt from its file in another process
(the profiler's target here, the optimizer's sandbox and shims), with the session's import path.

A KernelBench file becomes its problem as at collection; a marked kernel is found by its
qualified name and rebuilt from its marker. A check session never loads it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.problem.kernelbench import (
    import_file,
    is_kernelbench_file,
    problem_from_kernelbench,
)
from pytest_kernelpro.problem.model import (
    MarkerOptions,
    Problem,
    ProblemLocator,
    marker_of,
    problem_from_marker,
)


def project_import_path(entries: Sequence[str] | None = None) -> list[str]:
    """The entries of `entries` (default: this process's `sys.path`, which in the pytest
    session holds the rootdir, conftest insertions, the `pythonpath` ini and a src/ layout)
    outside the interpreter's own stdlib and site-packages: what another process needs on its
    path to import the kernel's modules as the session did."""
    prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path if entries is None else entries:
        if not entry:
            continue
        resolved = str(Path(entry).resolve())
        if not any(resolved.startswith(prefix) for prefix in prefixes):
            out.append(entry)
    return out


def extend_import_path(entries: Sequence[str]) -> None:
    """Append the session's project entries this process lacks (after its own, so they
    never shadow what it already imports)."""
    for entry in entries:
        if entry and entry not in sys.path:
            sys.path.append(entry)


def load_problem(locator: ProblemLocator) -> Problem:
    """Rebuild the Problem a kernel item ran, from its file (used in subprocesses)."""
    path = Path(locator.path)
    if is_kernelbench_file(path):
        problem = problem_from_kernelbench(path)
    else:
        obj = lookup_qualname(import_file(path), locator.qualname)
        if obj is None:
            raise KernelproConfigError(f"{path} has no {locator.qualname} (renamed or removed?)")
        mark = marker_of(obj)
        if mark is None:
            raise KernelproConfigError(
                f"{locator.qualname} in {path} carries no @pytest.mark.kernelpro"
            )
        options = MarkerOptions.from_marker(
            mark.args, dict(mark.kwargs), kernel_name=locator.qualname
        )
        problem = problem_from_marker(obj, options, name=locator.qualname, source_file=str(path))
    variants = problem.at_shapes()
    index = locator.shape_index or 0
    if not 0 <= index < len(variants):
        raise KernelproConfigError(
            f"shape index {index} out of range for {locator.qualname} ({len(variants)} shapes)"
        )
    return variants[index]


def lookup_qualname(namespace: Any, qualname: str) -> Any | None:
    """The object `qualname` ("Outer.kernel") names in `namespace`, None where a part is missing."""
    obj: Any = namespace
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj
