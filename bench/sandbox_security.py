"""Issue 23 on a real machine: `python bench/sandbox_h200.py --out $OUT --security`.

With default settings (`SandboxEvaluator(task)`, the isolation the probe picks for CUDA):

1. cost: a bare `python -c pass` run N times unsandboxed, in the namespaces with the old
   deny-list view (the allow-list lists emptied: every mount read-only, credential stores
   under $HOME covered, the rest visible) and with the allow-list view; then the CUDA
   candidate's evaluation with each view, alternated (old, new, old, new): wall time and
   the worker's `launch` phase (the sandbox's start);
2. build flags: a candidate whose literal `load_inline` call carries
   `extra_cflags=["-O2; <shell command> #"]`, prepared (built ahead) and evaluated: it must
   be a `build_error` naming the flag, and the command's marker file must not exist;
3. secret reads: fake credentials written (where absent) to ~/.vault-token,
   ~/.cargo/credentials.toml, ~/.config/git/credentials, ~/.pgpass and the repository's
   `.env`; a candidate reads them and /proc/<parent>/environ and raises with what it read:
   each read must fail or be empty, and no secret may be in the evaluation. The files this
   step wrote are removed afterwards.

Each step appends a JSON line to OUT/sandbox.jsonl; a table is printed last.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from pytest_kernelpro.optimize.sandbox import isolation as isolation_module  # noqa: E402
from pytest_kernelpro.optimize.sandbox import view  # noqa: E402
from pytest_kernelpro.optimize.sandbox.evaluator import (  # noqa: E402
    KernelBenchTask,
    SandboxEvaluator,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation  # noqa: E402
from pytest_kernelpro.optimize.search.interfaces import Candidate  # noqa: E402

CANARY = "kp-sec-canary-9e8d7c6b5a"
SECRETS = {
    "~/.vault-token": "hvs.kp-bench-vault-11aa22bb33",
    "~/.cargo/credentials.toml": '[registry]\ntoken = "kp-bench-cargo-44cc55dd66"\n',
    "~/.config/git/credentials": "https://u:kp-bench-git-77ee88ff99@example.com\n",
    "~/.pgpass": "h:5432:*:u:kp-bench-pg-00aa11bb22\n",
    "REPO/.env": "API_KEY=kp-bench-env-33cc44dd55\n",
}
REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(@@N@@), torch.randn(@@N@@)]


def get_init_inputs():
    return []
"""
HONEST_CUDA = r'''
import torch
import torch.nn as nn
from pytest_kernelpro.optimize.build import load_cuda

kernels = load_cuda(r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
""", name="kp_sec_add")


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        kernels.add(a, b, out, n, grid=(n + 255) // 256, block=256)
        return out
'''
HONEST_CPU = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.add(a, b)
"""
FLAGS_ATTACK = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(
    name="kp_sec_flags",
    cpp_sources="int answer() { return 42; }",
    cuda_sources="__global__ void k() {}",
    functions=["answer"],
    extra_cflags=["-O2; cat /proc/*/environ > @@MARKER@@; touch @@MARKER@@ #"],
)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
"""
READ_ATTACK = """
import os

import torch
import torch.nn as nn

stolen = []
for path in @@PATHS@@ + [f"/proc/{os.getppid()}/environ"]:
    try:
        text = open(path, "rb").read().decode("utf-8", "replace").replace("\\0", " ")
        print(f"PROBE read {path}: {len(text)} bytes")
        stolen.append(text)
    except OSError as exc:
        print(f"PROBE blocked {path}: {exc.strerror}")


class ModelNew(nn.Module):
    def forward(self, a, b):
        raise RuntimeError("please fix: " + " | ".join(stolen)[:3000])
"""


def _timed_runs(command: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(command, capture_output=True, check=False, timeout=120)
        out.append(time.perf_counter() - t0)
    return out


def _no_view(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "hide": [], "show": [], "cover": []}


class _OldView:
    """While active, the sandbox is built with the deny-list view of main before issue 23
    (no hidden directories, nothing covered but the credential stores under $HOME)."""

    def __enter__(self) -> None:
        self.saved = isolation_module.sandbox_spec
        isolation_module.sandbox_spec = lambda **kw: _no_view(self.saved(**kw))

    def __exit__(self, *exc: object) -> None:
        isolation_module.sandbox_spec = self.saved


def cost(out: Path, iso: Isolation, log: Callable[[Path, dict], None], n: int = 5) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="kp-sec-cost-"))
    bare = [sys.executable, "-c", "pass"]
    result = {"bare_s": _timed_runs(bare, n)}
    if iso.isolated:
        with _OldView():
            result["old_view_s"] = [
                _timed_runs(iso.wrap(bare, scratch=scratch), 1)[0] for _ in range(n)
            ]
        result["new_view_s"] = [
            _timed_runs(iso.wrap(bare, scratch=scratch), 1)[0] for _ in range(n)
        ]
        t0 = time.perf_counter()
        spec = isolation_module.sandbox_spec(scratch=scratch)
        result["spec_s"] = time.perf_counter() - t0
        result["hidden"] = spec["hide"]
        result["shown"] = spec["show"]
        result["covered"] = len(spec["cover"])
    medians = {
        k: (statistics.median(v) if isinstance(v, list) else v)
        for k, v in result.items()
        if k.endswith("_s") and v
    }
    log(out, {"step": "cost_bare_command", **result, "medians": medians})
    return medians


def evaluations(
    out: Path, task: KernelBenchTask, code: str, log: Callable, rounds: int = 2
) -> dict:
    found: dict[str, list[dict]] = {"old": [], "new": []}
    evaluator = SandboxEvaluator(task)
    try:
        for i in range(rounds * 2):
            which = "old" if i % 2 == 0 else "new"
            t0 = time.perf_counter()
            if which == "old":
                with _OldView():
                    ev = evaluator.evaluate(Candidate(code))
            else:
                ev = evaluator.evaluate(Candidate(code))
            record = {
                "view": which,
                "status": ev.status,
                "reason": ev.reason,
                "wall_s": round(time.perf_counter() - t0, 3),
                "launch_s": (ev.metrics.get("phases") or {}).get("launch"),
                "sandbox": ev.metrics.get("sandbox"),
            }
            found[which].append(record)
            log(out, {"step": "cost_evaluation", **record})
    finally:
        evaluator.close()
    summary = {}
    for which, records in found.items():
        walls = [r["wall_s"] for r in records]
        launches = [r["launch_s"] for r in records if r["launch_s"] is not None]
        summary[which] = {
            "wall_s": statistics.median(walls) if walls else None,
            "launch_s": statistics.median(launches) if launches else None,
            "statuses": [r["status"] for r in records],
        }
    return summary


def build_flags(out: Path, task: KernelBenchTask, log: Callable) -> dict:
    marker = Path(tempfile.mkdtemp(prefix="kp-sec-flags-")) / "escaped.txt"
    code = FLAGS_ATTACK.replace("@@MARKER@@", str(marker))
    evaluator = SandboxEvaluator(task)
    try:
        candidate = Candidate(code)
        evaluator.prepare([candidate])
        ev = evaluator.evaluate(candidate)
    finally:
        evaluator.close()
    prebuild = (ev.metrics.get("build") or {}).get("prebuild") or {}
    record = {
        "status": ev.status,
        "reason": ev.reason,
        "prebuild_errors": prebuild.get("errors"),
        "marker_exists": marker.exists(),
        "refused_by_name": "compiler flag '-O2; cat /proc/*/environ" in (ev.reason or ""),
        "canary_in_evaluation": CANARY in json.dumps(ev.to_dict(), default=str),
    }
    log(out, {"step": "build_flags_attack", **record})
    return record


def secret_reads(out: Path, task: KernelBenchTask, log: Callable) -> dict:
    written = []
    paths = []
    for where, text in SECRETS.items():
        path = Path(os.path.expanduser(where.replace("REPO", str(ROOT))))
        paths.append(str(path))
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    try:
        code = READ_ATTACK.replace("@@PATHS@@", json.dumps(paths))
        evaluator = SandboxEvaluator(task)
        try:
            ev = evaluator.evaluate(Candidate(code))
        finally:
            evaluator.close()
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    text = json.dumps(ev.to_dict(), default=str)
    values = re.findall(r"kp-bench-[a-z]+-[0-9a-f]+", " ".join(SECRETS.values()))
    record = {
        "status": ev.status,
        "probe": [line for line in ev.logs.splitlines() if line.startswith("PROBE ")],
        "secrets_in_evaluation": [v for v in values if v in text],
        "canary_in_evaluation": CANARY in text,
        "sandbox": ev.metrics.get("sandbox"),
    }
    log(out, {"step": "secret_reads_attack", **record})
    return record


def run_security(out: Path, device: str, log: Callable[[Path, dict], None]) -> int:
    started = time.monotonic()
    os.environ["KERNELPRO_BENCH_API_TOKEN"] = CANARY  # a secret of the session
    cuda = device == "cuda"
    n = 1 << 24 if cuda else 1 << 16
    iso = Isolation.probe(cuda=cuda)
    log(out, {"step": "machine", "isolation": iso.describe(), "euid": os.geteuid(),
              "home": os.path.expanduser("~"), "hidden": view.hidden_roots(os.path.expanduser("~"))})  # fmt: skip
    task = KernelBenchTask(
        REFERENCE.replace("@@N@@", str(n)),
        name="add",
        device=device,
        timing={"warmup_ms": 5.0, "max_time_s": 0.1},
        correct_trials=2,
    )
    bare = cost(out, iso, log)
    evals = evaluations(out, task, HONEST_CUDA if cuda else HONEST_CPU, log)
    flags = build_flags(out, task, log)
    reads = secret_reads(out, task, log)
    log(out, {"step": "done", "total_s": round(time.monotonic() - started, 1)})
    rows = [
        ("isolation", iso.describe()),
        ("bare python: unsandboxed / old view / new view (median s)",
         " / ".join(f"{bare.get(k, float('nan')):.3f}" for k in ("bare_s", "old_view_s", "new_view_s"))),
        ("spec computed in the session (s)", f"{bare.get('spec_s', float('nan')):.4f}"),
        ("evaluation wall: old view / new view (median s)",
         f"{evals['old']['wall_s']} / {evals['new']['wall_s']}"),
        ("worker launch phase: old / new (median s)",
         f"{evals['old']['launch_s']} / {evals['new']['launch_s']}"),
        ("honest candidate statuses old / new", f"{evals['old']['statuses']} / {evals['new']['statuses']}"),
        ("build-flag attack", f"{flags['status']}, refused by name: {flags['refused_by_name']}, "
         f"marker exists: {flags['marker_exists']}"),
        ("secret reads", f"{reads['status']}, leaked: {reads['secrets_in_evaluation']}, "
         f"canary leaked: {reads['canary_in_evaluation']}"),
    ]  # fmt: skip
    print()
    for name, value in rows:
        print(f"{name:<60} {value}")
    return 0
