"""The seams of a kernel item's run: the stages see the session only through `Services`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from pytest_kernelpro.run import context, stages
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


def test_stages_use_of_the_session_stays_inside_services() -> None:
    """Every `services.X` / `session.X` the stage functions read is a member of Services
    (the entry, `run_kernel_item`, and the optimize stage take the whole session)."""
    members = _protocol_members(context.Services)
    tree = ast.parse(Path(stages.__file__).read_text(encoding="utf-8"))
    used: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("services", "session")
        ):
            used.add(node.attr)
    assert used, "the stages read nothing of the session: this test no longer looks at them"
    assert sorted(used - members) == []
