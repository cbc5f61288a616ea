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
from pytest_kernelpro.run import context, fresh_process, item_runner, profile_stage, stages
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
# guards, the item's state built once, and the order. Every other function there, and every
# stage module, takes values; a new function that needs the session must be added here on
# purpose.
ORCHESTRATORS = frozenset(
    {
        "new_record",
        "run_kernel_item",
        "_run_limited",
        "_device_model",
        "_usable_device",
        "_item_state",
        "_run",
        "_build_kernel",
        "_measure",
        "_price_and_gate",
        "_noting_cuda_errors",
        "_start",
    }
)
STAGES = {
    stages: ("check", "time_item", "recheck", "roofline", "roofline_floor", "gate"),
    profile_stage: ("profile", "auto_profile"),
}


def _functions(module: object) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _value_taking_parts(module: object) -> list[ast.AST]:
    """The module's code that must take values: all of it, except item_runner's orchestrators;
    of fresh_process (whose parent side starts pytest on the item), the child's run."""
    if module is fresh_process:
        return [_functions(module)["remeasure_only"]]
    if module is not item_runner:
        return [ast.parse(Path(module.__file__).read_text(encoding="utf-8"))]
    functions = _functions(module)
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


@pytest.mark.parametrize("module", [item_runner, context, fresh_process, *STAGES], ids=str)
def test_the_stages_take_values_not_the_session(module: object) -> None:
    """The stages take the item's state and values (the kernel, its inputs, the profiling
    setup): no pytest item, no session object or protocol, not even by name."""
    if module in STAGES:
        assert set(STAGES[module]) <= set(_functions(module)), "a stage was renamed"
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


def test_the_gate_stage_reads_the_baseline_entry_from_the_items_state() -> None:
    """The item's state holds the entry, looked up once; the gate stage loads no baseline."""
    parameters = inspect.signature(stages.gate).parameters
    assert "profiling" in parameters
    assert not {"entry", "config", "baseline"} & set(parameters)
    read = _attributes_read_in([_functions(stages)["gate"]], ("run",))
    assert {"baseline_entry", "baseline_error", "session_settings"} <= read
    assert "baseline" not in read


# What the item's state holds is derived once per item, in item_runner's `_run_limited` and
# `_item_state`: a second call of any of these in run/ (outside the session, which defines
# them) is a stage re-deriving the device, threads, ceilings, limit or baseline entry.
ONCE_PER_ITEM = (
    "choose_device",
    "policy_threads",
    "cpu_thread_policy",
    "ceilings_for",
    "spec_for",
    "baseline",
    "entry_for",
    "time_limit_setting",
    "ItemSettings",
)


def _calls_of(module_path: Path, name: str) -> list[int]:
    tree = ast.parse(module_path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called == name or (
            isinstance(func, ast.Attribute)
            and func.attr == "resolve"
            and isinstance(func.value, ast.Name)
            and func.value.id == name
        ):
            lines.append(node.lineno)
    return lines


def test_the_items_state_is_derived_once() -> None:
    run_dir = Path(item_runner.__file__).parent
    calls = {
        name: {
            path.name: found
            for path in sorted(run_dir.glob("*.py"))
            if path.name != "session.py" and (found := _calls_of(path, name))
        }
        for name in ONCE_PER_ITEM
    }
    per_item = {name: where for name, where in calls.items() if "item_runner.py" in where}
    # The item-state derivations happen in item_runner, once each; the time limit's
    # setting is also read by the isolating parent, which builds no item state (its child
    # does).
    allowed_elsewhere = {"time_limit_setting": {"isolate.py"}}
    for name, where in calls.items():
        assert name in per_item, f"{name} is no longer called by item_runner: update the test"
        assert len(where["item_runner.py"]) == 1, (name, where)
        assert set(where) - {"item_runner.py"} <= allowed_elsewhere.get(name, set()), (name, where)


def test_a_stage_that_looks_the_ceilings_up_again_is_caught(tmp_path: Path) -> None:
    """The check above finds a stage that asks the session for ceilings a second time."""
    stage = tmp_path / "sneaky_stage.py"
    stage.write_text("def roofline(run, kp):\n    return kp.ceilings_for(run.device)\n")
    assert _calls_of(stage, "ceilings_for") == [2]
    resolved = tmp_path / "resolves.py"
    resolved.write_text("def f(p, c, d):\n    return ItemSettings.resolve(p, c, d)\n")
    assert _calls_of(resolved, "ItemSettings") == [2]
