"""The weight of the gate: one CPU kernel item traced from collection to its JSON record.

For a checkout (`--repo`, default this one) it measures:

- the gate path's lines: the package's top-level modules and `run/`, `problem/`, `measure/`,
  `gate/` (what a CI job's `--kernelpro-check` may run), read from the files;
- one kernel item through `pytest --kernelpro-check` against a baseline saved beforehand (by
  default `example_repo/test_kernels.py::bias_gelu[512x1024]`, selected alone), traced with
  `sys.setprofile` (every thread) from the start of `pytest_cmdline_main` (before
  `pytest_configure`) to the end of `pytest_sessionfinish`, so the session's start, the
  collection, the item and the JSON write are all in: the package's calls (`sys.setprofile`'s "call" events of frames whose code is
  in the package: function calls and generator resumptions, what cProfile counts), the
  distinct functions and package files they cross, per phase, from collection to the JSON
  record (the phases the issue names: collection, the item, the session's finish) and in all;
- the package's modules the check session imported (`sys.modules` at its end, the plugin's
  own import included) and their lines, and whether any is the optimizer's.

Each run is a fresh process (the traced session must be the process's first, or the import
count would include the baseline run's). The number of calls follows the number of timed
samples, which varies from run to run: `--runs N` reports the smallest, median and largest,
and a line through the runs (calls against the kernel calls the timer made) splits them into
a fixed part and a part per kernel call; with 4 runs or more, a second fit reads the timed
and the checked calls apart (`fit_by_checks`). `--per-function N` adds the N most-called
functions of the span with their calls per run and their own line: which run once, which
run per timed call.

Usage (from any directory; the venv must have pytest and the package's dependencies):
    python bench/item_path.py [--repo PATH] [--item NODEID] [--runs N] [--json OUT]
        [--per-function N]

`--repo` points at another checkout (main, an older commit in a `git worktree`): its
`pytest_kernelpro` is the one imported, and its `example_repo/` the project traced. pytest
still finds the plugins through the entry points the venv has installed: where the
checkout's `pyproject.toml` declares others, install it first (`pip install -e PATH`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

GATE_PATH_PARTS = (".", "run", "problem", "measure", "gate")
# The span "from collection to its JSON record": the session's start and configure
# (option parsing, settings) are outside it; the JSON is written at the session's finish.
RECORD_SPAN = ("collection", "item", "session finish")
DEFAULT_ITEM = "test_kernels.py::bias_gelu[512x1024]"
ORCHESTRATOR_FANOUT = 3  # other package files one function must call to count as sequencing
PHASES = ("configure", "session start", "collection", "item", "session finish", "between")


def part_of(relative: Path) -> str:
    """The package part a module belongs to (`.` for the top-level modules)."""
    return relative.parts[0] if len(relative.parts) > 1 else "."


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def package_sizes(package: Path) -> dict[str, dict[str, int]]:
    """Modules and lines per part of the package, the gate path's sum and the total."""
    sizes: dict[str, dict[str, int]] = defaultdict(lambda: {"modules": 0, "lines": 0})
    for path in sorted(package.rglob("*.py")):
        part = part_of(path.relative_to(package))
        sizes[part]["modules"] += 1
        sizes[part]["lines"] += line_count(path)
    result = dict(sorted(sizes.items()))
    for name, parts in (("gate path", GATE_PATH_PARTS), ("total", tuple(result))):
        chosen = [result[p] for p in parts if p in result]
        result[name] = {
            "modules": sum(s["modules"] for s in chosen),
            "lines": sum(s["lines"] for s in chosen),
        }
    return result


class PathTracer:
    """A pytest plugin that counts the package's calls from configure to session finish."""

    def __init__(self, package_root: Path) -> None:
        self.root = str(package_root) + os.sep
        self.phase = "configure"
        self.calls: dict[str, Counter[str]] = {p: Counter() for p in PHASES}
        self.functions: dict[str, set[tuple[str, int]]] = {p: set() for p in PHASES}
        # Calls per function and phase ("file:line name"), kept for `--per-function`.
        self.function_calls: dict[str, Counter[str]] = {p: Counter() for p in PHASES}
        self.callees: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.item_names: list[str] = []

    def _relative(self, filename: str) -> str | None:
        return filename[len(self.root) :] if filename.startswith(self.root) else None

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or self.phase == "done":
            return
        code = frame.f_code
        callee = self._relative(code.co_filename)
        if callee is None:
            return
        self.calls[self.phase][callee] += 1
        self.functions[self.phase].add((callee, code.co_firstlineno))
        self.function_calls[self.phase][f"{callee}:{code.co_firstlineno} {code.co_qualname}"] += 1
        caller = frame.f_back  # the nearest package frame above: who called into this file
        while caller is not None and self._relative(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is not None:
            caller_file = self._relative(caller.f_code.co_filename)
            if caller_file is not None and caller_file != callee:
                self.callees[(caller_file, caller.f_code.co_name)].add(callee)

    def _start(self) -> None:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def _stop(self) -> None:
        self.phase = "done"
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def _in_phase(self, name: str) -> Any:
        self.phase = name
        try:
            result = yield
        finally:
            self.phase = "between"
        return result

    def summary(self) -> dict[str, Any]:
        per_phase: dict[str, Any] = {}
        all_calls: Counter[str] = Counter()
        all_functions: set[tuple[str, int]] = set()
        for phase in PHASES:
            all_calls.update(self.calls[phase])
            all_functions |= self.functions[phase]
            per_phase[phase] = {
                "calls": sum(self.calls[phase].values()),
                "functions": len(self.functions[phase]),
                "files": len(self.calls[phase]),
            }
        span: Counter[str] = Counter()
        for phase in RECORD_SPAN:
            span.update(self.calls[phase])
        fanout: dict[str, int] = defaultdict(int)
        for (caller_file, _function), files in self.callees.items():
            fanout[caller_file] = max(fanout[caller_file], len(files))
        return {
            "items": self.item_names,
            "calls": sum(all_calls.values()),
            "functions": len(all_functions),
            "files": len(all_calls),
            "per_phase": per_phase,
            "record_span": {"calls": sum(span.values()), "files": len(span)},
            "record_span_files": sorted(span),
            "calls_per_file": dict(all_calls.most_common()),
            "item_files": sorted(self.calls["item"]),
            "calls_per_function": {
                phase: dict(self.function_calls[phase].most_common())
                for phase in PHASES
                if self.function_calls[phase]
            },
            "orchestrator_files": {
                f: n for f, n in sorted(fanout.items()) if n >= ORCHESTRATOR_FANOUT
            },
        }


def make_hooks(tracer: PathTracer) -> object:
    """The tracer's hook implementations: outermost wrappers, so the phase covers every plugin."""
    import pytest

    class Hooks:
        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_cmdline_main(self, config: pytest.Config) -> Any:
            # Wraps the whole session; pytest_configure (historic) takes no wrapper.
            tracer._start()
            try:
                return (yield)
            finally:
                tracer._stop()

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_sessionstart(self, session: pytest.Session) -> Any:
            return (yield from tracer._in_phase("session start"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_collection(self, session: pytest.Session) -> Any:
            return (yield from tracer._in_phase("collection"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
            tracer.item_names.append(item.nodeid)
            return (yield from tracer._in_phase("item"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_sessionfinish(self, session: pytest.Session) -> Any:
            try:
                return (yield from tracer._in_phase("session finish"))
            finally:
                tracer._stop()  # the JSON and the table are out; unconfigure is not traced

    return Hooks()


def trace_one_session(repo: Path, item: str, baseline: str, scratch: str, out: Path) -> int:
    """In a fresh process: run the traced check session and write what it measured to `out`."""
    import importlib.util

    import pytest

    spec = importlib.util.find_spec("pytest_kernelpro")  # locates, does not import
    if spec is None or spec.origin is None:
        raise SystemExit(f"item_path: pytest_kernelpro is not importable from --repo {repo}")
    package = Path(spec.origin).resolve().parent
    if package.parent != repo:
        raise SystemExit(
            f"item_path: pytest_kernelpro imports from {package}, not from --repo {repo}; "
            "is another copy first on sys.path?"
        )
    if any(name.split(".")[0] == "pytest_kernelpro" for name in sys.modules):
        raise SystemExit("item_path: the package was imported before the traced session")
    tracer = PathTracer(package)
    args = [item, "-q", "-p", "no:cacheprovider", "--kernelpro-only", "--kernelpro-check"]
    args += [f"--kernelpro-baseline={baseline}", f"--kernelpro-json={scratch}/report.json"]
    args += [f"--kernelpro-history={scratch}/history"]
    rc = pytest.main(args, plugins=[make_hooks(tracer)])
    result = tracer.summary()
    imported = sorted(n for n in sys.modules if n.split(".")[0] == "pytest_kernelpro")
    files = {
        n: Path(f)
        for n in imported
        if (f := getattr(sys.modules[n], "__file__", None)) and Path(f).suffix == ".py"
    }
    result["pytest_exit"] = int(rc)
    report_path = Path(scratch, "report.json")
    result["json_written"] = report_path.is_file()
    if result["json_written"]:  # what the calls scale with: the samples, and a confirmation
        for record in json.loads(report_path.read_text(encoding="utf-8")).get("records", []):
            timing, gate = record.get("timing") or {}, record.get("gate") or {}
            honesty = timing.get("honesty") or {}
            result.setdefault("records", []).append(
                {
                    "name": record.get("name"),
                    "outcome": record.get("outcome"),
                    "samples": len(timing.get("samples_s") or []),
                    "warmup_runs": timing.get("warmup_runs"),
                    "checked_calls": honesty.get("checked_calls"),
                    "check_rate": honesty.get("check_rate"),
                    "gate_status": gate.get("status"),
                    "confirmed": gate.get("confirmed"),
                }
            )
    result["modules_imported"] = len(imported)
    result["imported_lines"] = sum(line_count(p) for p in files.values())
    result["imported_modules"] = {n: line_count(p) for n, p in files.items()}
    result["optimizer_modules_imported"] = [
        n for n in imported if n.startswith("pytest_kernelpro.optimize")
    ]
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    repo = args.repo.resolve()
    project = (args.project or repo / "example_repo").resolve()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    env["PYTHONPATH"] = env["PYTHONPATH"].rstrip(os.pathsep)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="item-path-") as scratch:
        baseline = f"{scratch}/baseline.yaml"
        save = [sys.executable, "-m", "pytest", args.item, "-q", "-p", "no:cacheprovider"]
        save += ["--kernelpro-only", f"--kernelpro-save-baseline={baseline}"]
        save += [f"--kernelpro-json={scratch}/save.json", f"--kernelpro-history={scratch}/history"]
        subprocess.run(save, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
        for index in range(args.runs):
            out = Path(scratch, f"trace{index}.json")
            child = [sys.executable, str(Path(__file__).resolve()), "--repo", str(repo)]
            child += ["--item", args.item, "--child-baseline", baseline, "--child-out", str(out)]
            child += ["--child-scratch", f"{scratch}/run{index}"]
            subprocess.run(child, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
            runs.append(json.loads(out.read_text(encoding="utf-8")))
    commit = (
        subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "not a git checkout"
    )

    def spread(key: str) -> dict[str, float]:
        values = [r[key] for r in runs]
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    def phase_spread(phase: str, key: str) -> dict[str, float]:
        values = [r["per_phase"][phase][key] for r in runs]
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    per_run = []
    for r in runs:
        record = (r.get("records") or [{}])[0]
        per_run.append(
            {
                "calls": r["calls"],
                "span_calls": r["record_span"]["calls"],
                "item_calls": r["per_phase"]["item"]["calls"],
                "files": r["files"],
                "item_files": r["per_phase"]["item"]["files"],
                "kernel_calls": (record.get("samples") or 0) + (record.get("warmup_runs") or 0),
                "checked_calls": record.get("checked_calls"),
                "check_rate": record.get("check_rate"),
                "gate_status": record.get("gate_status"),
                "confirmed": record.get("confirmed"),
            }
        )
    # The calls grow with the kernel calls the timer makes (samples and warm-up), which vary
    # from run to run: a line through the runs splits them into a fixed part and a part per
    # kernel call, which compare between trees where the raw counts do not.
    fit = None
    xs = [p["kernel_calls"] for p in per_run]
    if len(set(xs)) > 1:
        slope, intercept = statistics.linear_regression(xs, [p["calls"] for p in per_run])
        misses = [p["calls"] - (intercept + slope * p["kernel_calls"]) for p in per_run]
        fit = {
            "fixed_calls": round(intercept),
            "calls_per_kernel_call": round(slope, 1),
            "largest_miss": round(max(misses, key=abs)),  # how well the line holds
        }
    sizes = package_sizes(repo / "pytest_kernelpro")
    result: dict[str, Any] = {
        "span_fit_by_checks": fit_by_checks(per_run, "span_calls"),
        "calls_fit_by_checks": fit_by_checks(per_run, "calls"),
        "repo": str(repo),
        "commit": commit,
        "item": args.item,
        "runs": len(runs),
        "gate_path_lines": sizes["gate path"]["lines"],
        "modules_imported": spread("modules_imported"),
        "imported_lines": spread("imported_lines"),
        "calls": spread("calls"),
        "files": spread("files"),
        "functions": spread("functions"),
        "collection to JSON record": {
            key: {
                "min": min(r["record_span"][key] for r in runs),
                "median": statistics.median(r["record_span"][key] for r in runs),
                "max": max(r["record_span"][key] for r in runs),
            }
            for key in ("calls", "files")
        },
        "per_phase": {
            phase: {k: phase_spread(phase, k) for k in ("calls", "functions", "files")}
            for phase in PHASES
        },
        "calls_fit": fit,
        "per_run": per_run,
        "pytest_exit": [r["pytest_exit"] for r in runs],
        "json_written": [r["json_written"] for r in runs],
        "package": sizes,
        "last_run": runs[-1],
    }
    if args.per_function:
        result["per_function"] = per_function(runs, xs, args.per_function)
    return result


def fit_by_checks(per_run: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """`key`'s calls as fixed + a per timed call + b per checked call (least squares): which
    calls are checked is drawn at random, so at a few dozen kernel calls the line against the
    kernel calls alone carries the draw's noise (a checked call costs more frames); with the
    checked calls as their own term the parts are read apart, and "per kernel call" is
    a + b times the check rate. None with fewer than 4 runs, or runs that cannot separate
    the terms."""
    import numpy as np

    rows = [p for p in per_run if p.get("checked_calls") is not None]
    if len(rows) < 4:
        return None
    design = np.array([[1.0, p["kernel_calls"], p["checked_calls"]] for p in rows])
    calls = np.array([float(p[key]) for p in rows])
    if np.linalg.matrix_rank(design) < 3:
        return None
    (fixed, per_timed, per_checked), *_ = np.linalg.lstsq(design, calls, rcond=None)
    rate = statistics.median(float(p["check_rate"]) for p in rows)
    misses = calls - design @ np.array([fixed, per_timed, per_checked])
    return {
        "fixed_calls": round(float(fixed)),
        "per_timed_call": round(float(per_timed), 2),
        "per_checked_call": round(float(per_checked), 2),
        "check_rate": rate,
        "per_kernel_call_at_the_rate": round(float(per_timed + rate * per_checked), 2),
        "largest_miss": round(float(max(misses, key=abs))),
    }


def per_function(runs: list[dict[str, Any]], kernel_calls: list[int], top: int) -> list[Any]:
    """The `top` functions by calls in the span, each with its calls per run and, where the
    runs' kernel calls differ, its own line (fixed + per kernel call): which run once and
    which run per timed call."""
    names: Counter[str] = Counter()
    per_run: list[Counter[str]] = []
    for r in runs:
        counts: Counter[str] = Counter()
        for phase in RECORD_SPAN:
            counts.update(r["calls_per_function"].get(phase, {}))
        per_run.append(counts)
        names.update(counts)
    rows = []
    for name, _total in names.most_common(top):
        calls = [c[name] for c in per_run]
        row: dict[str, Any] = {"function": name, "calls": calls}
        if len(set(kernel_calls)) > 1:
            slope, intercept = statistics.linear_regression(kernel_calls, calls)
            row["fixed"], row["per_kernel_call"] = round(intercept, 1), round(slope, 2)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--project", type=Path, help="default: REPO/example_repo")
    parser.add_argument("--item", default=DEFAULT_ITEM, help="node id, relative to the project")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument(
        "--per-function",
        type=int,
        default=0,
        metavar="N",
        help="also report the N most-called functions of the span, per run and fitted",
    )
    parser.add_argument("--child-baseline", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_out is not None:
        return trace_one_session(
            args.repo.resolve(), args.item, args.child_baseline, args.child_scratch, args.child_out
        )
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: give 1 or more")
    result = run(args)
    text = json.dumps(result, indent=1)
    headline = {k: result[k] for k in ("commit", "gate_path_lines", "modules_imported")}
    headline |= {k: result[k] for k in ("imported_lines", "calls", "files", "pytest_exit")}
    headline["calls_fit"] = result["calls_fit"]
    headline["span_fit_by_checks"] = result["span_fit_by_checks"]
    headline["item phase alone"] = result["per_phase"]["item"]
    headline["collection to JSON record"] = result["collection to JSON record"]
    print(json.dumps(headline, indent=1))
    for row in result.get("per_function", []):
        print(json.dumps(row))
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
