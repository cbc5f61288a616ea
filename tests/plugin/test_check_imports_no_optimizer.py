"""A `--kernelpro-check` session never imports the optimizer (`pytest_kernelpro.optimize`).

The check job runs on every pull request; the optimizer (search, sandbox, agents, builds) is
most of the package and none of it is needed there. The boundary is the one seam in the item's
run (`optimize.loop.item.optimize_item`), reached only under `--kernelpro-optimize`.
"""

from __future__ import annotations

import json

import pytest

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


def loaded_modules(kp_project: pytest.Pytester, *args: str) -> list[str]:
    kp_project.makepyfile(test_kernels=KERNELS)
    kp_project.makeconftest(SPY)
    kp_project.runpytest_subprocess(*args)
    return json.loads((kp_project.path / "loaded-modules.json").read_text())


def test_a_check_session_imports_no_optimizer_module(kp_project: pytest.Pytester) -> None:
    loaded = loaded_modules(kp_project, "--kernelpro-check", "--kernelpro-save-baseline")
    assert (kp_project.path / "kernelpro-baseline.yaml").is_file()  # the kernel really ran
    assert "pytest_kernelpro.run.item_runner" in loaded
    optimizer = [m for m in loaded if m.startswith("pytest_kernelpro.optimize")]
    assert optimizer == [], f"a check session imported the optimizer: {optimizer}"


def test_the_spy_sees_the_optimizer_when_it_is_asked_for(kp_project: pytest.Pytester) -> None:
    """The spy above can fail: an optimize session loads the optimizer (its preflight stops
    this one, without a model backend, but only after importing it)."""
    loaded = loaded_modules(kp_project, "--kernelpro-optimize=1", "--co")
    assert any(m.startswith("pytest_kernelpro.optimize") for m in loaded)
