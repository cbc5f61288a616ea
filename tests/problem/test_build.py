"""The reference and candidate models of a KernelBench problem are built one way everywhere.

The gate (`problem_from_kernelbench(...).instantiate`), the sandbox worker (`harness`), the
trusted judge and the final re-measurement build (through `problem/build.py`) `Model(*get_init_inputs())` and `ModelNew`
with one seed and hand the reference's weights to the candidate by `share_weights`' rule.
With the same seed, the reference each of them builds has bit-identical weights and outputs
on the CPU, and a candidate that names its weights differently gets the reference's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.optimize.sandbox import judge  # noqa: E402
from pytest_kernelpro.optimize.sandbox.built_models import build_models  # noqa: E402
from pytest_kernelpro.optimize.sandbox.harness import _Pipeline  # noqa: E402
from pytest_kernelpro.optimize.sandbox.loader import load_source  # noqa: E402
from pytest_kernelpro.problem.kernelbench import problem_from_kernelbench  # noqa: E402

PROBLEM = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.linear = nn.Linear(features, hidden)
        self.register_buffer("scale", torch.rand(hidden))

    def forward(self, x):
        return torch.tanh(self.linear(x)) * self.scale


class ModelNew(nn.Module):
    # Same layout, other names: the weights go over by position and shape.
    def __init__(self, features, hidden):
        super().__init__()
        self.register_buffer("s", torch.ones(hidden))
        self.p = nn.ParameterList([torch.randn(hidden, features), torch.randn(hidden)])

    def forward(self, x):
        return torch.tanh(x @ self.p[0].t() + self.p[1]) * self.s


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16, 8]
"""


def _values(module: Any) -> list[Any]:
    return list(module.state_dict().values())


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture
def problem_file(tmp_path: Path) -> Path:
    path = tmp_path / "linear_tanh.py"
    path.write_text(PROBLEM, encoding="utf-8")
    return path


def _sandbox_task(seed: int) -> dict[str, Any]:
    return {"reference": PROBLEM, "candidate": PROBLEM, "seed": seed, "device": "cpu"}


def test_gate_worker_and_judge_build_the_same_reference_and_candidate(problem_file: Path) -> None:
    kernel, reference = problem_from_kernelbench(problem_file).instantiate("cpu")
    pipeline = _Pipeline(_sandbox_task(0), lambda phase: None)
    pipeline.build()
    judged = judge._Reference(_sandbox_task(0)).model
    # The re-measurement's worker builds both from one namespace (Model and ModelNew).
    remeasured = build_models(load_source(PROBLEM, "kp_test_remeasure_build"), "cpu", seed=0)

    expected = _values(reference)
    assert _same(_values(pipeline.ref_model), expected)
    assert _same(_values(judged), expected)
    assert _same(_values(remeasured.reference), expected)
    assert _same(_values(remeasured.kernel.model), expected)
    assert remeasured.kernel.how == "copied by position and shape"
    # ModelNew names its weights s, p.0, p.1: it gets the reference's by position and shape.
    assert list(kernel.state_dict()) == ["s", "p.0", "p.1"]
    assert _same(_values(kernel), expected)
    assert _same(_values(pipeline.new_model), expected)
    assert pipeline.correctness["weights_copied"] is True
    assert pipeline.correctness["weights"] == "copied by position and shape"

    torch.manual_seed(5)
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = reference(x)
        models = (pipeline.ref_model, judged, kernel, pipeline.new_model)
        for model in (*models, remeasured.reference, remeasured.kernel.model):
            assert torch.equal(model(x), out)
    assert all(not m.training for m in (reference, *models[1:], remeasured.kernel.model))


def test_the_seed_decides_the_weights(problem_file: Path) -> None:
    """The comparison above can fail: another seed gives other weights."""
    _, reference = problem_from_kernelbench(problem_file).instantiate("cpu")
    other = judge._Reference(_sandbox_task(1)).model
    assert not _same(_values(other), _values(reference))
