"""Tools are self-contained rules: no tool module imports another tool module (directly or
through a helper), and the registry is an instance, not class-level state."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from tools_factories import report

import pytest_kernelpro.tools as tools_pkg
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.tools import Finding, MetricRequest, ProfilingTool, ToolContext, ToolRegistry
from pytest_kernelpro.tools.builtin import BUILTIN_TOOLS
from pytest_kernelpro.tools.registry import default_registry, run_tools

PACKAGE = tools_pkg.__name__
PACKAGE_DIR = Path(tools_pkg.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    return {
        f"{PACKAGE}.{info.name}": PACKAGE_DIR / f"{info.name}.py"
        for info in pkgutil.iter_modules([str(PACKAGE_DIR)])
        if not info.ispkg
    }


def _tool_modules() -> set[str]:
    """Modules that define a concrete ProfilingTool subclass."""
    found = set()
    for name in _modules():
        module = importlib.import_module(name)
        for member in vars(module).values():
            if (
                inspect.isclass(member)
                and issubclass(member, ProfilingTool)
                and member.__module__ == name
                and not inspect.isabstract(member)
            ):
                found.add(name)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """Modules of this package that `path` imports (every import, function-level ones too;
    `if TYPE_CHECKING:` blocks left out) -> first line."""
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in modules:
            found.setdefault(target, line)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = f"{PACKAGE}.{base}" if base else PACKAGE
                add(base, child.lineno)
                for alias in child.names:
                    add(f"{base}.{alias.name}", child.lineno)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def test_the_builtin_list_names_every_tool_module() -> None:
    tool_modules = _tool_modules()
    assert len(tool_modules) >= 10
    assert {cls.__module__ for cls in BUILTIN_TOOLS} == tool_modules
    assert sorted(cls.name for cls in BUILTIN_TOOLS) == ToolRegistry.builtin().names()


def test_no_tool_module_imports_another_tool_module() -> None:
    modules = _modules()
    tool_modules = _tool_modules()
    edges = {name: _imports(path, modules) for name, path in modules.items()}
    bad = []
    for tool in sorted(tool_modules):
        # Walk what the tool imports, through helper modules, to any other tool module.
        seen, stack = {tool}, [(tool, [tool])]
        while stack:
            here, chain = stack.pop()
            for target, line in edges[here].items():
                if target in seen:
                    continue
                seen.add(target)
                step = [*chain, f"{target} (line {line} of {here})"]
                if target in tool_modules:
                    bad.append(" -> ".join(step))
                else:
                    stack.append((target, step))
    assert bad == []


def test_the_isolation_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "fake.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pytest_kernelpro.tools import memory\n"
        "def f():\n    from pytest_kernelpro.tools.stalls import WarpStallTool\n"
        "    from . import dram\n",
        encoding="utf-8",
    )
    found = _imports(module, _modules())
    assert f"{PACKAGE}.stalls" in found
    assert f"{PACKAGE}.dram" in found
    assert f"{PACKAGE}.memory" not in found  # only under TYPE_CHECKING


class _Marker(ProfilingTool):
    name = "isolation_marker"
    description = "fires on metric x"
    required_metrics = (MetricRequest("x", "x"),)

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        return self.make_finding(ctx, severity="low", title="x seen", root_cause="x")


def test_registries_are_independent_instances() -> None:
    mine = ToolRegistry()
    assert mine.names() == []
    assert mine.register(_Marker) is _Marker
    assert mine.names() == ["isolation_marker"]
    assert "isolation_marker" not in ToolRegistry.names()  # the default is untouched
    assert "isolation_marker" not in default_registry().names()
    run = run_tools(report({"x": 1.0}), registry=mine)
    assert [(f.tool, f.title) for f in run.findings] == [("isolation_marker", "x seen")]
    # The default registry does not know it.
    with pytest.raises(KernelproError, match="Unknown micro-profiling tool 'isolation_marker'"):
        run_tools(report({"x": 1.0}), tools=["isolation_marker"])
    builtin = ToolRegistry.builtin()
    builtin.unregister("warp_stalls")
    assert "warp_stalls" not in builtin.names()
    assert "warp_stalls" in ToolRegistry.names()
    copy = mine.copy()
    copy.unregister("isolation_marker")
    assert mine.names() == ["isolation_marker"]


def test_class_level_spelling_acts_on_the_default_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_kernelpro.tools import registry as registry_module

    monkeypatch.setattr(registry_module, "_default", default_registry().copy())
    assert ToolRegistry.register(_Marker) is _Marker
    assert "isolation_marker" in default_registry().names()
    assert ToolRegistry.get("isolation_marker") is _Marker
    assert [f.tool for f in ToolRegistry.run(report({"x": 1.0})).findings] == ["isolation_marker"]


def test_run_tools_evaluates_each_tool_once_per_kernel() -> None:
    calls: list[str] = []

    class Counting(ProfilingTool):
        name = "counting_tool"
        description = "counts its evaluations"
        required_metrics = (MetricRequest("x", "x"),)

        def evaluate(self, ctx: ToolContext) -> Finding | None:
            calls.append(ctx.kernel_name)
            if (ctx.value("x") or 0.0) < 1.0:
                return None
            return self.make_finding(ctx, severity="low", title="x", root_cause="x")

    registry = ToolRegistry([Counting])
    run = run_tools(report({"x": 2.0}), registry=registry)
    assert calls == ["k(float*)"]
    assert [(r.tool, r.triggered) for r in run.results] == [("counting_tool", True)]
    run = run_tools(report({"x": 0.5}), registry=registry)
    assert calls == ["k(float*)", "k(float*)"]
    assert [(r.tool, r.triggered) for r in run.results] == [("counting_tool", False)]
