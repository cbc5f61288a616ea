"""The replay corpus of example_repo/ through `pytest --kernelpro-optimize`, no API key, and
every best patch applied to a fresh clone and re-checked.

    python bench/optimize_replay.py --out DIR [--select EXPR] [--device cpu]

1. copy example_repo/ to a scratch git repository (the user's repository);
2. `pytest --kernelpro-optimize=20 --kernelpro-llm=replay:replays -k EXPR
   --kernelpro-save-baseline=BASE` there (timed), keeping its stdout, JSON report and JUnit;
3. `git clone` it, check that each best.patch applies alone (`git apply --check`), apply them
   all and run `pytest --kernelpro-check --kernelpro-baseline=BASE -k EXPR`: the gate's
   re-measured change of each patched kernel against the kernel it started from;
4. `pytest --collect-only` in the clone: every item is still collected;
5. DIR/results.json: per kernel the search (evaluations, outcomes, best candidate, speedup
   over the current kernel and over the reference in the search, % of roofline before and
   after), the re-check (median before/after, change, verdict), wall times.
Each step's output goes to DIR as it finishes, so a run cut short keeps what it did.
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
DEFAULT_SELECT = "softmax_rows or matmul or 2048x1024"


def run(cmd: list[str], cwd: Path, logs: Path, name: str, timeout: float) -> dict[str, Any]:
    """Run a step with its output streamed to LOGS/NAME.log (kept if the call is cut off)."""
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    with open(logs / f"{name}.log", "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(
                cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                timeout=timeout, check=False,
            )  # fmt: skip
            code: Any = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"cmd": " ".join(cmd), "exit": code, "wall_s": round(time.monotonic() - started, 1)}


HAVE_GIT = shutil.which("git") is not None


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not HAVE_GIT:
        return _no_git(cwd, *args)
    return subprocess.run(
        ["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def _no_git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Where the machine has no git: a copy for `clone`, a strict hunk applier for `apply`
    (context must match exactly, as git apply requires); results.json says it was used."""
    ok = subprocess.CompletedProcess(["git", *args], 0, "", "")
    if args[0] in ("init", "add", "commit"):
        return ok
    if args[0] == "clone":
        shutil.copytree(args[-2], args[-1])
        return ok
    if args[0] == "apply":
        check = "--check" in args
        try:
            _apply(cwd, Path(args[-1]).read_text(encoding="utf-8"), dry=check)
        except ValueError as exc:
            return subprocess.CompletedProcess(["git", *args], 1, "", str(exc))
        return ok
    raise ValueError(f"no git here for {args}")


def _apply(root: Path, text: str, *, dry: bool) -> None:
    import re

    files = re.split(r"^diff --git a/\S+ b/(\S+)\n", text, flags=re.M)
    for name, body in zip(files[1::2], files[2::2], strict=True):
        target = root / name
        lines = target.read_text(encoding="utf-8").splitlines(True) if target.exists() else []
        if "new file mode" in body.split("@@", 1)[0] and target.exists():
            raise ValueError(f"{name} already exists")
        out, pos = [], 0
        parts = re.split(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*\n", body, flags=re.M)
        for start, hunk in zip(parts[1::2], parts[2::2], strict=True):
            old = max(int(start) - 1, 0)
            out += lines[pos:old]
            pos = old
            for line in hunk.splitlines(True):
                if line.startswith("-- \n") or line.startswith("\\"):
                    break
                tag, rest = line[:1], line[1:]
                if tag in (" ", "-"):
                    if pos >= len(lines) or lines[pos] != rest:
                        raise ValueError(f"{name}: context does not match at line {pos + 1}")
                    pos += 1
                    if tag == " ":
                        out.append(rest)
                elif tag == "+":
                    out.append(rest)
                else:
                    break
        out += lines[pos:]
        if not dry:
            target.write_text("".join(out), encoding="utf-8")


def records(report: Path) -> dict[str, Any]:
    if not report.is_file():
        return {}
    return {r["name"]: r for r in json.loads(report.read_text())["records"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--select", default=DEFAULT_SELECT)
    parser.add_argument("--budget", default="20")
    parser.add_argument("--feedback", default=None, help="--kernelpro-feedback (none: no ncu)")
    parser.add_argument("--device", default=None, help="cpu: a dry run on a machine without GPU")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/kernelpro-bench"))
    parser.add_argument("--timing", default="0.3", help="--kernelpro-time-budget (seconds)")
    args = parser.parse_args()
    final: Path = args.out
    final.mkdir(parents=True, exist_ok=True)
    # Logs, reports and patches go to a raw folder, packed into one archive after every
    # step (the device returns at most 8 files); results.json stays beside it.
    out = args.scratch.parent / (args.scratch.name + "-raw")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    results: dict[str, Any] = {
        "select": args.select,
        "budget": args.budget,
        "git": "git" if HAVE_GIT else "no git on this machine: copies and a strict hunk applier",
        "steps": {},
    }

    def save() -> None:
        (final / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        with tarfile.open(final / "raw.tar.gz", "w:gz") as tar:
            tar.add(out, arcname="raw")

    user = args.scratch / "user-repo"
    clone = args.scratch / "fresh-clone"
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    shutil.copytree(
        REPO / "example_repo", user, ignore=shutil.ignore_patterns(".kernelpro", "__pycache__")
    )
    git(user, "init", "-q")
    git(user, "add", "-A")
    git(user, "commit", "-qm", "example_repo")
    base = args.scratch / "base.yaml"
    # The plugin by its entry point when installed, else named (a machine with the package
    # only on PYTHONPATH).
    import importlib.metadata

    installed = any(
        "pytest_kernelpro" in e.value for e in importlib.metadata.entry_points(group="pytest11")
    )
    common = [] if installed else ["-p", "pytest_kernelpro.plugin"]
    common += [
        "-p",
        "no:cacheprovider",
        f"--kernelpro-time-budget={args.timing}",
        "--kernelpro-warmup-ms=50",
    ]
    if args.device:
        common.append(f"--kernelpro-device={args.device}")
    if args.feedback:
        common.append(f"--kernelpro-feedback={args.feedback}")
    cmd = [
        sys.executable, "-m", "pytest", *common, f"--kernelpro-optimize={args.budget}",
        "--kernelpro-llm=replay:replays", "-k", args.select,
        f"--kernelpro-save-baseline={base}", "--junitxml=junit.xml",
    ]  # fmt: skip
    results["steps"]["optimize"] = run(cmd, user, final, "optimize", 900)
    report = user / ".kernelpro" / "kernelpro-report.json"
    if report.is_file():
        shutil.copy(report, out / "optimize-report.json")
    if (user / "junit.xml").is_file():
        shutil.copy(user / "junit.xml", out / "optimize-junit.xml")
    searched = records(report)
    save()

    # A fresh clone of the user's repository: each patch alone, then all of them.
    git(args.scratch, "clone", "-q", str(user), str(clone))
    if (user / ".kernelpro" / "cache").is_dir():  # measured ceilings: not re-measured
        shutil.copytree(user / ".kernelpro" / "cache", clone / ".kernelpro" / "cache")
    kernels: dict[str, Any] = {}
    for name, record in searched.items():
        summary = (record.get("extra") or {}).get("optimize") or {}
        entry: dict[str, Any] = {
            "status": summary.get("status"),
            "reason": summary.get("reason"),
            "evaluations": summary.get("evaluations"),
            "outcomes": summary.get("outcomes"),
            "stop_reason": summary.get("stop_reason"),
            "search_elapsed_s": summary.get("elapsed_s"),
            "current_vs_reference": (summary.get("current") or {}).get("speedup_vs_reference"),
            "efficiency_before": record.get("efficiency"),
            "median_before_s": ((record.get("timing") or {}).get("stats") or {}).get("median_s"),
            "candidates": [
                {
                    k: c.get(k)
                    for k in (
                        "rank",
                        "node_id",
                        "strategy",
                        "speedup_vs_current",
                        "speedup_vs_reference",
                        "efficiency_after",
                    )
                }  # fmt: skip
                for c in summary.get("candidates") or []
            ],
            "best_patch": summary.get("best_patch"),
        }
        patch = summary.get("best_patch")
        if patch:
            shutil.copy(patch, out / f"{name.replace('[', '_').replace(']', '')}.best.patch")
            alone = args.scratch / f"alone-{len(kernels)}"
            git(args.scratch, "clone", "-q", str(user), str(alone))
            entry["applies_alone"] = git(alone, "apply", "--check", patch).returncode == 0
            applied = git(clone, "apply", patch)
            entry["applied_in_clone"] = applied.returncode == 0
            entry["apply_error"] = applied.stderr.strip() or None
        kernels[name] = entry
    results["kernels"] = kernels
    save()

    patched = [n for n, e in kernels.items() if e.get("applied_in_clone")]
    if patched:
        cmd = [sys.executable, "-m", "pytest", *common, "--kernelpro-check",
               f"--kernelpro-baseline={base}", "-k", args.select]  # fmt: skip
        results["steps"]["recheck"] = run(cmd, clone, final, "recheck", 300)
        rechecked = records(clone / ".kernelpro" / "kernelpro-report.json")
        if (clone / ".kernelpro" / "kernelpro-report.json").is_file():
            shutil.copy(clone / ".kernelpro" / "kernelpro-report.json", out / "recheck-report.json")
        for name, entry in kernels.items():
            record = rechecked.get(name) or {}
            gate = record.get("gate") or {}
            entry["recheck"] = {
                "outcome": record.get("outcome"),
                "language": record.get("language"),
                "median_after_s": ((record.get("timing") or {}).get("stats") or {}).get("median_s"),
                "efficiency_after": record.get("efficiency"),
                "verdict": gate.get("status"),
                "change": gate.get("change"),
                "message": gate.get("message"),
            }
            before, after = entry.get("median_before_s"), entry["recheck"]["median_after_s"]
            if before and after:
                entry["recheck"]["speedup_vs_starting_kernel"] = before / after
        save()
        # Every item of the repository is still collected (running them all would build the
        # load_inline kernels: minutes of device time).
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
        results["steps"]["collect_after_patch"] = run(cmd, clone, final, "collect", 120)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
