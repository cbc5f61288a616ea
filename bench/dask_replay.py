"""The same replay search twice: through `--kernelpro-dask=local` and in this process.

    python bench/dask_replay.py --out DIR [--select EXPR] [--budget N] [--device cpu]

Each run is `pytest --kernelpro-optimize=N --kernelpro-llm=replay:replays -k EXPR` in its own
scratch copy of example_repo/ (no API key: the recorded answers in order) and its own process
group, in the order `--runs` names them (default: the Dask run first), each under its own
limit: what is left of `--deadline-s`, less `--reserve-s` for every later run. A run past its
limit is interrupted (SIGINT, so the search writes its summary so far), then its whole process
group killed (the Dask workers and sandboxed processes with it), and the next run still runs;
results are written after every run. The machine's ceilings (measured once per machine, in
`.kernelpro/cache`) are measured by the first run and copied into the later runs' copies, so
that only the first pays for them (`--fresh-cache`: each measures its own).

DIR/results.json gets, per run as it finishes: exit status (or "timeout"), wall time, and per
kernel the winner of the final re-measurement (node id, the SHA-256 of its code, re-measured
speedup over the current kernel and the reference, p-value, the ranking's status:
"improved" / "no improvement found"), the search's best by its own single measurement (also
for a run cut short, from the trajectory), the ranked candidates, evaluations, the search's
wall time and split, each evaluation's wall time (its sandboxed worker process) and its time
on the search clock, the evaluations per minute of the search, and for the Dask run the
cluster from the trajectory's header and each node's worker stamps. `same_winner` compares
the runs' winners by code hash (None when a run has no ranked winner). DIR/results.md is the
same as a table; DIR/<run>.log the streamed pytest output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GRACE_S = 10.0  # after SIGINT: time for the search to write its summary before the kill


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


def _code_hash(code: str | None) -> str | None:
    """The SHA-256 (16 hex digits) of a candidate's code (as the replay corpus keys it)."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()[:16] if code else None


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_pytest(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, limit_s: float) -> Any:
    """Exit status of pytest in its own process group, or "timeout" after `limit_s`: then
    SIGINT (the search writes its summary), GRACE_S later the whole group is killed. Whatever
    the run left behind (a Dask worker, a sandboxed process) is killed in either case, so it
    cannot hold the GPU or the CPUs during the next run."""
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: Any = proc.wait(timeout=max(10.0, limit_s))
        except subprocess.TimeoutExpired:
            code = "timeout"
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        finally:
            _kill_group(proc)
            proc.wait()
        if code == "timeout":
            out.write(f"\n[dask_replay] cut at its {limit_s:.0f} s limit\n")
    return code


def _trajectory(path: Path) -> dict[str, Any]:
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:  # a line cut by the kill
            continue
    nodes = [n for n in lines[1:] if n.get("kind", "node") == "node"]
    # The search clock (from the search's start) when its last evaluation came back.
    search_s = max((float(n.get("elapsed_s") or 0.0) for n in nodes), default=0.0)
    walls = [float(n["wall_s"]) for n in nodes if n.get("wall_s") is not None]
    correct = [n for n in nodes if n.get("status") == "correct" and n.get("speedup")]
    best = max(correct, key=lambda n: float(n["speedup"]), default=None)
    return {
        "cluster": (lines[0].get("meta") or {}).get("dask") if lines else None,
        "search_s": round(search_s, 2),
        "evaluations_per_min": round(60.0 * len(nodes) / search_s, 2) if search_s else None,
        "evaluation_wall_s": [round(w, 2) for w in walls],
        "evaluation_wall_mean_s": round(sum(walls) / len(walls), 2) if walls else None,
        # The search's own single measurement (against the reference), not re-measured.
        "search_best": None
        if best is None
        else {
            "node_id": best["id"],
            "code_hash": _code_hash(best.get("code")),
            "speedup_vs_reference": best["speedup"],
        },
        "code_hashes": {str(n["id"]): _code_hash(n.get("code")) for n in nodes},
        "nodes": [
            {
                "id": n["id"],
                "parent": n["parent"],
                "strategy": n["strategy"],
                "status": n["status"],
                "reason": (n.get("reason") or "")[:200],
                "speedup_vs_reference": n["speedup"],
                "code_hash": _code_hash(n.get("code")),
                "wall_s": n.get("wall_s"),  # its sandboxed worker process
                "elapsed_s": n.get("elapsed_s"),  # the search clock when it came back
                "phases": (n.get("metrics") or {}).get("phases"),  # of its worker process
                "sandbox": (n.get("metrics") or {}).get("sandbox"),
                "dask": (n.get("metrics") or {}).get("dask"),
            }
            for n in nodes
        ],
    }


def _optimize_entry(opt: dict[str, Any], hashes: dict[str, Any]) -> dict[str, Any]:
    """What a run's optimize summary (the report's, else the run folder's) says."""
    ranked = [
        {k: c.get(k) for k in ("node_id", "strategy", "speedup_vs_current",
                               "speedup_vs_reference", "p_value", "verdict", "rank")}
        for c in opt.get("candidates") or []
    ]  # fmt: skip
    for c in ranked:
        c["code_hash"] = hashes.get(str(c["node_id"]))
    ranking = opt.get("ranking") or {}
    top = next((c for c in ranked if c.get("rank") == 1), None)
    winner_id = opt.get("winner")
    winner = next((c for c in ranked if c["node_id"] == winner_id), None) if winner_id else None
    return {
        "status": opt.get("status"),  # the ranking's: improved / no improvement found / ...
        "final_ranking": bool(ranking),
        "outcomes": opt.get("outcomes"),
        "evaluations": opt.get("evaluations"),
        "current_speedup_vs_reference": (opt.get("current") or {}).get("speedup_vs_reference"),
        "candidates": ranked,
        # The ranked winner: re-measured, clearly faster than the current kernel.
        "winner": winner,
        # The fastest re-measured candidate (also when none is clearly faster).
        "top": top,
        "status_reason": opt.get("reason"),
        "wall_s": opt.get("wall_s"),
        "elapsed_s": opt.get("elapsed_s"),
        "rounds": opt.get("rounds"),
        "confirmation": opt.get("confirmation"),
        # Each profile's record, where it was made (a Dask worker) and in which sandbox.
        "profiles": opt.get("profiles"),
        # The cluster's start, probe and close seconds (--kernelpro-dask only).
        "dask_timings": (opt.get("dask") or {}).get("timings"),
    }


def _summary(user: Path, out: Path, name: str) -> dict[str, Any]:
    """Per kernel: its trajectory (kept in OUT too, also for a run cut short) and the
    optimize summary: the report's when the run got that far, else the run folder's."""
    kernels: dict[str, Any] = {}
    folders: dict[str, Path] = {}
    for trajectory in sorted((user / ".kernelpro" / "optimize").glob("*/run-*/trajectory.jsonl")):
        kernel = trajectory.parent.parent.name
        shutil.copy(trajectory, out / f"{name}-{kernel}-trajectory.jsonl")
        kernels[kernel] = _trajectory(trajectory)
        folders[kernel] = trajectory.parent
    report = user / ".kernelpro" / "kernelpro-report.json"
    found: set[str] = set()
    if report.is_file():
        for record in json.loads(report.read_text())["records"]:
            opt = (record.get("extra") or {}).get("optimize")
            if not opt:
                continue
            kernel = Path(opt.get("run_dir") or "").parent.name or record["name"]
            entry = kernels.setdefault(kernel, {})
            entry.update(_optimize_entry(opt, entry.get("code_hashes") or {}), source="report")
            found.add(kernel)
    for kernel, folder in folders.items():
        summary = folder / "summary.json"
        if kernel in found or not summary.is_file():
            continue
        entry = kernels[kernel]
        opt = json.loads(summary.read_text())
        entry.update(_optimize_entry(opt, entry.get("code_hashes") or {}), source="run folder")
    return kernels


def _x(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}x"


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# dask_replay: `-k {results['select']}`, budget {results['budget']}",
        "",
        "| run | exit | wall s | kernel | evaluations | search s | eval wall s (mean) | "
        "search's best (node, hash, vs ref) | ranking | winner (node, hash) | vs current | "
        "vs reference | p |",
        "|---|---|---:|---|---:|---:|---|---|---|---|---:|---:|---:|",
    ]
    for name, run in results["runs"].items():
        for kernel, k in (run.get("kernels") or {"-": {}}).items():
            sb = k.get("search_best") or {}
            w = k.get("winner") or k.get("top") or {}
            walls = ", ".join(f"{x:.1f}" for x in k.get("evaluation_wall_s") or [])
            lines.append(
                f"| {name} | {run.get('exit')} | {run.get('wall_s')} | {kernel} | "
                f"{k.get('evaluations', len(k.get('nodes') or []))} | "
                f"{k.get('elapsed_s') and round(k['elapsed_s'], 1)} | {walls} "
                f"({k.get('evaluation_wall_mean_s')}) | "
                f"{sb.get('node_id')}, {sb.get('code_hash')}, {_x(sb.get('speedup_vs_reference'))} | "
                f"{k.get('status') if k.get('final_ranking') else 'not reached'} | "
                f"{w.get('node_id')}, {w.get('code_hash')}"
                f"{'' if k.get('winner') else ' (not a winner)' if w else ''} | "
                f"{_x(w.get('speedup_vs_current'))} | {_x(w.get('speedup_vs_reference'))} | "
                f"{'-' if w.get('p_value') is None else format(w['p_value'], '.2g')} |"
            )
    lines += ["", f"same winner (by code hash): {results.get('same_winner')}", ""]
    return "\n".join(lines)


def _write(results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(_markdown(results))


def _compare(results: dict[str, Any]) -> None:
    """Winners per run and kernel by code hash; `same_winner` True/False when every run has a
    ranked winner for every kernel, else None (not shown)."""
    winners = {
        name: {
            kernel: (k.get("winner") or {}).get("code_hash")
            for kernel, k in (run.get("kernels") or {}).items()
        }
        for name, run in results["runs"].items()
    }
    results["winners"] = winners
    flat = [h for w in winners.values() for h in w.values()]
    if len(winners) < 2 or not flat or any(h is None for h in flat):
        results["same_winner"] = None
    else:
        results["same_winner"] = len({json.dumps(w, sort_keys=True) for w in winners.values()}) == 1


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
        help="seconds of the deadline kept for each later run (an earlier one cannot take them)",
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
        entry: dict[str, Any] = {}
        results["runs"][name] = entry
        began = time.monotonic()
        try:
            shutil.copytree(
                REPO / "example_repo",
                user,
                ignore=shutil.ignore_patterns(".kernelpro", "__pycache__"),
            )
            if first_cache is not None and first_cache.is_dir() and not args.fresh_cache:
                shutil.copytree(first_cache, user / ".kernelpro" / "cache")
            left = args.deadline_s - (time.monotonic() - started)
            left -= args.reserve_s * (len(runs) - 1 - index)  # the later runs' shares
            cmd = _pytest_command(args, dask)
            entry.update(
                cmd=" ".join(cmd),
                ceilings="measured" if first_cache is None or args.fresh_cache else "copied",
                limit_s=round(max(10.0, left), 1),
            )
            entry["exit"] = _run_pytest(cmd, user, env, args.out / f"{name}.log", left)
            entry["wall_s"] = round(time.monotonic() - began, 1)
            if first_cache is None:
                first_cache = user / ".kernelpro" / "cache"
            entry["kernels"] = _summary(user, args.out, name)
        except Exception as exc:  # one run's failure must not cost the other run
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry.setdefault("wall_s", round(time.monotonic() - began, 1))
        _compare(results)
        _write(results, args.out)
    print(_markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
