"""Kernel items: what a marked kernel or a KernelBench file becomes at collection, and what
one item's run is given: its resolved settings and its profiling setup.

`ItemSettings.resolve` decides, once per item, every setting a marker can override, with the
one precedence of the project: marker > command line > `KERNELPRO_*` environment > ini >
conftest defaults (`pytest_kernelpro_defaults`) > built-in. The session-wide part of that
chain (command line to built-in) is already resolved by `config.KernelproConfig`, whose
`sources` name where each value came from; this adds the marker on top and keeps the source
of every value, so a message can say why a kernel got its threshold or tolerance.

| setting      | marker keyword | session setting          | built-in                                  |
|--------------|----------------|--------------------------|-------------------------------------------|
| threshold    | threshold=     | --kernelpro-threshold    | 2% on a CUDA GPU, 5% on the CPU (gate)    |
| trials       | trials=        | --kernelpro-trials       | 3                                         |
| rtol, atol   | rtol=, atol=   | (none)                   | by the reference output's dtype           |
| min_roofline | min_roofline=  | (none)                   | none (no floor)                           |
| device       | device=        | --kernelpro-device       | auto: the CUDA GPU when one is visible    |

`Profiling` is the profile stage's setup: the session's builds (`SessionCapture`), the
profiler's time limit, the budget of automatic regression profiles. `Services` is what the
optimizer's one seam (`optimize.loop.item.optimize_item`) uses of the session; the other
stages get values.
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

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

    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.optimize.loop.progress import SearchProgress
    from pytest_kernelpro.profile.capture import ExtensionCapture

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


def _defined_here(collector: pytest.Collector, obj: Any) -> bool:
    """Whether the marked object was defined in the test module being collected."""
    defined_in = getattr(obj, "__module__", None)
    return defined_in is not None and defined_in == getattr(
        getattr(collector, "obj", None), "__name__", None
    )


def collected_in_its_own_test_module(collector: pytest.Collector, obj: Any) -> bool:
    """True for a marked object imported from another test module: that module collects it,
    so it is not collected twice. One imported from a library module (`mykernels/ops.py`
    decorated in place, or a class marked by assignment in the test module) is collected where
    it is imported, since pytest never collects the library."""
    if _defined_here(collector, obj):
        return False
    module_file = getattr(sys.modules.get(getattr(obj, "__module__", None) or ""), "__file__", None)
    if module_file is None:
        return False
    patterns = collector.config.getini("python_files")
    return any(fnmatch.fnmatch(Path(module_file).name, pattern) for pattern in patterns)


def is_an_alias_of_a_collected_kernel(collector: pytest.Collector, name: str, obj: Any) -> bool:
    """True for a second name of one kernel bound twice in one test module: it is one
    kernel, collected once. An imported one (`from lib import Double` then `double =
    pytest.mark.kernelpro(...)(Double)`) goes under the name the test module gave it; one
    defined here (`class Fused` then `fused = pytest.mark.kernelpro(...)(Fused)`) under its
    own name, which is also the name of a decorated kernel that has an alias."""
    module = getattr(collector, "obj", None)
    if module is None:
        return False
    own_name = getattr(obj, "__name__", None)
    names = [bound for bound, value in vars(module).items() if value is obj]
    if _defined_here(collector, obj):
        chosen = own_name if own_name in names else (names[0] if names else name)
    else:
        given = [bound for bound in names if bound != own_name]
        chosen = given[0] if given else own_name
    return name != chosen


def _refuse_parametrize(obj: Any, name: str) -> None:
    """A kernel is called with its inputs alone, so `@pytest.mark.parametrize` on it has no
    argument to fill: refused with the ways to get several items, not left to a TypeError
    when the kernel is called without the parameter."""
    marks = [m for m in getattr(obj, "pytestmark", []) or [] if m.name == "parametrize"]
    if not marks:
        return
    argnames = marks[0].args[0] if marks[0].args else marks[0].kwargs.get("argnames", "?")
    raise KernelproError(
        f"kernel {name!r}: @pytest.mark.parametrize({argnames!r}, ...) does not apply to a "
        "kernelpro kernel: the kernel and its reference are called with the inputs from "
        "`inputs=` alone. For several sizes, give the marker shapes=[...] (one item per "
        "shape, named like "
        f"{name}[8192x4096]; the inputs factory gets shape=); for another setting, mark one "
        "kernel per value (a function that calls yours with it)"
    )


def collect_marked(
    collector: pytest.Collector, name: str, obj: Any, mark: Any
) -> list[pytest.Item]:
    """Kernel items for a marked function or class found in a test module."""
    import inspect

    path = str(collector.path)
    lineno: int | None = None
    if _defined_here(collector, obj):
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


T = TypeVar("T")

MARKER = "marker"
TOLERANCE_BY_DTYPE = "built-in: by the reference output's dtype (measure/correctness.py)"


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A setting's value and where it came from."""

    value: T
    source: str


@dataclass(frozen=True)
class ItemSettings:
    """The settings of one kernel item, each with its source (see the module docstring)."""

    NAMES: ClassVar[tuple[str, ...]] = (
        "threshold", "trials", "rtol", "atol", "min_roofline", "device"
    )  # fmt: skip

    threshold: Resolved[float]
    trials: Resolved[int]
    rtol: Resolved[float | None]  # None: the dtype's default tolerance
    atol: Resolved[float | None]
    min_roofline: Resolved[float | None]  # None: no floor
    device: Resolved[str]  # "cuda", "cuda:N" or "cpu": the device the item runs on

    @classmethod
    def resolve(cls, problem: Problem, config: KernelproConfig, device: str) -> ItemSettings:
        """The item's settings once its `device` is chosen (the built-in threshold depends on
        it). `problem` carries the marker's values (None where the marker leaves one out)."""
        from pytest_kernelpro.gate.verdict import default_threshold

        sources = config.sources
        kind = "cuda" if device.startswith("cuda") else "cpu"

        def marker(key: str) -> str:
            return f"{MARKER} {key}="

        if problem.threshold is not None:
            threshold = Resolved(float(problem.threshold), marker("threshold"))
        elif config.threshold is not None:
            threshold = Resolved(config.threshold, sources.get("threshold", "default"))
        else:
            threshold = Resolved(default_threshold(kind), f"built-in for a {kind} kernel")
        if problem.trials is not None:
            trials = Resolved(int(problem.trials), marker("trials"))
        else:
            trials = Resolved(config.trials, sources.get("trials", "default"))
        rtol = Resolved(
            problem.rtol, marker("rtol") if problem.rtol is not None else TOLERANCE_BY_DTYPE
        )
        atol = Resolved(
            problem.atol, marker("atol") if problem.atol is not None else TOLERANCE_BY_DTYPE
        )
        if problem.min_roofline is not None:
            min_roofline = Resolved(problem.min_roofline, marker("min_roofline"))
        else:
            min_roofline = Resolved(None, "built-in: no floor")
        if problem.device_preference in ("cuda", "cpu"):
            device_source = marker("device")
        elif config.device != "auto":
            device_source = sources.get("device", "default")
        else:
            device_source = f"{sources.get('device', 'default')} (auto: {kind})"
        return cls(threshold, trials, rtol, atol, min_roofline, Resolved(device, device_source))

    def sources(self) -> dict[str, str]:
        """Setting name -> where its value came from."""
        return {name: getattr(self, name).source for name in self.NAMES}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Setting name -> {"value", "source"}: the record's `settings` (the JSON report)."""
        return {
            name: {"value": getattr(self, name).value, "source": getattr(self, name).source}
            for name in self.NAMES
        }


@dataclass(frozen=True)
class ItemRun:
    """One kernel item's run once its device is chosen: what every stage works on.

    The record is the one mutable part: each stage fills its own fields of it.
    """

    nodeid: str
    problem: Problem
    locator: ProblemLocator
    settings: ItemSettings
    record: KernelRecord
    # The test module pytest imported the marked kernel from (None for a KernelBench file):
    # the optimize stage finds the live kernel in it, and its patch keeps the module's
    # import style.
    module: Any = None

    @property
    def device(self) -> str:
        return self.settings.device.value

    @property
    def name(self) -> str:
        return self.problem.display_name


class SessionCapture:
    """Records every load_inline/load build of the session, so a kernel item whose
    extension was built (and cached) by an earlier item still finds its `.so`."""

    def __init__(self, *, extra_flags: bool = True) -> None:
        self._stack = contextlib.ExitStack()
        self.capture: ExtensionCapture | None = None
        self.extra_flags = extra_flags

    def start(self) -> None:
        try:
            from pytest_kernelpro.profile.capture import DEFAULT_CUDA_FLAGS, capture_extensions
        except ImportError:  # torch missing: nothing can be built anyway
            return
        flags = DEFAULT_CUDA_FLAGS if self.extra_flags else ()
        self.capture = self._stack.enter_context(capture_extensions(extra_cuda_cflags=flags))

    def stop(self) -> None:
        self._stack.close()

    @property
    def so_paths(self) -> list[str]:
        return self.capture.so_paths if self.capture else []

    @property
    def ptxas(self) -> list[Any]:
        return [p for b in self.capture.builds for p in b.ptxas] if self.capture else []


@dataclass
class Profiling:
    """The profile stage's setup, one per session: the builds it looks up (`capture`), the
    profiler's time limit, and the budget of automatic profiles of regressed kernels with
    what was spent of it (shared by the session's items, so it counts as they run)."""

    capture: SessionCapture | None
    timeout_s: float
    auto_limit: int  # automatic profiles per session (--kernelpro-auto-profiles)
    auto_time_s: float  # and the seconds they may take together
    auto_done: int = 0
    auto_spent_s: float = 0.0

    @classmethod
    def for_settings(cls, settings: KernelproConfig) -> Profiling:
        return cls(
            capture=None,
            timeout_s=settings.profile_timeout_s,
            auto_limit=settings.auto_profiles,
            auto_time_s=settings.auto_profile_time_s,
        )

    def auto_profile_allowed(self) -> bool:
        return self.auto_done < self.auto_limit and self.auto_spent_s < self.auto_time_s


class Services(Protocol):
    """What the optimize stage uses of the session, and all it may use of it (implemented by
    `run.session.KernelproSession`)."""

    settings: KernelproConfig  # the session-wide settings and their sources

    def add_record(self, record: KernelRecord) -> None: ...

    def search_progress(
        self, kernel: str, budget: str, max_evaluations: int | None
    ) -> SearchProgress:
        """The optimize stage's live progress display (on pytest's terminal)."""
