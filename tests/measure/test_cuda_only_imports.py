"""The CUDA-only parts of `measure/` stay out of a CPU process: the nvcc and driver readers
(`cuda_versions`), the fp32 flags' readers and recorder (`fp32_tensor_cores`) and the fp32
matrix paths (`matrix_paths`) are imported where a CUDA item needs them, so a CPU check
session does not load them. Run in a fresh interpreter: this test process may have imported
them already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CUDA_ONLY = (
    "pytest_kernelpro.measure.cuda_versions",
    "pytest_kernelpro.measure.fp32_tensor_cores",
    "pytest_kernelpro.measure.matrix_paths",
)

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.environment import code_versions
    from pytest_kernelpro.measure.fp32_precision import run_recording_precision
    from pytest_kernelpro.measure.roofline import analyze_reference

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    versions = code_versions("cpu")
    out, reduced = run_recording_precision(torch, lambda: a @ b, "cpu")
    ceilings = Ceilings("cpu (test)", 1e10, {"fp32": 1e11}, "measured", "t", torch.__version__)
    analysis = analyze_reference(torch.mm, [a, b], ceilings=ceilings)
    print(json.dumps({
        "modules": sorted(m for m in sys.modules if m.startswith("pytest_kernelpro")),
        "versions": sorted(versions),
        "reduced": reduced,
        "flops": analysis.flops,
        "paths": list(analysis.paths),
    }))
    """
)


def test_a_cpu_item_loads_none_of_the_cuda_only_modules() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["flops"] == 2 * 64**3  # the CPU path ran: a matmul counted
    assert got["reduced"] is None
    assert got["paths"] == []
    assert "cuda_runtime" not in got["versions"]
    assert "nvcc" not in got["versions"]
    loaded = [m for m in CUDA_ONLY if m in got["modules"]]
    assert loaded == [], f"a CPU item imported {loaded}"
    assert "pytest_kernelpro.measure.roofline" in got["modules"]  # the modules were looked at
