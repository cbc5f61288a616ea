"""Kernel items: what a marked kernel or a KernelBench file becomes at collection."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.problem import (
    MARKER_NAME,
    MarkerOptions,
    Problem,
    ProblemLocator,
    problem_from_marker,
)
from pytest_kernelpro.record import KernelRecord

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

RECORD_KEY = pytest.StashKey[KernelRecord]()
PLUGIN_NAME = "kernelpro-session"


class _KernelproItem(pytest.Item):
    """What both kinds of kernel item share: a `KernelproError` is reported as its message
    alone (it already says what failed and the fix), anything else with pytest's traceback."""

    def repr_failure(
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, KernelproError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


class KernelItem(_KernelproItem):
    """One kernel at one shape: checked, timed and placed on its roofline when run."""

    def __init__(
        self, *, problem: Problem, locator: ProblemLocator, lineno: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.problem = problem
        self.locator = locator
        self._lineno = lineno
        self.add_marker(MARKER_NAME)

    def runtest(self) -> None:
        from pytest_kernelpro.run.item_runner import new_record, run_kernel_item

        session = self.config.pluginmanager.get_plugin(PLUGIN_NAME)
        record = new_record(self)
        self.stash[RECORD_KEY] = record
        run_kernel_item(self, session, record)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, self._lineno, f"kernel {self.name}"


class KernelConfigErrorItem(_KernelproItem):
    """A marked kernel whose marker is invalid: it errors alone, other kernels still run."""

    def __init__(self, *, error: KernelproError, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error
        # A kernel item that failed to build is still a kernel item: --kernelpro-only keeps
        # it, so a broken marker or problem file fails the run instead of vanishing.
        self.add_marker(MARKER_NAME)

    def runtest(self) -> None:
        # Raised when run, not at collection: a collection error would stop the session.
        # The record makes the kernel count in the kernelpro summary as pytest counts it.
        self.stash[RECORD_KEY] = KernelRecord(
            nodeid=self.nodeid,
            name=self.name,
            kernel=self.name,
            outcome="failed",
            message=str(self.error),
            extra={"invalid_marker": True},
        )
        raise self.error

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"kernel {self.name} (invalid marker)"


def items_for_problem(
    parent: pytest.Collector, problem: Problem, *, path: str, qualname: str, lineno: int | None
) -> list[pytest.Item]:
    items: list[pytest.Item] = []
    for index, variant in enumerate(problem.at_shapes()):
        shape_index = index if variant.shape is not None else None
        items.append(
            KernelItem.from_parent(
                parent,
                name=variant.display_name,
                problem=variant,
                locator=ProblemLocator(path=path, qualname=qualname, shape_index=shape_index),
                lineno=lineno,
            )
        )
    return items


def kernel_items(
    collector: pytest.Collector, name: str, obj: Any, mark: Any
) -> list[pytest.Item] | None:
    """The kernel items of a marked function or class found in a test module under `name`:
    None for one imported from another test module (that module collects it), no items for
    a second name of a kernel already collected here, else one item per shape."""
    module = getattr(collector, "obj", None)
    defined_in = getattr(obj, "__module__", None)
    defined_here = defined_in is not None and defined_in == getattr(module, "__name__", None)
    if not defined_here and _in_another_test_module(collector, defined_in):
        return None
    # A kernel defined here under its own name is no alias: the common case, decided
    # without a pass over the module's names.
    plain = defined_here and name == getattr(obj, "__name__", None)
    if module is not None and not plain and _is_an_alias(module, name, obj, defined_here):
        return []
    return _collect_marked(collector, name, obj, mark, defined_here)


def _in_another_test_module(collector: pytest.Collector, defined_in: str | None) -> bool:
    """True for a marked object imported from another test module: that module collects it,
    so it is not collected twice. One imported from a library module (`mykernels/ops.py`
    decorated in place, or a class marked by assignment in the test module) is collected where
    it is imported, since pytest never collects the library."""
    module_file = getattr(sys.modules.get(defined_in or ""), "__file__", None)
    if module_file is None:
        return False
    patterns = collector.config.getini("python_files")
    return any(fnmatch.fnmatch(Path(module_file).name, pattern) for pattern in patterns)


def _is_an_alias(module: Any, name: str, obj: Any, defined_here: bool) -> bool:
    """True for a second name of one kernel bound twice in one test module: it is one
    kernel, collected once. An imported one (`from lib import Double` then `double =
    pytest.mark.kernelpro(...)(Double)`) goes under the name the test module gave it; one
    defined here (`class Fused` then `fused = pytest.mark.kernelpro(...)(Fused)`) under its
    own name, which is also the name of a decorated kernel that has an alias."""
    own_name = getattr(obj, "__name__", None)
    names = [bound for bound, value in vars(module).items() if value is obj]
    if defined_here:
        chosen = own_name if own_name in names else (names[0] if names else name)
    else:
        given = [bound for bound in names if bound != own_name]
        chosen = given[0] if given else own_name
    return name != chosen


def _refuse_parametrize(obj: Any, name: str) -> None:
    """A kernel is called with its inputs alone, so `@pytest.mark.parametrize` on it is
    refused with the ways to get several items, not left to a TypeError."""
    for mark in getattr(obj, "pytestmark", None) or []:
        if mark.name == "parametrize":
            break
    else:
        return
    argnames = mark.args[0] if mark.args else mark.kwargs.get("argnames", "?")
    raise KernelproError(
        f"kernel {name!r}: @pytest.mark.parametrize({argnames!r}, ...) does not apply to a "
        "kernelpro kernel: the kernel and its reference are called with the inputs from "
        "`inputs=` alone. For several sizes, give the marker shapes=[...] (one item per "
        "shape, named like "
        f"{name}[8192x4096]; the inputs factory gets shape=); for another setting, mark one "
        "kernel per value (a function that calls yours with it)"
    )


def _collect_marked(
    collector: pytest.Collector, name: str, obj: Any, mark: Any, defined_here: bool
) -> list[pytest.Item]:
    """Kernel items for a marked function or class found in a test module."""
    import inspect

    path = str(collector.path)
    lineno: int | None = None
    if defined_here:
        try:  # the line in this test module; an imported kernel's line is in another file
            lineno = inspect.getsourcelines(obj)[1] - 1
        except (OSError, TypeError):
            lineno = None
    try:
        _refuse_parametrize(obj, name)
        options = MarkerOptions.from_marker(mark.args, dict(mark.kwargs), kernel_name=name)
        problem = problem_from_marker(obj, options, name=name, source_file=path)
    except KernelproError as exc:
        return [KernelConfigErrorItem.from_parent(collector, name=name, error=exc)]
    return items_for_problem(collector, problem, path=path, qualname=name, lineno=lineno)


class KernelBenchFile(pytest.File):
    """A KernelBench problem file: `Model` is the reference, `ModelNew` the kernel."""

    def collect(self) -> list[pytest.Item]:
        from pytest_kernelpro.problem.kernelbench import problem_from_kernelbench

        try:
            problem = problem_from_kernelbench(self.path)
        except KernelproError as exc:
            return [KernelConfigErrorItem.from_parent(self, name=self.path.stem, error=exc)]
        return items_for_problem(
            self, problem, path=str(self.path), qualname="ModelNew", lineno=None
        )
