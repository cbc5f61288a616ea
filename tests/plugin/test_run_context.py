"""The seams of a kernel item's run: the stages see the session only through `Services`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from pytest_kernelpro.run import context, item_runner, optimize, optimize_search, profile, stages
from pytest_kernelpro.run.session import KernelproSession


def _protocol_members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}
    names |= {n for n, v in vars(protocol).items() if isinstance(v, property)}
    return names


def test_the_session_implements_services() -> None:
    members = _protocol_members(context.Services)
    assert {"settings", "choose_device", "ceilings_for", "baseline", "write_outputs"} <= members
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


@pytest.mark.parametrize(
    "module", [item_runner, stages, optimize, optimize_search, profile], ids=str
)
def test_stages_use_of_the_session_stays_inside_services(module: object) -> None:
    """Every `services.X` / `session.X` the stage functions read is a member of Services
    (the entry, `run_kernel_item`, takes the whole session and hands the stages Services)."""
    members = _protocol_members(context.Services)
    used = _attributes_read(module, ("services", "session"))
    assert used, f"{module} reads nothing of the session: this test no longer looks at it"
    assert sorted(used - members) == []


@pytest.mark.parametrize("module", [stages, optimize, optimize_search, profile], ids=str)
def test_the_stages_get_the_run_not_the_item(module: object) -> None:
    """They take ItemRun and Services: no pytest item, no session object, not even by name."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
    assert {"item", "session", "KernelItem", "KernelproSession", "pytest"} & names == set()
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.endswith(("items", "session"))}
    assert {"run", "services"} <= {
        a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args
    }
