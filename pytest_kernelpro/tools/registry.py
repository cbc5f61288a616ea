"""`ToolRegistry` and `run_tools`: proactive orchestration of every relevant tool.

A `ToolRegistry` is an instance: a set of tool classes by name. `ToolRegistry.builtin()`
holds the built-in tools (`tools.builtin.BUILTIN_TOOLS`); the process's default registry
(`default_registry()`) is that set plus the tools of the entry-point group
`pytest_kernelpro.tools` (an entry point may name a `ProfilingTool` subclass, a module whose
import registers tools, or a callable returning tool classes) plus those a user registers.
The class-level spellings users register with keep working and act on the default
registry: `@ToolRegistry.register`, `ToolRegistry.names()`, `ToolRegistry.get(name)`.
A search, a test or a team that wants its own set passes `registry=` to `run_tools` (or
`analysis.analyze_report`) without touching the default.

`run_tools` runs every tool whose affinity matches the Stage-1 class of each kernel and records
what it skipped and why (affinity, missing metrics or inputs, an error in the tool).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.tools.contract import AFFINITIES, ProfilingTool, ToolContext, severity_rank
from pytest_kernelpro.tools.outcome import SkippedTool, ToolResult, ToolRun
from pytest_kernelpro.tools.policies import apply_policies

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import KernelProfile, ProfileReport
    from pytest_kernelpro.tools.stage1 import Stage1

ENTRY_POINT_GROUP = "pytest_kernelpro.tools"
_BUILTIN_MODULE = "pytest_kernelpro.tools.builtin"

_R = TypeVar("_R")

# What run_tools returns lives in `outcome`; these names stay importable from here.
__all__ = [
    "ENTRY_POINT_GROUP",
    "SkippedTool",
    "ToolRegistry",
    "ToolResult",
    "ToolRun",
    "affinity_allows",
    "default_registry",
    "run_tools",
]


def affinity_allows(affinity: str, bottleneck: str | None) -> bool:
    """Whether a tool of `affinity` runs for a kernel of Stage-1 class `bottleneck`.

    Memory tools skip compute-bound kernels, compute tools skip memory-bound ones; every tool
    runs for mixed, latency-bound and unclassified kernels.
    """
    if affinity in ("always", "latency", "timeline"):
        return True
    if bottleneck in (None, "mixed", "latency"):
        return True
    return affinity == bottleneck


class _OnDefault(Generic[_R]):
    """A registry method that, called on the class (`ToolRegistry.register`), acts on the
    default registry: the spelling of the paper and of every user tool stays valid."""

    def __init__(self, func: Callable[..., _R]) -> None:
        self.func = func
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__

    def __get__(self, obj: ToolRegistry | None, owner: type | None = None) -> Callable[..., _R]:
        return types.MethodType(self.func, obj if obj is not None else default_registry())


class ToolRegistry:
    """Name -> tool class: the tools one analysis may run (module doc)."""

    def __init__(
        self, tools: Iterable[type[ProfilingTool]] = (), *, entry_points: bool = False
    ) -> None:
        """A registry of `tools`; with `entry_points`, the entry-point group's tools join on
        first use."""
        self._tools: dict[str, type[ProfilingTool]] = {}
        self._entry_points_loaded = not entry_points
        self.entry_point_errors: list[str] = []
        for tool_cls in tools:
            self._add(tool_cls)

    @classmethod
    def builtin(cls) -> ToolRegistry:
        """A new registry of the built-in tools only (no entry points)."""
        registry = cls()
        registry._add_builtin()
        return registry

    def copy(self) -> ToolRegistry:
        """An independent registry with the same tools (entry points as loaded so far)."""
        other = ToolRegistry(self._tools.values())
        other._entry_points_loaded = self._entry_points_loaded
        other.entry_point_errors = list(self.entry_point_errors)
        return other

    def _add_builtin(self) -> None:
        for tool_cls in importlib.import_module(_BUILTIN_MODULE).BUILTIN_TOOLS:
            self._add(tool_cls)

    def _add(self, tool_cls: type[ProfilingTool]) -> type[ProfilingTool]:
        if not (inspect.isclass(tool_cls) and issubclass(tool_cls, ProfilingTool)):
            raise KernelproError(
                f"@ToolRegistry.register needs a ProfilingTool subclass, got {tool_cls!r}"
            )
        if inspect.isabstract(tool_cls):
            raise KernelproError(
                f"Tool class {tool_cls.__qualname__} is abstract: implement "
                "evaluate(ctx) -> Finding | None"
            )
        name = tool_cls.name
        if not name:
            raise KernelproError(f"Tool class {tool_cls.__qualname__} has no `name`")
        if tool_cls.affinity not in AFFINITIES:
            raise KernelproError(
                f"Tool {name!r} has affinity {tool_cls.affinity!r}; use one of {', '.join(AFFINITIES)}"
            )
        existing = self._tools.get(name)
        if (
            existing is not None
            and existing is not tool_cls
            and (
                existing.__module__ != tool_cls.__module__
                or existing.__qualname__ != tool_cls.__qualname__
            )
        ):
            raise KernelproError(
                f"Tool name {name!r} of {tool_cls.__module__}.{tool_cls.__qualname__} is already "
                f"registered by {existing.__module__}.{existing.__qualname__}; rename one of them"
            )
        self._tools[name] = tool_cls
        return tool_cls

    @_OnDefault
    def register(self, tool_cls: type[ProfilingTool]) -> type[ProfilingTool]:
        """Class decorator: add `tool_cls` (its `name` must be unique). `@ToolRegistry.register`
        adds it to the default registry."""
        return self._add(tool_cls)

    @_OnDefault
    def unregister(self, name: str) -> None:
        """Remove a tool (tests, or a team disabling a built-in tool)."""
        self._tools.pop(name, None)

    @_OnDefault
    def load_entry_points(self, force: bool = False) -> list[str]:
        """Load third-party tools from the `pytest_kernelpro.tools` entry-point group.

        Returns the names of tools registered by entry points. A broken entry point warns
        (`KernelproWarning`) and is skipped; the others still load.
        """
        if self._entry_points_loaded and not force:
            return []
        self._entry_points_loaded = True
        before = set(self._tools)
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                for tool_cls in _tool_classes(obj):
                    self._add(tool_cls)
            except Exception as exc:  # a third-party plugin must not break the run
                msg = (
                    f"Could not load micro-profiling tool entry point {ep.name!r} = "
                    f"{ep.value!r} (group {ENTRY_POINT_GROUP}): {type(exc).__name__}: {exc}"
                )
                self.entry_point_errors.append(msg)
                warnings.warn(msg, KernelproWarning, stacklevel=2)
        return sorted(set(self._tools) - before)

    def _ensure_loaded(self) -> None:
        self.load_entry_points()

    @_OnDefault
    def names(self) -> list[str]:
        """Names of every registered tool."""
        self._ensure_loaded()
        return sorted(self._tools)

    @_OnDefault
    def get(self, name: str) -> type[ProfilingTool]:
        """The tool class registered as `name`."""
        self._ensure_loaded()
        try:
            return self._tools[name]
        except KeyError:
            raise KernelproError(
                f"Unknown micro-profiling tool {name!r}; registered tools: {', '.join(sorted(self._tools))}"
            ) from None

    @_OnDefault
    def tool_classes(self) -> list[type[ProfilingTool]]:
        """Every registered tool class, by name."""
        self._ensure_loaded()
        return [self._tools[name] for name in sorted(self._tools)]

    @_OnDefault
    def create(
        self,
        names: Iterable[str] | None = None,
        thresholds: Mapping[str, Mapping[str, float]] | None = None,
    ) -> list[ProfilingTool]:
        """Instances of the named tools (all when None), with per-tool threshold overrides."""
        self._ensure_loaded()
        chosen = sorted(self._tools) if names is None else list(names)
        overrides = dict(thresholds or {})
        unknown = sorted(set(overrides) - set(chosen))
        if unknown:
            raise KernelproError(
                f"Threshold overrides for unknown or unselected tools: {', '.join(unknown)}; "
                f"registered tools: {', '.join(sorted(self._tools))}"
            )
        return [self.get(name)(overrides.get(name)) for name in chosen]

    @_OnDefault
    def run(
        self,
        report: ProfileReport,
        stage1: Stage1 | Mapping[str, Stage1] | None = None,
        **kw: Any,
    ) -> ToolRun:
        """`run_tools` with this registry (the paper's spelling)."""
        return run_tools(report, stage1, registry=self, **kw)

    @_OnDefault
    def generate_prompt_guidance(
        self,
        report: ProfileReport,
        tool_run: ToolRun,
        stage1: Stage1 | None = None,
        mode: str = "tools",
    ) -> str:
        """Alias of `guidance.generate_prompt_guidance` (the paper's spelling)."""
        from pytest_kernelpro.tools.guidance import generate_prompt_guidance

        return generate_prompt_guidance(report, tool_run, stage1, mode=mode)

    def __repr__(self) -> str:
        return f"<ToolRegistry {len(self._tools)} tools>"


_default: ToolRegistry | None = None


def default_registry() -> ToolRegistry:
    """The process's registry: the built-in tools, the entry-point group's (loaded on first
    use) and every tool registered with `@ToolRegistry.register`."""
    global _default
    if _default is None:
        registry = ToolRegistry(entry_points=True)
        registry._add_builtin()
        _default = registry
    return _default


def _tool_classes(obj: object) -> list[type[ProfilingTool]]:
    """Tool classes an entry point refers to: a class, a module, or a callable returning them."""
    if inspect.isclass(obj):
        if issubclass(obj, ProfilingTool):
            return [obj]
        raise KernelproError(f"{obj!r} is not a ProfilingTool subclass")
    if inspect.ismodule(obj):
        # Importing the module ran its @ToolRegistry.register decorators; also pick up
        # undecorated concrete subclasses defined there.
        return [
            member
            for member in vars(obj).values()
            if inspect.isclass(member)
            and issubclass(member, ProfilingTool)
            and member.__module__ == obj.__name__
            and not inspect.isabstract(member)
            and member.name
        ]
    if callable(obj):
        result = obj()
        classes = list(result) if isinstance(result, Iterable) else [result]
        out: list[type[ProfilingTool]] = []
        for item in classes:
            out.extend(_tool_classes(item))
        return out
    raise KernelproError(f"Entry point object {obj!r} is not a tool class, module or callable")


def _stage1_for(
    stage1: Stage1 | Mapping[str, Stage1] | None, kernel: KernelProfile | None
) -> Stage1 | None:
    if stage1 is None or not isinstance(stage1, Mapping):
        return stage1
    if kernel is None:
        return None
    return stage1.get(kernel.name)


def run_tools(
    report: ProfileReport,
    stage1: Stage1 | Mapping[str, Stage1] | None = None,
    *,
    tools: Iterable[str | ProfilingTool] | None = None,
    thresholds: Mapping[str, Mapping[str, float]] | None = None,
    op_category: str | None = None,
    min_bytes: float | None = None,
    flops: float | None = None,
    dtype: str | None = None,
    roofline_fraction: float | None = None,
    timed_median_s: float | None = None,
    near_roofline_pct: float = 80.0,
    library_max_severity: str = "medium",
    affinity_mode: str = "final",
    registry: ToolRegistry | None = None,
) -> ToolRun:
    """Run every relevant tool on every kernel of `report`.

    `stage1` is one classification for the item or a mapping kernel name -> classification.
    Kernel-scope tools run once per kernel; item-scope tools (timeline, fusion) once per
    report, seeing every kernel of it. Two policies keep severities honest:
    - near the roofline: when a kernel already runs at >= `near_roofline_pct` of a hardware
      peak (DRAM bandwidth or a compute pipe) or the item at that share of its roofline
      (the highest of these counts, `signals.saturation`), findings of
      tools whose fix cannot move that roof are capped at "low" and their estimates at the
      remaining headroom (100 / pct);
    - library kernels (cuBLAS, CUTLASS, nvjet, PyTorch's own): capped at
      `library_max_severity`, since the user can change the call but not the kernel.

    `affinity_mode` "final" (the design: tools of the final Stage-1 class) or "both": when
    the theoretical and measured classes disagree, also run the measured class's tools (the
    kernel's current bottleneck), e.g. coalescing on a compute-bound GEMM that is stuck on
    memory today.

    `registry`: where tool names are looked up (the default registry when None).
    """
    severity_rank(library_max_severity)
    if affinity_mode not in ("final", "both"):
        raise KernelproError(f"Unknown affinity_mode {affinity_mode!r}; use 'final' or 'both'")
    registry = default_registry() if registry is None else registry
    if tools is None:
        instances = registry.create(thresholds=thresholds)
    else:
        names = [t for t in tools if isinstance(t, str)]
        given = [t for t in tools if isinstance(t, ProfilingTool)]
        instances = registry.create(names, thresholds=thresholds) + given
    run = ToolRun()
    common = dict(
        arch=report.arch,
        op_category=op_category,
        timeline=report.timeline,
        linkage=report.linkage,
        min_bytes=min_bytes,
        flops=flops,
        dtype=dtype,
        roofline_fraction=roofline_fraction,
        timed_median_s=timed_median_s,
        kernels=tuple(report.kernels),
    )
    kernel_tools = [t for t in instances if t.scope == "kernel"]
    item_tools = [t for t in instances if t.scope != "kernel"]
    for kernel in report.kernels:
        ctx = ToolContext(kernel=kernel, stage1=_stage1_for(stage1, kernel), **common)  # type: ignore[arg-type]
        if ctx.stage1 is not None:
            run.stage1[kernel.name] = ctx.stage1
        for tool in kernel_tools:
            _run_one(tool, ctx, run, near_roofline_pct, library_max_severity, affinity_mode)
    if item_tools:
        item_stage1 = stage1 if not isinstance(stage1, Mapping) else None
        ctx = ToolContext(kernel=None, stage1=item_stage1, **common)  # type: ignore[arg-type]
        for tool in item_tools:
            _run_one(tool, ctx, run, near_roofline_pct, library_max_severity, affinity_mode)
    return run


def _run_one(
    tool: ProfilingTool,
    ctx: ToolContext,
    run: ToolRun,
    near_roofline_pct: float,
    library_max_severity: str,
    affinity_mode: str = "final",
) -> None:
    kernel = ctx.kernel_name
    allowed = affinity_allows(tool.affinity, ctx.bottleneck)
    s1 = ctx.stage1
    if not allowed and affinity_mode == "both" and s1 is not None and s1.measured != s1.cls:
        allowed = affinity_allows(tool.affinity, s1.measured)
    if not allowed:
        run.skipped.append(
            SkippedTool(
                tool.name,
                kernel,
                "affinity",
                detail=f"{tool.affinity} tool skipped for a {ctx.bottleneck}-bound kernel",
            )
        )
        return
    missing = tool.missing_inputs(ctx)
    if missing:
        run.skipped.append(SkippedTool(tool.name, kernel, "missing_metrics", tuple(missing)))
        return
    try:
        finding = tool.evaluate(ctx)
        fired = finding is not None
    except Exception as exc:  # one broken (possibly third-party) tool must not stop the others
        detail = f"{type(exc).__name__}: {exc}"
        run.skipped.append(SkippedTool(tool.name, kernel, "error", detail=detail))
        warnings.warn(
            f"Micro-profiling tool {tool.name!r} failed on kernel {kernel!r}: {detail}",
            KernelproWarning,
            stacklevel=3,
        )
        return
    run.results.append(ToolResult(tool.name, kernel, fired))
    if finding is not None:
        run.findings.append(
            apply_policies(tool, ctx, finding, near_roofline_pct, library_max_severity)
        )
