"""KernelBench problems run as a user runs them: `pytest --kernelpro-problems=DIR` from an empty
working directory elsewhere, the problems outside pytest's rootdir. A baseline is saved, the
problems are checked unchanged, then each is made to do twice the work and checked again.

What it shows (the gate's protocol end to end, on the CPU): no hard failure on an unchanged
problem, no "wrong output" on an honest one, the fresh-process confirmation running (not
"file or directory not found"), and the doubled problems read as "regressed" (or "suspect"
where the load hides it), never as dishonest.

The problems are the vendored `bench/kernelbench_level1/` files (MIT, KernelBench commit
423217d) with their module-level sizes made small enough for a 2-core CPU (`SIZES`): the code
of each problem is unchanged. "Twice the work": the model's forward runs twice per call.

    python bench/kernelbench_elsewhere.py --out /tmp/kb_elsewhere.json [--problems 19_ReLU ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENDORED = REPO / "bench" / "kernelbench_level1"

# Module-level sizes per problem: inputs of 2-8 MB (the vendored ones are 13-17 GB).
SIZES: dict[str, dict[str, int]] = {
    "19_ReLU": {"batch_size": 64, "dim": 16384},
    "23_Softmax": {"batch_size": 64, "dim": 16384},
    "36_RMSNorm_": {"batch_size": 4, "features": 64, "dim1": 64, "dim2": 64},
    "38_L1Norm_": {"batch_size": 64, "dim": 16384},
    "76_conv_standard_1D_dilated_strided__": {"batch_size": 2, "length": 16384},
}

DOUBLE = """

# Twice the work (bench/kernelbench_elsewhere.py): every forward runs twice.
_kernelpro_bench_forward = Model.forward


def _kernelpro_bench_twice(self, *args, **kwargs):
    _kernelpro_bench_forward(self, *args, **kwargs)
    return _kernelpro_bench_forward(self, *args, **kwargs)


Model.forward = _kernelpro_bench_twice
"""


def small_copy(name: str, target: Path) -> None:
    source = (VENDORED / f"{name}.py").read_text(encoding="utf-8")
    for key, value in SIZES[name].items():
        source, count = re.subn(
            rf"^{key} = .*$", f"{key} = {value}", source, count=1, flags=re.MULTILINE
        )
        if count != 1:
            raise SystemExit(f"{name}: no module-level {key} to resize")
    target.write_text(source, encoding="utf-8")


def run_pytest(work: Path, problems: Path, *args: str, timeout: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KERNELPRO_CONFIRM_PROCESS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"]
    cmd += [f"--kernelpro-problems={problems}", *args]
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.perf_counter() - started
    report_path = work / ".kernelpro" / "kernelpro-report.json"
    records = json.loads(report_path.read_text())["records"] if report_path.exists() else []
    return {
        "command": "pytest " + " ".join(cmd[cmd.index("-rA") + 1 :]),
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "records": [summarize(r) for r in records],
        "tail": proc.stdout[-4000:],
    }


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    gate = record.get("gate") or {}
    extra = record.get("extra") or {}
    remeasured = (gate.get("autotune") or {}).get("remeasurement") or {}
    message = str(record.get("message") or "")
    return {
        "name": record.get("name"),
        "outcome": record.get("outcome"),
        "status": gate.get("status"),
        "change": gate.get("change"),
        "gated": [gate.get("gated_label"), gate.get("gated_baseline_s"), gate.get("gated_now_s")],
        "wall_median_s": ((record.get("timing") or {}).get("stats") or {}).get("median_s"),
        "confirmed_in_fresh_process": remeasured.get("fresh_process"),
        "fresh_process_error": str(extra.get("confirmation_fresh_process_error") or "")[:300],
        "wrong_output": "wrong output" in message,
        "impossible": "impossible time" in message,
        "message": message[:300],
    }


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:+.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", nargs="*", default=list(SIZES))
    parser.add_argument("--unchanged-runs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kb-elsewhere-"))
    problems, work = root / "problems", root / "work"
    problems.mkdir()
    work.mkdir()
    for name in args.problems:
        small_copy(name, problems / f"{name}.py")
    runs: list[dict[str, Any]] = []
    runs.append(
        {
            "step": "save baseline",
            **run_pytest(work, problems, "--kernelpro-save-baseline", timeout=args.timeout),
        }
    )
    for i in range(args.unchanged_runs):
        runs.append(
            {
                "step": f"check unchanged {i + 1}",
                **run_pytest(work, problems, "--kernelpro-check", timeout=args.timeout),
            }
        )
    for name in args.problems:
        with open(problems / f"{name}.py", "a", encoding="utf-8") as handle:
            handle.write(DOUBLE)
    runs.append(
        {
            "step": "check twice the work",
            **run_pytest(work, problems, "--kernelpro-check", timeout=args.timeout),
        }
    )
    result = {
        "problems": args.problems,
        "sizes": {n: SIZES[n] for n in args.problems},
        "python": sys.version.split()[0],
        "nproc": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for run in runs:
        print(f"== {run['step']}: exit {run['exit']}, {run['wall_s']} s")
        for r in run["records"]:
            print(
                f"  {r['name']:<40} {r['outcome']:<7} {str(r['status']):<10} "
                f"change {_pct(r['change'])} "
                f"gated {r['gated'][0]} fresh {r['confirmed_in_fresh_process']} "
                f"{'WRONG-OUTPUT ' if r['wrong_output'] else ''}"
                f"{'FRESH-ERROR ' + r['fresh_process_error'][:80] if r['fresh_process_error'] else ''}"
            )
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
