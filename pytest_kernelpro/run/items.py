"""Kernel items: what a marked kernel or a KernelBench file becomes at collection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import KernelproError
from ..problem import MARKER_NAME, MarkerOptions, Problem, ProblemLocator, problem_from_marker
from ..record import KernelRecord

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
        from .stages import new_record, run_kernel_item

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


def collect_marked(
    collector: pytest.Collector, name: str, obj: Any, mark: Any
) -> list[pytest.Item]:
    """Kernel items for a marked function or class found in a test module."""
    import inspect

    path = str(collector.path)
    try:
        lineno = inspect.getsourcelines(obj)[1] - 1
    except (OSError, TypeError):
        lineno = None
    try:
        options = MarkerOptions.from_marker(mark.args, dict(mark.kwargs), kernel_name=name)
        problem = problem_from_marker(obj, options, name=name, source_file=path)
    except KernelproError as exc:
        return [KernelConfigErrorItem.from_parent(collector, name=name, error=exc)]
    return items_for_problem(collector, problem, path=path, qualname=name, lineno=lineno)


class KernelBenchFile(pytest.File):
    """A KernelBench problem file: `Model` is the reference, `ModelNew` the kernel."""

    def collect(self) -> list[pytest.Item]:
        from ..problem.kernelbench import problem_from_kernelbench

        try:
            problem = problem_from_kernelbench(self.path)
        except KernelproError as exc:
            return [KernelConfigErrorItem.from_parent(self, name=self.path.stem, error=exc)]
        return items_for_problem(
            self, problem, path=str(self.path), qualname="ModelNew", lineno=None
        )
