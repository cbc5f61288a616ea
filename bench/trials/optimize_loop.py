"""The optimize loop on a GPU, end to end, with a canned model (issue 12).

Writes a small repository with three marked kernels of different kinds (an elementwise
bias+GELU function, a row-softmax reduction function, an RMSNorm `nn.Module` with a learned
weight), then runs the real user path on it:

    pytest --kernelpro-optimize=3 --kernelpro-search=greedy --kernelpro-llm=canned ...

`canned` is a bench-only backend installed by the repository's conftest: it answers the
Programmer by mode with the hand-written candidates of `bench/trials/optimize_loop_candidates.py`
(initial -> a wrong one and a slow one; optimize -> a fast fused CUDA kernel and one that
does not compile; debug -> the slow one) and the Profiling Agent with a ProfileAnalysis made
from the first finding of the guidance it was given. Everything else is the product: the
sandbox, the CUTLASS precheck, the profiling evaluator (ncu of the candidate's own kernels,
SASS, timeline, Stage 1, tools), the Benchmarking Agent's reference profile, the greedy
search, the interleaved re-measurement and the ranking. Every call is recorded.

Output under --out: the pytest log, the JSON report, and per kernel the trajectory, the LLM
recording (full prompts), ranking.json; `summary.json` / `summary.md` collect per-candidate
profile time, the guidance each optimize prompt carried, the re-measured ranking against the
current kernel, and the wall time split generate / build / check / time / profile / remeasure.

    python bench/trials/optimize_loop.py --out DIR [--device cuda|cpu] [--budget 3] [--timeout 260]

`--device cpu` is the dry run (no profiles; the CUDA candidates fail to launch).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

KERNELS_PY = '''"""The repository's current kernels (plain PyTorch)."""
import torch
from torch import nn


def bias_gelu(x, bias):
    y = x + bias
    return 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))


def softmax_rows(x):
    shifted = x - x.amax(dim=-1, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=-1, keepdim=True)


class RMSNorm(nn.Module):
    def __init__(self, hidden=1024, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSNormReference(nn.Module):
    def __init__(self, hidden=1024, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x):
        x64 = x.double()
        return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.double()).to(x.dtype)
'''

TEST_PY = '''"""Three kernels of different kinds for the optimize-loop bench."""
import os

import pytest
import torch
from kernels import RMSNorm as _RMSNorm, RMSNormReference, bias_gelu as _bias_gelu, softmax_rows as _softmax


ROWS = int(os.environ.get("KERNELPRO_BENCH_ROWS", "8192"))  # the CPU dry run uses fewer rows


def gelu_inputs(device):
    return torch.randn(ROWS, 4096, device=device), torch.randn(4096, device=device)


@pytest.mark.kernelpro(
    reference=lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh"),
    inputs=gelu_inputs, rtol=1e-4, atol=1e-4,
)
def bias_gelu(x, bias):
    return _bias_gelu(x, bias)


def rms_inputs(device):
    return (torch.randn(2 * ROWS, 1024, device=device),)


@pytest.mark.kernelpro(reference=RMSNormReference, inputs=rms_inputs, rtol=1e-5, atol=1e-5)
class RMSNorm(_RMSNorm):
    """The module under test."""


def softmax_inputs(device):
    return (torch.randn(ROWS, 4096, device=device),)


@pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, -1), inputs=softmax_inputs)
def softmax_rows(x):
    return _softmax(x)
'''

CONFTEST_PY = '''"""Bench only: the `canned` model backend (see bench/trials/optimize_loop.py)."""
import json
import re
import sys

sys.path.insert(0, {bench!r})

import optimize_loop_candidates as canned  # noqa: E402

import pytest_kernelpro.optimize.agents.llm.factory as factory  # noqa: E402
from pytest_kernelpro.optimize.agents.llm.base import LLMResponse  # noqa: E402
from pytest_kernelpro.optimize.agents.llm.replay import RecordingBackend  # noqa: E402

_real = factory.make_backend
_FINDING = re.compile(r"^#### 1\\. \\[(?P<sev>[A-Z]+)\\] (?P<title>.*)$", re.MULTILINE)
_REC = re.compile(r"\\*\\*Recommendations \\(ranked\\):\\*\\*\\n1\\. (?P<rec>.*)")


class Canned:
    name = "canned"

    def complete(self, request):
        prompt = request.messages[0].content
        if request.meta.get("purpose") == "profiling":
            first = _FINDING.search(prompt)
            rec = _REC.search(prompt)
            text = json.dumps({{
                "bottleneck": "other",
                "severity": (first.group("sev").lower() if first else "low"),
                "summary": (first.group("title") if first else "no tool fired"),
                "recommendations": [{{"priority": 1, "action": rec.group("rec") if rec else "keep"}}],
            }})
        else:
            kernel = re.search(r"## The problem: `([A-Za-z_]+)", prompt).group(1)
            mode = request.meta.get("mode") or "initial"
            n = int(re.search(r"Return exactly (\\d+) candidate", prompt).group(1))
            text = "\\n".join(
                f"### Strategy: {{s}}\\n````python\\n{{code}}````\\n"
                for s, code in canned.CANDIDATES[kernel][mode][:n]
            )
        return LLMResponse(text, "end_turn", len(prompt) // 4, len(text) // 4, 0.0, "canned",
                           request.request_hash())


def make_backend(name, *, record_to=None, **options):
    if name != "canned":
        return _real(name, record_to=record_to, **options)
    backend = Canned()
    return RecordingBackend(backend, record_to) if record_to else backend


factory.make_backend = make_backend

# The namespace sandbox failed CUDA initialisation on the H200 host (cudaGetDeviceCount error
# 304 in every worker and in the judge, run of 2026-12-01 10:09): the bench may ask for the
# weaker fallback isolation through KERNELPRO_BENCH_ISOLATION, and the results say which.
import dataclasses  # noqa: E402
import os  # noqa: E402

import pytest_kernelpro.optimize.sandbox.evaluator as _evaluator  # noqa: E402

_isolation = os.environ.get("KERNELPRO_BENCH_ISOLATION")
if _isolation:
    _init = _evaluator.SandboxEvaluator.__init__

    def _with_isolation(self, task, limits=None):
        limits = dataclasses.replace(limits or _evaluator.SandboxLimits(), isolation=_isolation)
        _init(self, task, limits)

    _evaluator.SandboxEvaluator.__init__ = _with_isolation
'''


def _plugin_args() -> list[str]:
    names = {e.name for e in importlib.metadata.entry_points(group="pytest11")}
    return [] if "kernelpro" in names else ["-p", "pytest_kernelpro.plugin"]


def _summarize(out: Path, repo: Path) -> dict:
    report_path = repo / ".kernelpro" / "kernelpro-report.json"
    summary: dict = {"kernels": {}}
    if not report_path.exists():
        summary["error"] = "no JSON report (the run did not finish)"
    records = json.loads(report_path.read_text())["records"] if report_path.exists() else []
    for record in records:
        opt = (record.get("extra") or {}).get("optimize") or {}
        entry = {
            "status": opt.get("status"),
            "why": opt.get("why"),
            "device": record.get("device"),
            "current_median_s": record.get("timing", {}).get("stats", {}).get("median_s"),
            "wall_s": opt.get("wall_s"),
            "profiles": opt.get("profiles"),
            "ranking": opt.get("ranking"),
            "optimize_text": (record.get("extra") or {}).get("optimize_text"),
        }
        summary["kernels"][record["name"]] = entry
    for folder in sorted((repo / ".kernelpro" / "optimize").glob("*")):
        name = folder.name
        entry = summary["kernels"].setdefault(name, {})
        calls = folder / "llm-calls.jsonl"
        prompts = []
        if calls.exists():
            for line in calls.read_text().splitlines():
                call = json.loads(line)
                if call.get("purpose") != "programmer":
                    continue
                user = call["request"]["messages"][0]["content"]
                feedback = ""
                for head in ("## Automated Bottleneck Analysis", "## Profiler Metrics (raw)"):
                    if head in user:
                        feedback = user[user.index(head) : user.index("## Output format")]
                prompts.append(
                    {
                        "mode": call.get("prompt_id", "").split(".")[0],
                        "prompt_chars": len(user),
                        "has_reference_analysis": "## Reference analysis" in user,
                        "has_problem": "## The problem" in user,
                        "guidance": feedback,
                    }
                )
        entry["prompts"] = prompts
        nodes = []
        trajectory = folder / "trajectory.jsonl"
        if trajectory.exists():
            for line in trajectory.read_text().splitlines():
                data = json.loads(line)
                if data.get("kind") != "node":
                    continue
                profile = (data.get("metrics") or {}).get("profile") or {}
                nodes.append(
                    {
                        "id": data.get("id"),
                        "parent": data.get("parent"),
                        "mode": data.get("mode"),
                        "strategy": data.get("strategy"),
                        "status": data.get("status"),
                        "speedup_vs_reference": data.get("speedup"),
                        "reason": data.get("reason"),
                        "build_s": data.get("build_s"),
                        "wall_s": data.get("wall_s"),
                        "profile_s": profile.get("profile_s"),
                        "profile_kernels": profile.get("kernels"),
                        "sass": profile.get("sass"),
                        "timeline": profile.get("timeline"),
                        "stage1": (profile.get("stage1") or {}).get("cls"),
                        "not_collected": profile.get("not_collected"),
                        "profile_error": profile.get("error"),
                        "findings": [
                            f"[{f.get('severity')}] {f.get('tool')}: {f.get('title')}"
                            for f in data.get("findings") or []
                        ],
                    }
                )
        entry["nodes"] = nodes
        ranking = folder / "ranking.json"
        if ranking.exists() and not entry.get("ranking"):
            entry["ranking"] = json.loads(ranking.read_text())  # the run ended before the report
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", default="3")
    parser.add_argument("--timeout", type=float, default=260.0)
    parser.add_argument("-k", default="")
    parser.add_argument("--rows", type=int, default=8192, help="rows of the inputs (dry run: 64)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    repo = out / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "kernels.py").write_text(KERNELS_PY)
    (repo / "test_kernels.py").write_text(TEST_PY)
    (repo / "conftest.py").write_text(CONFTEST_PY.format(bench=str(HERE)))
    (repo / "pytest.ini").write_text("[pytest]\n")
    command = [
        sys.executable, "-m", "pytest", *_plugin_args(), "-q", "-rA", "-p", "no:cacheprovider",
        f"--kernelpro-device={args.device}", f"--kernelpro-optimize={args.budget}",
        "--kernelpro-search=greedy", "--kernelpro-llm=canned", "--kernelpro-candidates=2",
        "--kernelpro-time-budget=0.15", "--kernelpro-profile-timeout=60",
    ]  # fmt: skip
    if args.k:
        command += ["-k", args.k]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        KERNELPRO_BENCH_ROWS=str(args.rows),
    )
    started = time.monotonic()
    with open(out / "pytest.log", "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        try:
            rc = subprocess.run(
                command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                timeout=args.timeout,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - started
    summary = _summarize(out, repo)
    summary.update(command=" ".join(command), rc=rc, wall_s=wall)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for name, entry in summary["kernels"].items():
        print(f"== {name}: {entry.get('status')}  {entry.get('why') or ''}")
        print(entry.get("optimize_text") or "")
        for node in entry.get("nodes", []):
            print(
                f"  node {node['id']} <- {node['parent']} {node['mode']:8} {node['status']:11} "
                f"x{node['speedup_vs_reference'] or 0:.2f} profile {node['profile_s'] or 0:.1f}s "
                f"sass={node['sass']} stage1={node['stage1']} findings={len(node['findings'])} "
                f"{(node['reason'] or '')[:80]}"
            )
        for p in entry.get("prompts", []):
            print(
                f"  prompt {p['mode']}: {p['prompt_chars']} chars, guidance {len(p['guidance'])} chars"
            )
    print(f"rc={rc} wall_s={wall:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
