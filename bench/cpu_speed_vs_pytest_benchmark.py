"""Wall time of the same small CPU project under pytest-kernelpro and under pytest-benchmark.

Six PyTorch CPU kernels (the example repository's CPU sizes plus an add), written once as
`@pytest.mark.kernelpro` items and once as pytest-benchmark tests, each run with the tool's
default settings in a fresh pytest process. kernelpro runs first with an empty ceilings
cache ("cold": the one-time ceilings measurement included) and then with the cache in place
("warm"); the two tools then alternate `--repeats` times. Prints a table and writes JSON.

    python bench/cpu_speed_vs_pytest_benchmark.py --repeats 3 \\
        --out bench/results/raw/2026-12-01-cpu-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SETUP = """
import torch

def softmax_in(device="cpu"):
    return (torch.randn(256, 1024, device=device),)

def gelu_in(device="cpu"):
    return torch.randn(512, 1024, device=device), torch.randn(1024, device=device)

def rms_in(device="cpu"):
    return (torch.randn(512, 1024, device=device),)

def mm_in(device="cpu"):
    return torch.randn(256, 256, device=device), torch.randn(256, 256, device=device)

def add_in(device="cpu"):
    return torch.randn(65536, device=device), torch.randn(65536, device=device)

def ln_in(device="cpu"):
    return (torch.randn(512, 1024, device=device),)

def softmax(x):
    return torch.softmax(x, -1)

def bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b, approximate="tanh")

def rmsnorm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

def matmul(a, b):
    return a @ b

def add(x, y):
    return x + y

def layernorm(x):
    return torch.nn.functional.layer_norm(x, (1024,))
"""

KERNELPRO = """
import pytest, torch
from kernels import *

@pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, -1), inputs=softmax_in)
def k_softmax(x):
    return softmax(x)

@pytest.mark.kernelpro(reference=lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh"),
                       inputs=gelu_in, rtol=1e-5, atol=1e-5)
def k_bias_gelu(x, b):
    return bias_gelu(x, b)

@pytest.mark.kernelpro(reference=lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
                       inputs=rms_in)
def k_rmsnorm(x):
    return rmsnorm(x)

@pytest.mark.kernelpro(reference=torch.mm, inputs=mm_in, rtol=2e-3, atol=2e-3)
def k_matmul(a, b):
    return matmul(a, b)

@pytest.mark.kernelpro(reference=torch.add, inputs=add_in)
def k_add(x, y):
    return add(x, y)

@pytest.mark.kernelpro(reference=lambda x: torch.nn.functional.layer_norm(x, (1024,)), inputs=ln_in)
def k_layernorm(x):
    return layernorm(x)
"""

BENCHMARK = """
from kernels import *

def test_softmax(benchmark):
    benchmark(softmax, *softmax_in())

def test_bias_gelu(benchmark):
    benchmark(bias_gelu, *gelu_in())

def test_rmsnorm(benchmark):
    benchmark(rmsnorm, *rms_in())

def test_matmul(benchmark):
    benchmark(matmul, *mm_in())

def test_add(benchmark):
    benchmark(add, *add_in())

def test_layernorm(benchmark):
    benchmark(layernorm, *ln_in())
"""


def _run(project: Path, tool: str) -> dict[str, object]:
    if tool == "kernelpro":
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:benchmark", "-p", "no:cacheprovider",
               "test_kp.py"]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:kernelpro", "-p", "no:cacheprovider",
               "test_bench.py"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    tail = (proc.stdout or "").strip().splitlines()[-1:] or [""]
    return {"tool": tool, "wall_s": wall, "rc": proc.returncode, "last_line": tail[0],
            "loadavg_1m_before": load_before}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="kp-speed-"))
    try:
        (project / "kernels.py").write_text(SETUP)
        (project / "test_kp.py").write_text(KERNELPRO)
        (project / "test_bench.py").write_text(BENCHMARK)
        (project / "pytest.ini").write_text("[pytest]\n")
        runs = []
        for label in ("cold", "warm"):
            row = _run(project, "kernelpro") | {"phase": label}
            runs.append(row)
            print(row)
        for _ in range(args.repeats):
            for tool in ("pytest-benchmark", "kernelpro"):
                row = _run(project, tool) | {"phase": "alternating"}
                runs.append(row)
                print(row)
    finally:
        shutil.rmtree(project, ignore_errors=True)
    alt = {t: [r["wall_s"] for r in runs if r["phase"] == "alternating" and r["tool"] == t]
           for t in ("kernelpro", "pytest-benchmark")}  # fmt: skip
    summary = {t: statistics.median(v) for t, v in alt.items() if v}
    if len(summary) == 2:
        summary["ratio"] = summary["kernelpro"] / summary["pytest-benchmark"]
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {os.cpu_count()} CPUs", "python": sys.version.split()[0],
            "runs": runs, "median_wall_s": summary}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
