"""The sandbox's KernelBench view of a marked module kernel builds candidates with the marker's
constructor arguments.

A module kernel marked with `init_inputs=(16, 8)` is shown to the model with those arguments
("`ModelNew(*get_init_inputs())` must match"), so a candidate whose `__init__` requires them
must be built with them in the sandbox, with the reference's weights handed over whatever it
names them. Before the shim said `get_init_inputs()` was empty, every such candidate failed
to build ("missing 2 required positional arguments").
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.optimize.loop.shims import kernelbench_source  # noqa: E402
from pytest_kernelpro.optimize.sandbox.harness import _Pipeline  # noqa: E402
from pytest_kernelpro.problem import ProblemLocator  # noqa: E402
from pytest_kernelpro.profile.problem_loader import load_problem  # noqa: E402

TEST_MODULE = """
import pytest, torch
from torch import nn


class Reference(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.g = nn.Linear(features, hidden, bias=False)
        self.u = nn.Linear(features, hidden, bias=False)

    def forward(self, x):
        return torch.nn.functional.silu(self.g(x)) * self.u(x)


def inputs(device, generator=None):
    return (torch.randn(4, 16, device=device, generator=generator),)


@pytest.mark.kernelpro(reference=Reference, inputs=inputs, init_inputs=(16, 8))
class SwiGLU(Reference):
    pass
"""

CANDIDATE = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, features, hidden):  # required, as the prompt's get_init_inputs() says
        super().__init__()
        self.gate_proj = nn.Linear(features, hidden, bias=False)
        self.up_proj = nn.Linear(features, hidden, bias=False)

    def forward(self, x):
        return torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
"""


def test_a_module_kernels_candidate_is_built_with_the_markers_init_inputs(tmp_path: Path) -> None:
    path = tmp_path / "test_swiglu.py"
    path.write_text(TEST_MODULE, encoding="utf-8")
    locator = ProblemLocator(path=str(path), qualname="SwiGLU")
    problem = load_problem(locator)
    assert problem.init_inputs == (16, 8)
    run = types.SimpleNamespace(problem=problem, locator=locator)
    shim = kernelbench_source(run, "cpu")  # type: ignore[arg-type]

    pipeline = _Pipeline(
        {"reference": shim, "candidate": CANDIDATE, "seed": 0, "device": "cpu"}, lambda p: None
    )
    pipeline.build()
    assert pipeline.correctness["weights_copied"] is True
    reference_weights = list(pipeline.ref_model.state_dict().values())
    candidate_weights = list(pipeline.new_model.state_dict().values())
    assert [w.shape for w in candidate_weights] == [torch.Size([8, 16])] * 2
    assert all(torch.equal(a, b) for a, b in zip(reference_weights, candidate_weights, strict=True))
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(pipeline.new_model(x), pipeline.ref_model(x))
