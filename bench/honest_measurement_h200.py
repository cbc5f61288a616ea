"""Cheating kernels and candidates against the gate and the optimizer, on the H200 (issue 28).

    python bench/honest_measurement_h200.py --out DIR [--device cuda|cpu] [--skip-optimize]

1. gate: bench/cheats/project/test_gate_cheats*.py and test_gate_import_patcher.py (an honest
   control, two honest side-stream kernels, an exact algebraic rewrite, fifteen cheats) through `pytest --kernelpro-save-baseline` then
   `pytest --kernelpro-check`; per kernel: outcome and message (DIR/gate.json);
2. optimizer: bench/cheats/project/test_softmax.py through `pytest --kernelpro-optimize=13
   --kernelpro-llm=replay:replays` with the replay corpus bench/cheats/project/replays (twelve
   cheating candidates, then the honest fused softmax); per candidate: status and reason, and
   the search's best (DIR/optimize.json).

Expected: every cheat refused with its reason, the honest kernels passing, the honest
candidate the winner. `--device cpu` is the dry run (the CUDA items skip; the CUDA candidates
fail to run). The table last: one line per kernel and per candidate. Resumable: a step whose
JSON is in DIR is not run again. Files: table.txt, gate.json, optimize.json, logs.tgz (the
pytest logs and the search's run folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "bench" / "cheats" / "project"

GATE_EXPECTED_PASS = {"honest", "joined_side_stream", "own_stream_marked_any", "honest_rewrite"}
GATE_FILES = (
    "test_gate_cheats.py",
    "test_gate_cheats_fresh.py",
    "test_gate_import_patcher.py",
    "test_gate_honest_rewrite.py",
)
# A memo on fresh content never hits: it is defeated when refused or when its time is no
# better than the honest kernel's (it pays its sampling and gains nothing).
DEFEATED_IF_NOT_FASTER = {"cheat_memo_by_content_sample"}


def pytest_cmd(*args: str) -> list[str]:
    import importlib.metadata

    installed = any(
        "pytest_kernelpro" in e.value for e in importlib.metadata.entry_points(group="pytest11")
    )
    plugin = [] if installed else ["-p", "pytest_kernelpro.plugin"]
    return [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", *args]


def run(cmd: list[str], cwd: Path, log: Path, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
    env["PYTHONUNBUFFERED"] = "1"
    with open(log, "w", encoding="utf-8") as handle:
        try:
            code: Any = subprocess.run(
                cmd, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout,
                check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"cmd": " ".join(cmd[2:]), "exit": code, "wall_s": round(time.monotonic() - started, 1)}


def records(report: Path) -> list[dict[str, Any]]:
    if not report.is_file():
        return []
    return list(json.loads(report.read_text(encoding="utf-8")).get("records") or [])


def gate_step(work: Path, out: Path, device: str) -> dict[str, Any]:
    common = [f"--kernelpro-device={device}", *GATE_FILES]
    steps = {
        "baseline": run(
            pytest_cmd("--kernelpro-save-baseline=base.yaml", *common), work, out / "logs" / "gate-baseline.log", 240
        ),
        "check": run(
            pytest_cmd("--kernelpro-check", "--kernelpro-baseline=base.yaml", *common),
            work, out / "logs" / "gate-check.log", 240,
        ),
    }  # fmt: skip
    kernels = {}
    for record in records(work / ".kernelpro" / "kernelpro-report.json"):
        name = record.get("name")
        timing = record.get("timing") or {}
        kernels[name] = {
            "outcome": record.get("outcome"),
            "message": (record.get("message") or "")[:600],
            "median_s": (timing.get("stats") or {}).get("median_s"),
            "honesty": timing.get("honesty"),
            "expected": "pass" if name in GATE_EXPECTED_PASS else "refused",
        }
    honest_median = (kernels.get("honest") or {}).get("median_s")
    for name, k in kernels.items():
        k["as_expected"] = (k["outcome"] == "passed") == (k["expected"] == "pass") or (
            k["outcome"] == "skipped"
        )
        if name in DEFEATED_IF_NOT_FASTER and k["outcome"] == "passed" and honest_median:
            k["as_expected"] = bool(k["median_s"] and k["median_s"] >= 0.98 * honest_median)
            k["message"] = k["message"] or (
                f"passed at {k['median_s']:.4g} s against the honest kernel's "
                f"{honest_median:.4g} s: its memo never made it faster"
            )
    return {"steps": steps, "kernels": kernels}


def optimize_step(work: Path, out: Path, device: str, budget: int) -> dict[str, Any]:
    cmd = pytest_cmd(
        f"--kernelpro-device={device}",
        f"--kernelpro-optimize={budget}",
        "--kernelpro-llm=replay:replays",
        "--kernelpro-feedback=none",  # no profiles: the checks at evaluation must catch them
        "--kernelpro-time-budget=0.5",
        "test_softmax.py",
    )
    step = run(cmd, work, out / "logs" / "optimize.log", 330)
    candidates = []
    best = None
    runs = sorted((work / ".kernelpro" / "optimize" / "softmax_rows").glob("run-*"))
    if runs:
        for line in (runs[-1] / "trajectory.jsonl").read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if entry.get("kind") != "node":
                continue
            candidates.append({
                "node": entry.get("id"),
                "strategy": str(entry.get("strategy") or "")[:80],
                "status": entry.get("status"),
                "reason": str(entry.get("reason") or "")[:500],
                "speedup": entry.get("speedup"),
                "reward": entry.get("reward"),
            })  # fmt: skip
        summary = runs[-1] / "summary.json"
        if summary.is_file():
            best = json.loads(summary.read_text(encoding="utf-8"))
        shutil.copytree(runs[-1], out / "logs" / "optimize-run", dirs_exist_ok=True)
    return {"step": step, "candidates": candidates, "summary": best}


def table(gate: dict[str, Any], optimize: dict[str, Any] | None) -> str:
    lines = ["gate (--kernelpro-check):", f"{'kernel':32} {'outcome':8} {'ok':3} reason"]
    for name, k in sorted((gate or {}).get("kernels", {}).items()):
        ok = "yes" if k["as_expected"] else "NO"
        lines.append(f"{name:32} {k['outcome'] or '?':8} {ok:3} {k['message'][:150]}")
    if optimize is not None:
        lines += ["", "optimizer candidates (replay):", f"{'strategy':40} {'status':9} reward  reason"]  # fmt: skip
        for c in optimize.get("candidates", []):
            reward = c.get("reward")
            shown = f"{reward:6.2f}" if isinstance(reward, (int, float)) else "     -"
            lines.append(
                f"{c['strategy'][:40]:40} {c['status'] or '?':9} {shown}  {c['reason'][:150]}"
            )
        summary = optimize.get("summary") or {}
        keys = ("status", "reason", "winner", "best_speedup", "best_speedup_vs_current")
        lines.append("search: " + json.dumps({k: summary.get(k) for k in keys})[:600])
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=int, default=13)
    parser.add_argument("--skip-optimize", action="store_true")
    args = parser.parse_args()
    out = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("KP_HONEST_WORK", "/tmp/kp-honest"))
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(PROJECT, work)
    gate_json, optimize_json = out / "gate.json", out / "optimize.json"
    if not gate_json.is_file():
        gate_json.write_text(json.dumps(gate_step(work, out, args.device), indent=1))
    gate = json.loads(gate_json.read_text())
    optimize = None
    if not args.skip_optimize:
        if not optimize_json.is_file():
            result = optimize_step(work, out, args.device, args.budget)
            optimize_json.write_text(json.dumps(result, indent=1))
        optimize = json.loads(optimize_json.read_text())
    text = table(gate, optimize)
    (out / "table.txt").write_text(text + "\n")
    # Four files come back: the tables, the two JSONs and one archive of the logs.
    with tarfile.open(out / "logs.tgz", "w:gz") as archive:
        archive.add(out / "logs", arcname="logs")
    shutil.rmtree(out / "logs")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
