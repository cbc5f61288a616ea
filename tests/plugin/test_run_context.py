"""The seams of a kernel item's run: the stages take values, never the session; the
optimizer's one seam sees the session only through `Services`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.loop import compose
from pytest_kernelpro.optimize.loop import item as optimize_item
from pytest_kernelpro.run import context, item_runner
from pytest_kernelpro.run.session import KernelproSession


def _protocol_members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}
    names |= {n for n, v in vars(protocol).items() if isinstance(v, property)}
    return names


def test_the_session_implements_services() -> None:
    members = _protocol_members(context.Services)
    assert {"settings", "add_record", "config"} <= members
    fields = {f.name for f in dataclasses.fields(KernelproSession)}
    missing = sorted(m for m in members if m not in fields and not hasattr(KernelproSession, m))
    assert missing == []
    for name in members - fields:
        ours, theirs = getattr(KernelproSession, name), getattr(context.Services, name)
        if callable(theirs) and not isinstance(theirs, property):
            assert list(inspect.signature(ours).parameters) == list(
                inspect.signature(theirs).parameters
            ), name


def _attributes_read(module: object, names: tuple[str, ...]) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    used: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in names
        ):
            used.add(node.attr)
    return used


@pytest.mark.parametrize("module", [optimize_item, compose], ids=str)
def test_the_optimizer_seam_uses_only_services(module: object) -> None:
    """Every `services.X` the optimize stage reads is a member of Services."""
    members = _protocol_members(context.Services)
    used = _attributes_read(module, ("services", "session"))
    assert used, f"{module} reads nothing of the session: this test no longer looks at it"
    assert sorted(used - members) == []


# The functions of item_runner.py that hold the pytest item or the session: the entry, its
# guards and the order. Every other function there is a stage or a stage's helper and takes
# values; a new function that needs the session must be added here on purpose.
ORCHESTRATORS = frozenset(
    {
        "new_record",
        "run_kernel_item",
        "_run_limited",
        "_measure_ceilings_first",
        "_run",
        "_device_model",
        "_noting_cuda_errors",
        "_start",
    }
)
STAGES = ("check", "time_item", "recheck", "roofline", "profile", "gate", "roofline_floor")


def _functions(module: object) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _value_taking_parts(module: object) -> list[ast.AST]:
    """The module's code that must take values: all of it, except item_runner's orchestrators."""
    if module is not item_runner:
        return [ast.parse(Path(module.__file__).read_text(encoding="utf-8"))]
    functions = _functions(module)
    assert set(STAGES) | {"remeasure_only"} <= set(functions)
    assert ORCHESTRATORS <= set(functions), "an orchestrator was renamed: update ORCHESTRATORS"
    return [f for name, f in functions.items() if name not in ORCHESTRATORS]


def _attributes_read_in(parts: list[ast.AST], names: tuple[str, ...]) -> set[str]:
    return {
        node.attr
        for part in parts
        for node in ast.walk(part)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in names
    }


@pytest.mark.parametrize("module", [item_runner, context], ids=str)
def test_the_stages_take_values_not_the_session(module: object) -> None:
    """The stages take the item's run and values (settings, ceilings, the baseline entry,
    the profiling setup): no pytest item, no session object or protocol, not even by name."""
    parts = _value_taking_parts(module)
    nodes = [n for part in parts for n in ast.walk(part)]
    names = {n.id for n in nodes if isinstance(n, ast.Name)}
    args = {a.arg for n in nodes if isinstance(n, ast.arguments) for a in n.args}
    args |= {a.arg for n in nodes if isinstance(n, ast.arguments) for a in n.kwonlyargs}
    forbidden = {"item", "session", "services", "KernelItem", "KernelproSession", "Services"}
    assert forbidden & (names | args) == set()
    imported = {node.module or "" for node in nodes if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.endswith(("items", "session"))}
    assert "run" in args
    assert _attributes_read_in(parts, ("services", "session")) == set()


def test_the_gate_stage_is_given_the_baseline_entry() -> None:
    """The item's run looks the entry up once; the gate stage does not load a baseline."""
    parameters = inspect.signature(item_runner.gate).parameters
    assert {"entry", "config", "profiling"} <= set(parameters)
    gate_stage = [_functions(item_runner)["gate"]]
    assert "baseline" not in _attributes_read_in(gate_stage, ("services", "session", "run"))
