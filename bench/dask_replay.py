"""The same replay search twice: through `--kernelpro-dask=local` and in this process.

    python bench/dask_replay.py --out DIR [--select EXPR] [--budget N] [--device cpu]

Each run is `pytest --kernelpro-optimize=N --kernelpro-llm=replay:replays -k EXPR` in its own
scratch copy of example_repo/ (no API key: the recorded answers in order), in the order
`--runs` names them (default: the Dask run first). The machine's ceilings (measured once per
machine, in `.kernelpro/cache`) are measured by the first run and copied into the later runs'
copies, so that only the first pays for them (`--fresh-cache`: each measures its own).
DIR/results.json gets, per run as it finishes: exit status, wall time, the outcomes, the
ranked candidates (strategy, speedup over the current kernel, verdict), the winner, the
optimize pass's wall split, each node's time on the search clock and the evaluations per
minute of the search (evaluations over the search clock at its last evaluation), and for the
Dask run the cluster from the trajectory's header (workers, their sandbox and probe, GPUs,
secret-looking names, the cluster's start and probe seconds) and each node's worker stamps.
DIR/<run>.log is the streamed pytest output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _pytest_command(args: argparse.Namespace, dask: str | None) -> list[str]:
    import importlib.metadata

    installed = any(
        "pytest_kernelpro" in e.value for e in importlib.metadata.entry_points(group="pytest11")
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *([] if installed else ["-p", "pytest_kernelpro.plugin"]),
    ]
    cmd += [
        "-p", "no:cacheprovider", f"--kernelpro-time-budget={args.timing}",
        "--kernelpro-warmup-ms=50", f"--kernelpro-optimize={args.budget}",
        "--kernelpro-llm=replay:replays", f"--kernelpro-feedback={args.feedback}",
        "--kernelpro-candidates=1", "-k", args.select, "-rA",
    ]  # fmt: skip
    if args.device:
        cmd.append(f"--kernelpro-device={args.device}")
    if dask:
        cmd.append(f"--kernelpro-dask={dask}")
    return cmd


def _trajectory(path: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    nodes = lines[1:]
    # The search clock (from the search's start) when its last evaluation came back.
    search_s = max((float(n.get("elapsed_s") or 0.0) for n in nodes), default=0.0)
    return {
        "cluster": (lines[0].get("meta") or {}).get("dask") if lines else None,
        "search_s": round(search_s, 2),
        "evaluations_per_min": round(60.0 * len(nodes) / search_s, 2) if search_s else None,
        "nodes": [
            {
                "id": n["id"],
                "parent": n["parent"],
                "strategy": n["strategy"],
                "status": n["status"],
                "reason": (n.get("reason") or "")[:200],
                "speedup_vs_reference": n["speedup"],
                "wall_s": n.get("wall_s"),  # its sandboxed worker process
                "elapsed_s": n.get("elapsed_s"),  # the search clock when it came back
                "phases": (n.get("metrics") or {}).get("phases"),  # of its worker process
                "sandbox": (n.get("metrics") or {}).get("sandbox"),
                "dask": (n.get("metrics") or {}).get("dask"),
            }
            for n in nodes
        ],
    }


def _summary(user: Path, out: Path, name: str) -> dict[str, Any]:
    """Per kernel: the report's optimize summary (when the run got that far) and its
    trajectory (kept in OUT too, also for a run cut short)."""
    kernels: dict[str, Any] = {}
    for trajectory in sorted((user / ".kernelpro" / "optimize").glob("*/run-*/trajectory.jsonl")):
        kernel = trajectory.parent.parent.name
        shutil.copy(trajectory, out / f"{name}-{kernel}-trajectory.jsonl")
        kernels[kernel] = _trajectory(trajectory)
    report = user / ".kernelpro" / "kernelpro-report.json"
    if not report.is_file():
        return kernels
    for record in json.loads(report.read_text())["records"]:
        opt = (record.get("extra") or {}).get("optimize")
        if not opt:
            continue
        ranked = [
            {k: c.get(k) for k in ("node_id", "strategy", "speedup_vs_current", "verdict", "rank")}
            for c in opt.get("candidates") or []
        ]
        run_dir = Path(opt.get("run_dir") or "")
        entry = kernels.setdefault(run_dir.parent.name or record["name"], {})
        entry.update(
            status=opt.get("status"),
            outcomes=opt.get("outcomes"),
            evaluations=opt.get("evaluations"),
            current_speedup_vs_reference=(opt.get("current") or {}).get("speedup_vs_reference"),
            candidates=ranked,
            winner=next((c["strategy"] for c in ranked if c.get("rank") == 1), None),
            status_reason=opt.get("reason"),
            wall_s=opt.get("wall_s"),
            elapsed_s=opt.get("elapsed_s"),
            # Each profile's record, where it was made (a Dask worker) and in which sandbox.
            profiles=opt.get("profiles"),
            # The cluster's start, probe and close seconds (--kernelpro-dask only).
            dask_timings=(opt.get("dask") or {}).get("timings"),
        )
    return kernels


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--select", default="2048x1024")
    parser.add_argument("--budget", default="3")
    parser.add_argument("--timing", default="0.2")
    parser.add_argument("--device", default=None, help="cpu: a dry run without a GPU")
    parser.add_argument("--dask", default="local")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/kp-dask-bench"))
    parser.add_argument("--deadline-s", type=float, default=600.0)
    parser.add_argument(
        "--feedback", default="none", help="--kernelpro-feedback of both runs (tools: profiled)"
    )
    parser.add_argument(
        "--runs", default="dask,in_process", help="which of the two runs, in this order"
    )
    parser.add_argument(
        "--reserve-s",
        type=float,
        default=100.0,
        help="seconds of the deadline kept for the second run (the first cannot take them)",
    )
    parser.add_argument(
        "--fresh-cache",
        action="store_true",
        help="each run measures the machine's ceilings itself (default: the first run's)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    results: dict[str, Any] = {"select": args.select, "budget": args.budget, "runs": {}}
    started = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    known = {"dask": args.dask, "in_process": None}
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--runs={args.runs!r}: name dask and/or in_process (got {unknown or names})")
    runs = [(name, known[name]) for name in dict.fromkeys(names)]
    first_cache: Path | None = None
    for index, (name, dask) in enumerate(runs):
        user = args.scratch / name
        shutil.copytree(
            REPO / "example_repo", user, ignore=shutil.ignore_patterns(".kernelpro", "__pycache__")
        )
        if first_cache is not None and first_cache.is_dir() and not args.fresh_cache:
            shutil.copytree(first_cache, user / ".kernelpro" / "cache")
        left = args.deadline_s - (time.monotonic() - started)
        if index < len(runs) - 1:  # the later run gets its share too
            left -= args.reserve_s
        cmd = _pytest_command(args, dask)
        began = time.monotonic()
        with open(args.out / f"{name}.log", "w", encoding="utf-8") as log:
            try:
                code: Any = subprocess.run(
                    cmd, cwd=user, env=env, stdout=log, stderr=subprocess.STDOUT,
                    timeout=max(10.0, left), check=False,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = "timeout"
        if first_cache is None:
            first_cache = user / ".kernelpro" / "cache"
        results["runs"][name] = {
            "cmd": " ".join(cmd),
            "ceilings": "measured" if index == 0 or args.fresh_cache else "copied",
            "exit": code,
            "wall_s": round(time.monotonic() - began, 1),
            "kernels": _summary(user, args.out, name),
        }
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    winners = {
        name: {k: v.get("winner") for k, v in run["kernels"].items()}
        for name, run in results["runs"].items()
    }
    results["same_winner"] = len({json.dumps(w, sort_keys=True) for w in winners.values()}) == 1
    results["winners"] = winners
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps({"winners": winners, "same_winner": results["same_winner"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
