"""What a profiled search pays before and per candidate, measured part by part (issue 12).

    python bench/search_cost_h200.py --out $OUT                  # on the GPU machine
    python bench/search_cost_h200.py --out /tmp/sc --device cpu  # dry run (PyTorch only)

Steps, in order of value (each appends one JSON line to OUT/search_cost.jsonl as it ends, so
a call cut by its limit keeps what it measured; `--steps` picks some):

1. `probe`: the CUDA ladder with the driver check (ctypes through libcuda.so.1), then the
   same verdict read back from a fresh verdict cache (`optimize/sandbox/cuda_probe.py`);
2. `profile_out` / `profile_in`: one PyTorch candidate (torch.softmax over rows) profiled by
   `CandidateProfiler` under the fallback (no namespaces) and inside the namespace sandbox:
   the A/B of "a profile costs twice as much inside the sandbox", with the child's parts
   (`phases`: build, static, timeline, ncu_query, ncu, analysis);
3. `triton_cold`, `triton_eval`, `triton_warm`: a Triton row-softmax candidate profiled cold
   (no kept caches), then evaluated in the sandbox (which keeps its compile caches), then
   profiled from a copy of them (`optimize/sandbox/compile_cache.py`); on the CPU a PyTorch candidate
   stands in (no Triton), so only the plumbing is exercised;
4. `probe_torch`: the ladder with the torch check, what every process paid before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kernelpro.analysis import RooflineFacts  # noqa: E402
from pytest_kernelpro.optimize.candidate_profile.evaluator import CandidateProfiler, ProfileFailed  # noqa: E402
from pytest_kernelpro.optimize.sandbox import isolation  # noqa: E402
from pytest_kernelpro.optimize.sandbox.cuda_probe import VerdictCache  # noqa: E402
from pytest_kernelpro.optimize.sandbox.evaluator import (  # noqa: E402
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation  # noqa: E402
from pytest_kernelpro.optimize.search.base import Candidate, Evaluation  # noqa: E402

STEPS = (
    "probe",
    "profile_out",
    "profile_in",
    "triton_cold",
    "triton_eval",
    "triton_warm",
    "probe_torch",
)

REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


ROWS, COLS = @@ROWS@@, @@COLS@@


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
"""
TORCH_CANDIDATE = """import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""
TRITON_CANDIDATE = """import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _softmax_rows(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""


def _facts() -> RooflineFacts:
    return RooflineFacts(bound="memory", dominant_category="reduction", dtype="float32")


def _profile(profiler: CandidateProfiler, code: str, median_s: float | None) -> dict[str, Any]:
    started = time.perf_counter()
    evaluation = Evaluation(status="correct", metrics={"candidate_median_s": median_s})
    try:
        result = dict(profiler(Candidate(code=code), evaluation))
    except ProfileFailed as exc:
        return {"ok": False, "error": str(exc)[:600], "wall_s": time.perf_counter() - started}
    profile = result.get("profile") or {}
    return {
        "ok": True,
        "wall_s": time.perf_counter() - started,
        "collect_s": result.get("profile_s"),
        "build_s": result.get("build_s"),
        "phases": result.get("phases"),
        "compile_cache": result.get("compile_cache"),
        "isolation": result.get("isolation"),
        "kernels": [k.get("name") for k in profile.get("kernels") or ()][:4],
        "not_collected": [n.get("what") for n in profile.get("not_collected") or ()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated, in order")
    parser.add_argument("--deadline-s", type=float, default=1e9, help="skip steps after this")
    args = parser.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}: use {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "search_cost.jsonl"
    started = time.monotonic()
    cuda = args.device == "cuda"
    rows, cols = (8192, 4096) if cuda else (256, 512)
    reference = REFERENCE.replace("@@ROWS@@", str(rows)).replace("@@COLS@@", str(cols))
    triton_code = TRITON_CANDIDATE if cuda else TORCH_CANDIDATE
    base = Isolation.probe()
    env = SandboxEvaluator(KernelBenchTask(reference, name="softmax", device="cpu")).environment()
    inside = Isolation.probe(cuda=cuda, env=env) if cuda else base
    header = {
        "step": "machine",
        "device": args.device,
        "python": sys.version.split()[0],
        "base": base.describe(),
        "sandbox": inside.describe(),
        "verdict": inside.verdict,
    }
    try:
        import torch

        header["torch"] = torch.__version__
        if torch.cuda.is_available():
            header["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    lines: list[dict[str, Any]] = []
    sandbox: SandboxEvaluator | None = None

    def record(step: str, **data: Any) -> None:
        line = {"step": step, "at_s": round(time.monotonic() - started, 2), **data}
        lines.append(line)
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, default=str) + "\n")
        print(json.dumps(line, default=str)[:400], flush=True)

    record("machine", **{k: v for k, v in header.items() if k != "step"})
    profiler_args = {"device": args.device, "timeout_s": 120.0, "env": env}
    for step in steps:
        if time.monotonic() - started > args.deadline_s:
            record(step, skipped="deadline")
            continue
        if step == "probe":
            with tempfile.TemporaryDirectory() as cache_dir:
                cache = VerdictCache(Path(cache_dir))
                t0 = time.perf_counter()
                probed = isolation._probe_cuda(base, env, cache=cache)
                t1 = time.perf_counter()
                cached = isolation._probe_cuda(base, env, cache=cache)
                t2 = time.perf_counter()
            record(
                step,
                driver_ladder_s=t1 - t0,
                cached_s=t2 - t1,
                rung=list(probed.relax) if probed.isolated else None,
                verdict=probed.verdict,
                cached_verdict=cached.verdict,
                same=probed == cached,
            )
        elif step == "probe_torch":
            t0 = time.perf_counter()
            found = isolation._probe_cuda(base, env, check="torch", cache=VerdictCache(None))
            record(
                step,
                torch_ladder_s=time.perf_counter() - t0,
                rung=list(found.relax) if found.isolated else None,
                verdict=found.verdict,
            )
        elif step in ("profile_out", "profile_in"):
            where: Any = "fallback" if step == "profile_out" else inside
            profiler = CandidateProfiler(reference, _facts(), isolation=where, **profiler_args)
            record(step, **_profile(profiler, TORCH_CANDIDATE, None))
        elif step == "triton_cold":
            profiler = CandidateProfiler(reference, _facts(), isolation=inside, **profiler_args)
            record(step, **_profile(profiler, triton_code, None))
        elif step == "triton_eval":
            task = KernelBenchTask(
                reference,
                name="softmax",
                device=args.device,
                timing={"warmup_ms": 10.0, "max_time_s": 0.1},
            )
            sandbox = SandboxEvaluator(task, SandboxLimits(build_timeout_s=120, run_timeout_s=90))
            t0 = time.perf_counter()
            evaluation = sandbox.evaluate(Candidate(code=triton_code))
            record(
                step,
                wall_s=time.perf_counter() - t0,
                status=evaluation.status,
                reason=(evaluation.reason or "")[:300],
                worker_s=evaluation.wall_s,
                build_s=evaluation.build_s,
                judge_s=evaluation.metrics.get("judge_s"),
                phases=evaluation.metrics.get("phases"),
                kept=dict(sandbox.compile_caches.kept),
            )
        elif step == "triton_warm":
            if sandbox is None:
                record(step, skipped="needs triton_eval first")
                continue
            profiler = CandidateProfiler(
                reference,
                _facts(),
                isolation=inside,
                caches=sandbox.compile_caches,
                **profiler_args,
            )
            record(step, **_profile(profiler, triton_code, None))
    if sandbox is not None:
        sandbox.close()
    (args.out / "summary.json").write_text(json.dumps(lines, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
