"""A new user's first runs on the CPU, with default settings and an empty ceilings cache:
wall time, outcomes and whether any timing overran its budget.

Cases (each a fresh pytest process, each with its own empty KERNELPRO_CACHE_DIR, so the
machine's ceilings are measured as on a first run):

- `ten`: a project of 10 small CPU kernels written from the README (elementwise, reductions,
  softmax, layer norm, a small matmul), `pytest -q`;
- `example`: the example repository, `pytest -q --kernelpro-only` (what scripts/main.sh runs);
- `kernelbench`: six small KernelBench level-1 problems at the sizes of KernelBench's first
  release (bench/kernelbench_level1_first_release: 16 x 16384 rows, a 16 x 32 x 128 x 128
  pooling, a 16 x 256 x 256 sum), the "small KernelBench session" whose items' own work fits a
  20 s limit, with `--kernelpro-item-timeout=20`: what the limit must not charge is the
  machine's set-up (the ceilings probe, before the first item);
- `kernelbench-64mi`: the two first-release problems of 64 Mi elements (RMSNorm, 2-D average
  pooling, 16 x 64 x 256 x 256) under the same 20 s limit: their own work is the limit's to
  stop, and the failure names the phase it was in;
- `kernelbench-today`: the same six at today's sizes (bench/kernelbench_level1, 6.4-17 GB
  each), where one CPU thread's own work on an item exceeds 20 s even on a quiet machine.

`--busy N` starts N busy loops (`yes > /dev/null`) beside every case and ends them after.
Prints one Markdown row per case. Temporary folders are removed.

    python bench/first_run.py [--busy 2] [--cases ten,example,kernelbench]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH = ROOT / "bench" / "kernelbench_level1"
KERNELBENCH_FIRST_RELEASE = ROOT / "bench" / "kernelbench_level1_first_release"
SMALL_SIX = [
    "19_ReLU.py",
    "23_Softmax.py",
    "38_L1Norm_.py",
    "39_L2Norm_.py",
    "42_Max_Pooling_2D.py",
    "47_Sum_reduction_over_a_dimension.py",
]
FIRST_RELEASE_64MI = ["36_RMSNorm_.py", "45_Average_Pooling_2D.py"]
SIX = [
    "19_ReLU.py",
    "23_Softmax.py",
    "36_RMSNorm_.py",
    "38_L1Norm_.py",
    "39_L2Norm_.py",
    "45_Average_Pooling_2D.py",
]
CASE_PROBLEMS = {
    "kernelbench": (KERNELBENCH_FIRST_RELEASE, SMALL_SIX),
    "kernelbench-64mi": (KERNELBENCH_FIRST_RELEASE, FIRST_RELEASE_64MI),
    "kernelbench-today": (KERNELBENCH, SIX),
}

TEN_KERNELS = """
import pytest
import torch

def vec(device):
    return (torch.randn(1 << 20, device=device),)

def two(device):
    return torch.randn(1 << 20, device=device), torch.randn(1 << 20, device=device)

def rows(device):
    return (torch.randn(512, 1024, device=device),)

@pytest.mark.kernelpro(reference=torch.add, inputs=two)
def add(x, y):
    return x + y

@pytest.mark.kernelpro(reference=torch.mul, inputs=two)
def mul(x, y):
    return x * y

@pytest.mark.kernelpro(reference=torch.relu, inputs=vec)
def relu(x):
    return x.clamp_min(0)

@pytest.mark.kernelpro(reference=lambda x: torch.nn.functional.gelu(x, approximate="tanh"), inputs=vec)
def gelu(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))

@pytest.mark.kernelpro(reference=torch.exp, inputs=vec)
def exp(x):
    return torch.exp(x)

@pytest.mark.kernelpro(reference=lambda x: x.view(-1, 1024).sum(dim=1), inputs=vec)
def row_sums(x):
    return torch.einsum("ij->i", x.view(-1, 1024))

@pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, dim=1), inputs=rows)
def softmax(x):
    e = torch.exp(x - x.amax(dim=1, keepdim=True))
    return e / e.sum(dim=1, keepdim=True)

@pytest.mark.kernelpro(reference=lambda x: torch.nn.functional.layer_norm(x, (1024,)), inputs=rows)
def layer_norm(x):
    mean = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5)

@pytest.mark.kernelpro(reference=torch.mm,
                       inputs=lambda device: (torch.randn(256, 256, device=device),
                                              torch.randn(256, 256, device=device)))
def matmul(a, b):
    return a @ b

@pytest.mark.kernelpro(reference=lambda x: x.clamp(-1, 1), inputs=vec)
def clamp(x):
    return torch.minimum(torch.maximum(x, torch.tensor(-1.0)), torch.tensor(1.0))
"""


def run_case(name: str, tmp: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNELPRO_CACHE_DIR": str(tmp / "cache")}
    env.pop("KERNELPRO_DEVICE", None)
    py = sys.executable
    if name == "ten":
        project = tmp / "project"
        project.mkdir()
        (project / "test_kernels.py").write_text(TEN_KERNELS)
        cmd, cwd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project
    elif name == "example":
        cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kernelpro-only",
               f"--kernelpro-json={tmp / 'report.json'}"]  # fmt: skip
        cwd = ROOT / "example_repo"
    elif name in CASE_PROBLEMS:
        source, files = CASE_PROBLEMS[name]
        problems = tmp / "problems"
        problems.mkdir()
        for file in files:
            (problems / file).write_text((source / file).read_text())
        cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--kernelpro-problems={problems}", "--kernelpro-item-timeout=20"]  # fmt: skip
        cwd = tmp
    else:
        raise SystemExit(f"unknown case {name!r}")
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    out = proc.stdout + proc.stderr
    outcome = re.compile(r"\b(passed|failed|errors?|skipped|no tests ran)\b.* in [\d.]+s")
    summary = next((ln for ln in reversed(out.splitlines()) if outcome.search(ln)), "")
    overruns = re.findall(r"(\d+) CPU timing\(s\) overran the time budget \(([^)]*)\)", out)
    probe = re.search(r"measuring the ceilings of [^\n]*", out)
    report = cwd / ".kernelpro" / "kernelpro-report.json"
    if name == "example":
        report = tmp / "report.json"
    budget_notes, item_s = [], {}
    if report.exists():
        for record in json.loads(report.read_text())["records"]:
            item_s[record["name"]] = round(record.get("wall_s") or 0.0, 1)
            note = (record.get("timing") or {}).get("budget_note")
            if note:
                budget_notes.append(f"{record['name']}: {note}")
    return {
        "case": name,
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "summary": summary.strip("= "),
        "overrun": overruns,
        "budget_notes": budget_notes,
        "probe_line": bool(probe),
        "item_s": item_s,
        "tail": out[-1500:] if proc.returncode not in (0, 1) else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--cases", default="ten,example,kernelbench")
    args = parser.parse_args()
    loops = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy)]
    try:
        with open("/proc/loadavg", encoding="utf-8") as handle:
            print(f"load before: {handle.read().split()[:3]}, busy loops: {args.busy}")
        rows = []
        for name in args.cases.split(","):
            with tempfile.TemporaryDirectory(prefix="kernelpro-first-run-") as folder:
                row = run_case(name, Path(folder))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print()
    print("| case | wall | outcome | overrun notes | exit |")
    print("|---|---|---|---|---|")
    for row in rows:
        notes = "; ".join(row["budget_notes"]) or "none"  # type: ignore[arg-type]
        print(f"| {row['case']} | {row['wall_s']} s | {row['summary']} | {notes} | {row['rc']} |")


if __name__ == "__main__":
    main()
