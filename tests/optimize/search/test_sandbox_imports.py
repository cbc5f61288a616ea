"""The sandbox's child processes (worker, judge, re-measurement) import the gate's
measurement stack (`measure/`, `problem/`) and nothing of the pytest session: no plugin, no
item run, no gate. They run it as well: inputs, reference, verdict and timer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

CHILD = r"""
import json, sys
import torch
from pytest_kernelpro.optimize.sandbox import harness
from pytest_kernelpro.optimize.sandbox import judge
from pytest_kernelpro.optimize.sandbox import measurement
from pytest_kernelpro.optimize.sandbox import remeasure
from pytest_kernelpro.optimize.sandbox import worker
from pytest_kernelpro.optimize.sandbox.loader import load_source

module = load_source(
    "import torch\n"
    "class Model(torch.nn.Module):\n"
    "    def forward(self, x):\n        return x * 2\n"
    "def get_inputs():\n    return [torch.randn(16)]\n",
    "kp_child_reference",
)
args = measurement.make_inputs(module, 7, "cpu")
again = measurement.make_inputs(module, 7, "cpu")
model = module.Model()
out, reduced = measurement.run_reference(torch, lambda: model(*args), "cpu", first=True)
decided = measurement.verdict(torch, out * (1 + 5e-5), out, {}, reduced)
timed = measurement.time_call(
    lambda: model(*args), {"timing": {"max_time_s": 0.01, "min_samples": 1, "warmup_ms": 0}}, "cpu"
)
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("pytest_kernelpro")),
    "same_inputs": bool(torch.equal(args[0], again[0])),
    "reduced": reduced,
    "ok": decided.ok,
    "median_s": timed["median_s"],
}))
"""


def test_child_side_imports_measure_and_not_the_session() -> None:
    root = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    modules = data["modules"]
    assert "pytest_kernelpro.measure.output_rule" in modules
    assert "pytest_kernelpro.measure.correctness_check" in modules
    assert "pytest_kernelpro.problem.kernelbench" in modules
    assert "pytest_kernelpro.measure.timing" in modules
    session_side = [
        m
        for m in modules
        if m == "pytest_kernelpro.plugin"
        or m.startswith(("pytest_kernelpro.run", "pytest_kernelpro.gate"))
    ]
    assert session_side == []
    assert data["same_inputs"] is True  # one seed, one input set
    assert data["reduced"] is None  # fp32 stays fp32 on the CPU
    assert data["ok"] is True  # 5e-5 relative: inside fp32's 1e-4
    assert data["median_s"] > 0
