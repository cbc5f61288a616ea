"""Wall time of a KernelBench-scale CPU session, as a user runs it: what fresh content per
timed call and the unpredictable output checks cost (`measure/timing/fresh_inputs.py`).

Copies the chosen problem files into an empty temporary folder and runs, from there,
`python -m pytest --kernelpro-problems=problems --kernelpro-device=cpu` with the plugin's
defaults, `--runs` times, with the package found at `--tree` (a checkout: the tree before
and after a change). Prints one JSON line per run: the session's wall time and, per item,
its outcome and the record's `timing.honesty` (the per-call refill cost, the checked calls).

The vendored problems are sized for an H200 (a 6 GiB input for 19_ReLU): `--batch-size N`
rewrites each file's `batch_size = ...` line to N so a CPU session fits in memory (the rest
of the file, the model and its input maker, is unchanged).

Run: python bench/fresh_content_wall.py --tree . --runs 2 --batch-size 16 \
        bench/kernelbench_level1/{19_ReLU,20_LeakyReLU,23_Softmax,38_L1Norm_,39_L2Norm_}.py
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


def one_run(
    tree: Path, problems: list[Path], batch_size: int | None, ceilings: Path | None
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="kp-fresh-wall-") as tmp:
        folder = Path(tmp) / "problems"
        folder.mkdir()
        for problem in problems:
            text = problem.read_text(encoding="utf-8")
            if batch_size is not None:
                text = re.sub(r"(?m)^batch_size = \d+", f"batch_size = {batch_size}", text)
            (folder / problem.name).write_text(text, encoding="utf-8")
        report = Path(tmp) / "report.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        env.pop("KERNELPRO_DEVICE", None)
        command = [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
            "--kernelpro-problems=problems", "--kernelpro-device=cpu",
            f"--kernelpro-json={report}",
        ]  # fmt: skip
        if ceilings is not None:
            command.append(f"--kernelpro-ceilings={ceilings}")
        started = time.monotonic()
        done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        items = []
        if report.exists():
            data = json.loads(report.read_text(encoding="utf-8"))
            for record in data.get("records", data if isinstance(data, list) else []):
                timing = record.get("timing") or {}
                items.append(
                    {
                        "name": record.get("name"),
                        "outcome": record.get("outcome") or record.get("status"),
                        "median_s": (timing.get("stats") or {}).get("median_s"),
                        "samples": len(timing.get("samples_s") or []),
                        "timing_wall_s": timing.get("wall_s"),
                        "honesty": timing.get("honesty"),
                    }
                )
        return {
            "wall_s": round(wall, 2),
            "rc": done.returncode,
            "tail": done.stdout.strip().splitlines()[-3:] if done.stdout else [],
            "stderr": done.stderr.strip().splitlines()[-3:] if done.stderr else [],
            "items": items,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument(
        "--ceilings",
        type=Path,
        default=None,
        help="a ceilings file (as cached after a first session): without it each session "
        "probes the machine, which on a loaded one takes a minute and varies with the load",
    )
    parser.add_argument("problems", nargs="+", type=Path)
    args = parser.parse_args()
    problems = [p.resolve() for p in args.problems]
    for _ in range(args.runs):
        print(
            json.dumps(one_run(args.tree.resolve(), problems, args.batch_size, args.ceilings)),
            flush=True,
        )


if __name__ == "__main__":
    main()
