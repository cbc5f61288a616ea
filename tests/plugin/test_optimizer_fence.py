"""The optimizer is a plugin of its own, and the gate never imports it.

The check job runs on every pull request; the optimizer (search, sandbox, agents, builds) is
most of the package and none of it is needed there. The fence is checked twice: from the
source (no module outside `pytest_kernelpro/optimize/` names the package in an import, an
`importlib` call or any string, at module level, in a function or under TYPE_CHECKING) and
at run time (what a check session loads, with the optimizer plugin on and off).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import pytest_kernelpro

PACKAGE = Path(pytest_kernelpro.__file__).parent
OPTIMIZER = "pytest_kernelpro.optimize"
# What the optimizer plugin's entry point loads in every session: its hooks and its options
# (not the settings' resolution, `search_config`).
ALWAYS_LOADED = {OPTIMIZER, f"{OPTIMIZER}.plugin", f"{OPTIMIZER}.settings"}


def optimizer_references(source: str, module: str) -> list[str]:
    """Every place `source` (the module `module`) names the optimizer: imports (absolute or
    relative, `from pytest_kernelpro import optimize` too) and string constants."""
    found: list[str] = []
    package_parts = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package_parts[: len(package_parts) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A module named as text, for importlib or another process's command line.
            if OPTIMIZER in node.value.replace("/", "."):
                found.append(f"line {node.lineno}: string {node.value[:80]!r}")
        found += [
            f"line {node.lineno}: import {name}"
            for name in names
            if name == OPTIMIZER or name.startswith(f"{OPTIMIZER}.")
        ]
    return found


def test_no_module_outside_the_optimizer_names_it() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        if relative.parts[:2] == ("pytest_kernelpro", "optimize"):
            continue
        module = ".".join(relative.with_suffix("").parts)
        refs = optimizer_references(path.read_text(encoding="utf-8"), module)
        if refs:
            offenders[str(relative)] = refs
    assert offenders == {}


@pytest.mark.parametrize(
    "source",
    [
        "import pytest_kernelpro.optimize.loop.item",
        "from pytest_kernelpro.optimize import plugin",
        "from pytest_kernelpro import optimize",
        "def f():\n    from pytest_kernelpro.optimize.search import budget",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_kernelpro.optimize.search_config import OptimizeConfig",
        "import importlib\nimportlib.import_module('pytest_kernelpro.optimize.search.show')",
        "CODE = 'from pytest_kernelpro.optimize.sandbox import worker'",
        "from ..optimize.loop import item",
    ],
)
def test_the_source_check_sees_every_form_of_import(source: str) -> None:
    """The check above can fail: each form, written in a gate module, is found."""
    assert optimizer_references(source, "pytest_kernelpro.run.item_runner")


KERNELS = """
import pytest
import torch

def inp(device):
    return (torch.randn(256, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, trials=2)
def neg(x):
    return -x
"""

# Written into the inner project: records every pytest_kernelpro module loaded when the process
# exits (at exit, so a session stopped by a usage error is recorded too).
SPY = """
import atexit, json, sys

@atexit.register
def record_loaded_modules():
    loaded = sorted(m for m in sys.modules if m.startswith("pytest_kernelpro"))
    with open("loaded-modules.json", "w") as f:
        json.dump(loaded, f)
"""


def loaded_modules(kp_project: pytest.Pytester, *args: str) -> tuple[list[str], int]:
    kp_project.makepyfile(test_kernels=KERNELS)
    kp_project.makeconftest(SPY)
    result = kp_project.runpytest_subprocess(*args)
    return json.loads((kp_project.path / "loaded-modules.json").read_text()), int(result.ret)


def test_a_check_session_loads_only_the_optimizers_hooks(kp_project: pytest.Pytester) -> None:
    loaded, ret = loaded_modules(kp_project, "--kernelpro-check", "--kernelpro-save-baseline")
    assert ret == 0
    assert (kp_project.path / "kernelpro-baseline.yaml").is_file()  # the kernel really ran
    assert "pytest_kernelpro.run.item_runner" in loaded
    optimizer = {m for m in loaded if m.startswith(OPTIMIZER)}
    assert optimizer <= ALWAYS_LOADED, f"a check session imported the optimizer: {optimizer}"


def test_a_check_session_works_with_the_optimizer_plugin_disabled(
    kp_project: pytest.Pytester,
) -> None:
    loaded, ret = loaded_modules(
        kp_project, "-p", "no:kernelpro_optimize", "--kernelpro-check", "--kernelpro-save-baseline"
    )
    assert ret == 0
    assert (kp_project.path / "kernelpro-baseline.yaml").is_file()
    assert [m for m in loaded if m.startswith(OPTIMIZER)] == []


def test_the_spy_sees_the_optimizer_when_it_is_asked_for(kp_project: pytest.Pytester) -> None:
    """The spy above can fail: an optimize session loads the optimizer (its preflight stops
    this one, without a model backend, but only after importing it)."""
    loaded, _ = loaded_modules(kp_project, "--kernelpro-optimize=1", "--co")
    assert set(loaded) - ALWAYS_LOADED & {m for m in loaded if m.startswith(OPTIMIZER)}


def test_the_optimizer_plugin_alone_leaves_a_session_working(pytester: pytest.Pytester) -> None:
    """With the gate disabled (`-p no:kernelpro`) the optimizer's hooks into the gate are
    optional: the session runs its ordinary tests instead of failing on unknown hooks."""
    pytester.makepyfile(test_plain="def test_a():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest("-p", "no:kernelpro")
    result.assert_outcomes(passed=1)
