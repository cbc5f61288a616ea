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
from pytest_kernelpro.run import context, stages
from pytest_kernelpro.run.session import KernelproSession


def _protocol_members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}
    names |= {n for n, v in vars(protocol).items() if isinstance(v, property)}
    return names


def test_the_session_implements_services() -> None:
    members = _protocol_members(context.Services)
    assert {"settings", "add_record", "search_progress"} <= members
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


@pytest.mark.parametrize("module", [stages, context], ids=str)
def test_the_stages_take_values_not_the_session(module: object) -> None:
    """The stages take the item's run and values (settings, ceilings, the baseline entry,
    the profiling setup): no pytest item, no session object or protocol, not even by name."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    args = {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
    args |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.kwonlyargs}
    forbidden = {"item", "session", "services", "KernelItem", "KernelproSession", "Services"}
    assert forbidden & (names | args) == set()
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.endswith(("items", "session"))}
    assert "run" in args
    assert _attributes_read(module, ("services", "session")) == set()


def test_the_gate_stage_is_given_the_baseline_entry() -> None:
    """The item's run looks the entry up once; the gate stage does not load a baseline."""
    parameters = inspect.signature(stages.gate).parameters
    assert {"entry", "config", "profiling"} <= set(parameters)
    assert "baseline" not in _attributes_read(stages, ("services", "session", "run"))
