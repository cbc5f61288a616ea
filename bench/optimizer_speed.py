"""The optimizer at the size and speed of a real suite: what one candidate costs, with fresh
processes and with warm standbys, on problems as large as KernelBench level 1 has (the
checked outputs' channel is `optimizer_handles.py`'s).

    python bench/optimizer_speed.py --out $OUT                 # the H200 (KernelBench sizes)
    python bench/optimizer_speed.py --out /tmp/os --device cpu # CPU dry run (cut-down sizes)

Steps (each appends one JSON line to OUT/steps.jsonl when it ends, so a run cut by its limit
keeps what it measured; `--steps` picks some; a step is skipped once the deadline is near):

1. `split`: the per-candidate split on `23_Softmax` through `SandboxEvaluator` (the real
   sandbox, judge included): the current kernel and one correct candidate, with fresh
   processes (`standby=0`, before) and with warm standbys (`standby=2`, after), with a pause
   between evaluations standing for the model writing the next candidate (`--gap-s`).
2. `largest`: the ten largest level-1 problems by bytes (bench/kernelbench_level1/README.md),
   each: the current kernel evaluated and one candidate judged (the problem's own code as
   `ModelNew`: a correct candidate of the full size), warm standbys.
3. `search`: a 5-evaluation search of `23_Softmax` as a user runs it (`pytest
   --kernelpro-problems --kernelpro-optimize=5 --kernelpro-llm=replay:...`,
   `--kernelpro-feedback=none`: no profiles), with five hand-written candidates (two PyTorch
   forms, a Triton kernel, a wrong one, the functional form); the summary's elapsed time and
   wall split.

The last lines printed are a short table; everything is in OUT/steps.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KB = ROOT / "bench" / "kernelbench_level1"
LARGEST = (
    "45_Average_Pooling_2D", "38_L1Norm_", "39_L2Norm_", "34_InstanceNorm", "35_GroupNorm_",
    "36_RMSNorm_", "37_FrobeniusNorm_", "76_conv_standard_1D_dilated_strided__", "19_ReLU",
    "20_LeakyReLU",
)  # fmt: skip
STEPS = ("split", "largest", "search")


def log(out: Path, step: str, data: dict[str, Any]) -> None:
    with open(out / "steps.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": step, **data}, default=str) + "\n")
    print(
        f"[{time.strftime('%H:%M:%S')}] {step}: {json.dumps(data, default=str)[:600]}", flush=True
    )


def problem_source(name: str, cpu: bool) -> str:
    """The problem file; on the CPU its sizes cut so a dry run fits (the shapes' constants
    divided until the inputs are small)."""
    text = (KB / f"{name}.py").read_text(encoding="utf-8")
    if not cpu:
        return text
    import re

    def shrink(match: re.Match[str]) -> str:
        value = int(match.group(2))
        return f"{match.group(1)}{max(2, value // 64) if value > 64 else value}"

    return re.sub(
        r"^((?:batch_size|dim|dim1|dim2|features|num_features|num_groups|height|width|length|"
        r"in_channels|out_channels|M|N|K|normalized_shape)\s*=\s*)(\d+)",
        shrink,
        text,
        flags=re.M,
    )


def as_candidate(source: str, note: str) -> str:
    """The problem's own code as the candidate (`class ModelNew`), marked by `note`."""
    return (
        source.replace("class Model(", "class ModelNew(").replace(
            "super(Model, self)", "super(ModelNew, self)"
        )
        + f"\n# {note}\n"
    )


def evaluation_record(ev: Any, total_s: float) -> dict[str, Any]:
    return {
        "status": ev.status,
        "reason": (ev.reason or "")[:300],
        "evaluate_s": round(total_s, 3),
        "worker_wall_s": round(ev.wall_s, 3),
        "judge_s": round(float(ev.metrics.get("judge_s") or 0.0), 3),
        "phases": ev.metrics.get("phases"),
        "standby": ev.metrics.get("standby"),
        "speedup": ev.speedup,
    }


# ----- steps -------------------------------------------------------------------------------


def _evaluator(source: str, device: str, standby: int, args: argparse.Namespace) -> Any:
    from pytest_kernelpro.optimize.sandbox.evaluator import (
        KernelBenchTask,
        SandboxEvaluator,
        SandboxLimits,
    )

    task = KernelBenchTask(
        reference=source,
        device=device,
        timing={"max_time_s": args.timing, "warmup_ms": 50},
    )
    return SandboxEvaluator(task, SandboxLimits(standby=standby, run_timeout_s=args.run_timeout))


def step_split(args: argparse.Namespace) -> dict[str, Any]:
    from pytest_kernelpro.optimize.search.interfaces import Candidate

    cpu = args.device == "cpu"
    source = problem_source("23_Softmax", cpu)
    candidate = (
        "import torch\nfrom torch import nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.nn.functional.softmax(x, dim=-1)\n"
    )
    result: dict[str, Any] = {}
    for label, standby in (("before", 0), ("after", 2)):
        ev = _evaluator(source, args.device, standby, args)
        rows = []
        try:
            probe = time.perf_counter()
            _ = ev.isolation
            probe_s = time.perf_counter() - probe
            ev.standbys.fill()
            pairs = [("current", as_candidate(source, "current")), ("candidate", candidate)]
            for name, code in pairs if args.with_current else pairs[1:]:
                time.sleep(args.gap_s)  # the model writing the next candidate
                t0 = time.perf_counter()
                evaluation = ev.evaluate(Candidate(code=code, strategy=name))
                rows.append(
                    {"what": name, **evaluation_record(evaluation, time.perf_counter() - t0)}
                )
        finally:
            ev.close()
        result[label] = {"probe_s": round(probe_s, 3), "evaluations": rows}
    return result


def step_largest(args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    from pytest_kernelpro.optimize.search.interfaces import Candidate

    cpu = args.device == "cpu"
    problems: dict[str, Any] = {}
    for name in args.problems.split(",") if args.problems else LARGEST:
        if time.monotonic() > deadline - args.problem_cost_s:
            problems[name] = {"skipped": "deadline"}
            continue
        source = problem_source(name, cpu)
        ev = _evaluator(source, args.device, 2, args)
        rows = []
        started = time.perf_counter()
        try:
            ev.standbys.fill()
            for what in ("current", "candidate"):
                t0 = time.perf_counter()
                evaluation = ev.evaluate(Candidate(code=as_candidate(source, what), strategy=what))
                rows.append(
                    {"what": what, **evaluation_record(evaluation, time.perf_counter() - t0)}
                )
        except Exception as exc:  # a problem that breaks the evaluator is a result too
            rows.append({"what": "error", "error": f"{type(exc).__name__}: {exc}"[:500]})
        finally:
            ev.close()
        problems[name] = {"total_s": round(time.perf_counter() - started, 2), "evaluations": rows}
        print(
            f"  {name}: {[(r.get('what'), r.get('status'), r.get('evaluate_s')) for r in rows]}",
            flush=True,
        )
    return problems


SEARCH_REPLIES = [
    ("the functional softmax", "return torch.nn.functional.softmax(x, dim=-1)"),
    ("exp over the row sum after the row max", "m = x.amax(dim=1, keepdim=True)\n        e = (x - m).exp_()\n        return e.div_(e.sum(dim=1, keepdim=True))"),
    ("softmax with an explicit float32 cast", "return torch.softmax(x.float(), dim=1)"),
    ("wrong: exp without normalising", "return x.exp()"),
    ("log-softmax exponentiated", "return torch.log_softmax(x, dim=1).exp()"),
]  # fmt: skip


def step_search(args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    from pytest_kernelpro.optimize.loop.replay import recording_record

    cpu = args.device == "cpu"
    project = Path(tempfile.mkdtemp(prefix="kernelpro-search-"))
    (project / "problems").mkdir()
    (project / "problems" / "23_Softmax.py").write_text(problem_source("23_Softmax", cpu))
    (project / "replays").mkdir()
    with open(project / "replays" / "23_Softmax.jsonl", "w", encoding="utf-8") as handle:
        for strategy, body in SEARCH_REPLIES:
            text = (
                f"### Strategy: {strategy}\n```python\nimport torch\nfrom torch import nn\n\n\n"
                f"class ModelNew(nn.Module):\n    def forward(self, x):\n        {body}\n```\n"
            )
            handle.write(json.dumps(recording_record(text)) + "\n")
    (project / "pytest.ini").write_text(
        f"[pytest]\nkernelpro_time_budget = {args.timing}\nkernelpro_warmup_ms = 50\n"
    )
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kernelpro-problems=problems",
        "--kernelpro-optimize=5", "--kernelpro-llm=replay:replays", "--kernelpro-feedback=none",
        "--kernelpro-candidates=1", f"--kernelpro-device={args.device}",
    ]  # fmt: skip
    # The tree first, the caller's path kept: on the device machine it holds the entry points.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    timeout = max(30.0, deadline - time.monotonic())
    try:
        proc = subprocess.run(
            cmd, cwd=project, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        code: Any = proc.returncode
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = "timeout", str(exc.stdout or "")[-3000:]
    wall = time.monotonic() - started
    # The trajectory is appended as each node is evaluated: a search cut by the deadline
    # still brings back the evaluations it finished.
    for index, trajectory in enumerate(sorted(project.rglob("trajectory.jsonl"))):
        shutil.copyfile(trajectory, args.out / f"search-trajectory-{index}.jsonl")
    summary: dict[str, Any] = {}
    report = project / ".kernelpro" / "kernelpro-report.json"
    if report.is_file():
        for record in json.loads(report.read_text()).get("records", []):
            summary = (record.get("extra") or {}).get("optimize") or summary
    per = []
    for c in summary.get("per_candidate") or []:
        per.append(
            {
                k: c.get(k)
                for k in (
                    "strategy",
                    "status",
                    "elapsed_s",
                    "build_s",
                    "check_s",
                    "judge_s",
                    "time_s",
                    "other_s",
                    "wall_split",
                    "both_peak_mb",
                    "device_peak_mb",
                    "device_peak_at",
                )
            }
        )
    shutil.rmtree(project, ignore_errors=True)
    return {
        "exit": code,
        "pytest_wall_s": round(wall, 1),
        "elapsed_s": summary.get("elapsed_s"),
        "status": summary.get("status"),
        "evaluations": summary.get("evaluations"),
        "outcomes": summary.get("outcomes"),
        "wall_s": summary.get("wall_s"),
        "standby": summary.get("standby"),
        "per_candidate": per,
        "best_patch": summary.get("best_patch"),
        # The final ranking: its reason, the re-measurement's cost, each candidate's verdict.
        "ranking": summary.get("ranking"),
        # What the refusal rule expects one evaluation to hold (`sandbox/footprint.py`),
        # against each candidate's measured `device_peak_mb` and `both_peak_mb`.
        "footprint": footprint_estimates(problem_source("23_Softmax", cpu), args.device),
        "tail": tail,
    }


def footprint_estimates(source: str, device: str) -> dict[str, Any]:
    """The problem's footprint and the sandbox's estimates of one evaluation, in MiB."""
    from pytest_kernelpro.optimize.sandbox.footprint import meta_footprint, session_device

    found = meta_footprint(source, session_device(device))
    if found is None:
        return {"why": "the reference does not run on the meta device"}
    on_device = found.device_estimate()
    return {
        "footprint_mb": round(found.total / 2**20, 1),
        "host_estimate_mb": round(found.estimate() / 2**20, 1),
        "device_estimate_mb": None if on_device is None else round(on_device / 2**20, 1),
        "peak_at": found.peak().where,
    }


def table(out: Path) -> None:
    print("\n== optimizer speed ==")
    for line in (out / "steps.jsonl").read_text().splitlines():
        data = json.loads(line)
        step = data["step"]
        if step == "split":
            for label in ("before", "after"):
                for row in (data.get(label) or {}).get("evaluations", []):
                    print(f"split {label:6} {row['what']:9} {row['status']:9} evaluate {row['evaluate_s']:7.2f} s "
                          f"(worker {row['worker_wall_s']:.2f}, judge {row['judge_s']:.2f})")  # fmt: skip
        elif step == "largest":
            for name, entry in data.items():
                if not isinstance(entry, dict):
                    continue  # "step", "step_s"
                rows = entry.get("evaluations") or []
                print(f"largest {name:40} " + ", ".join(f"{r.get('what')} {r.get('status')} {r.get('evaluate_s')} s" for r in rows) + (f" {entry.get('skipped')}" if entry.get("skipped") else ""))  # fmt: skip
        elif step == "search":
            print(f"search 23_Softmax: exit {data.get('exit')}, elapsed {data.get('elapsed_s')} s, {data.get('status')}, outcomes {data.get('outcomes')}")  # fmt: skip
        elif "error" in data:
            print(f"{step}: error {data['error'][:200]}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--deadline-s", type=float, default=460.0)
    parser.add_argument("--gap-s", type=float, default=5.0)
    parser.add_argument("--timing", type=float, default=0.5)
    parser.add_argument("--run-timeout", type=float, default=120.0)
    parser.add_argument("--problems", default="")
    parser.add_argument("--problem-cost-s", type=float, default=40.0)
    parser.add_argument(
        "--with-current",
        action="store_true",
        help="split: evaluate the current kernel too (before the candidate)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    for step in args.steps.split(","):
        if time.monotonic() > deadline - 20:
            log(args.out, step, {"skipped": "deadline"})
            continue
        started = time.monotonic()
        try:
            if step == "split":
                data = step_split(args)
            elif step == "largest":
                data = step_largest(args, deadline)
            elif step == "search":
                data = step_search(args, deadline)
            else:
                raise ValueError(f"unknown step {step!r}")
        except Exception as exc:
            import traceback

            data = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        data["step_s"] = round(time.monotonic() - started, 1)
        log(args.out, step, data)
    table(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
