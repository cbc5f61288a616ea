"""Per-candidate start time of the sandbox: the wall time from launching a sandboxed process
to its exit, for a process that does nothing (`python -c pass`), so what is measured is the
sandbox's own cost (spec, namespaces, mount view, capability drop, interpreter start).

    PYTHONPATH=TREE python bench/sandbox_start.py [--runs N] [--bwrap] [--project DIR]

TREE is the checkout whose `pytest_kernelpro` is measured (compare two commits by running
this once with each). `--project DIR` registers DIR's project view where the tree has one
(`project_view.set_session_view`), as an evaluator does; `--bwrap` also times bubblewrap
(`bwrap`) building an equivalent view (the system directories and the shown paths bound
read-only, the scratch directory writable, every namespace unshared, capabilities dropped).
Prints one JSON line with the medians and quartiles in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_kernelpro.optimize.sandbox.isolation import Isolation, sandbox_spec


def _timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def _summary(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=4)
    return {
        "median_ms": round(1000 * statistics.median(samples), 1),
        "q1_ms": round(1000 * q[0], 1),
        "q3_ms": round(1000 * q[2], 1),
    }


def _bwrap_command(spec: dict[str, Any], scratch: Path, python: str) -> list[str]:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for top in ("usr", "bin", "sbin", "lib", "lib64", "etc", "opt", "var", "run"):
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in spec["show"]:
        args += ["--ro-bind", path, path]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    return [*args, "--", python, "-c", "pass"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--bwrap", action="store_true")
    parser.add_argument("--project", type=Path)
    args = parser.parse_args()
    if args.project is not None:
        os.chdir(args.project)
        try:
            from pytest_kernelpro.optimize.sandbox import project_view as pv
        except ImportError:
            pv = None  # a tree without a project view shows the project whole
        if pv is not None:
            entries = [str(p) for p in args.project.glob("test_*.py")]
            pv.set_session_view(pv.project_view([str(args.project)], entries))
    isolation = Isolation.probe()
    out: dict[str, object] = {"isolation": isolation.describe(), "runs": args.runs}
    scratch = Path(tempfile.mkdtemp(prefix="kernelpro-bench-start-"))
    try:
        spec_s, start_s = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            command = isolation.wrap([sys.executable, "-c", "pass"], scratch=scratch)
            spec_s.append(time.perf_counter() - started)
            start_s.append(_timed(command, scratch))
        out["spec"] = _summary(spec_s)
        out["sandboxed_start"] = _summary(start_s)
        plain = [_timed([sys.executable, "-c", "pass"], scratch) for _ in range(args.runs)]
        out["plain_start"] = _summary(plain)
        if args.bwrap and shutil.which("bwrap"):
            spec = sandbox_spec(scratch=scratch)
            command = _bwrap_command(spec, scratch, sys.executable)
            out["bwrap_start"] = _summary([_timed(command, scratch) for _ in range(args.runs)])
            out["bwrap_binds"] = len(spec["show"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
