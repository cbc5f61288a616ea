"""KernelBench levels 1-3 in one pytest session, with the plugin's default settings.

The KernelBench problem files are used as published (never committed here): fetch the
repository, pin its commit, and stage `KernelBench/level1..3` under an ignored folder, e.g.
`.kb/KernelBench/` (`.kb/COMMIT` holds the commit). The sweep runs pytest in this process on
the staged folder (`--kernelpro-problems`), level 1 first in file order, then levels 2 and 3
interleaved, and records one line per finished problem in a state JSONL (fsync'd as each
record finishes, through the plugin's `pytest_kernelpro_record` hook). A later call with the
same `--state` skips the problems already there, so a sweep that does not fit one device call
goes on in the next one. `--deadline-s` stops starting new problems after that many seconds.

Per problem: outcome (and the failure message), wall time of the item, time spent in the
timing loop, the item's peak GPU memory against the problem's footprint (inputs, parameters,
the reference's own peak), FLOPs, minimal bytes, bound, the peak used and % of roofline.
Totals: outcomes, plugin time (the pytest session's wall time, collection included), the
overhead per item (wall - timing) at the median and 95th percentile, per level.

Run (H200):  python bench/kernelbench_sweep.py --problems .kb/KernelBench --out $OUT \
                 --state .devstage/i10-scale/sweep.jsonl --deadline-s 300
CPU dry run: python bench/kernelbench_sweep.py --problems DIR --device cpu --out /tmp/sweep
Writes sweep.jsonl (the state, all calls) and sweep.md (the tables) under --out.

`--shrink MIB` (for a CPU): the problems are first copied into OUT/problems/ with their
module-level integer size constants (batch_size, dim, N, M, K, channels, height, width, ...)
halved, largest first, until one call's inputs + output are at most MIB MiB; operator geometry
(kernel_size, stride, padding, dilation, groups, heads, scale factors) is never changed and each
shrunk form is built and run once on PyTorch's meta device (bench/kernelbench_shrink.py says
how). A problem whose shrunk form does not build is listed as "not shrinkable" with the error
and is not run. The sweep then runs on the copies as it does on the originals. Numbers from a
shrunk sweep are not KernelBench's sizes: they check the gate on the same operators, not the
published problems' times. OUT/problems/SHRINK.md lists every change.
  python bench/kernelbench_sweep.py --problems .kb/KernelBench --device cpu --shrink 8 \
      --levels 1 --out /tmp/sweep --deadline-s 1800
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

LEVEL_RE = re.compile(r"level(\d+)")
PHASES = ("setup", "check", "timing", "recheck", "roofline", "profile", "gate")
NUMBER_RE = re.compile(r"^(\d+)_")


def level_of(nodeid: str) -> int:
    found = LEVEL_RE.search(nodeid)
    return int(found.group(1)) if found else 0


def number_of(nodeid: str) -> int:
    name = nodeid.replace("\\", "/").split("/")[-1]
    found = NUMBER_RE.match(name)
    return int(found.group(1)) if found else 10**6


def sweep_order(nodeids: list[str], levels: list[int] | None = None) -> list[str]:
    """Level 1 in file-number order, then levels 2 and 3 interleaved (2, 3, 2, 3, ...);
    with `levels`, only those levels, one after the other in that order."""
    by_level: dict[int, list[str]] = {}
    for n in sorted(nodeids, key=lambda n: (level_of(n), number_of(n), n)):
        by_level.setdefault(level_of(n), []).append(n)
    if levels:
        return [n for level in levels for n in by_level.get(level, [])]
    order = list(by_level.pop(1, []))
    rest = [by_level[k] for k in sorted(by_level)]
    while any(rest):
        for queue in rest:
            if queue:
                order.append(queue.pop(0))
    return order


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def summarize_record(record: Any, call: int) -> dict[str, Any]:
    """One state line from a finished KernelRecord."""
    timing = msgspec.to_builtins(record.timing) if record.timing else {}
    roofline = msgspec.to_builtins(record.roofline) if record.roofline else {}
    memory = record.extra.get("memory") or {}
    timing_wall = _float(timing.get("wall_s"))
    correctness = msgspec.to_builtins(record.correctness) if record.correctness else {}
    truth = correctness.get("truth") or {}
    kernelbench = correctness.get("kernelbench") or {}
    return {
        "kind": "problem",
        "call": call,
        "nodeid": record.nodeid,
        "level": level_of(record.nodeid),
        "problem": record.name,
        "outcome": record.outcome,
        "message": (record.message or "")[:600] or None,
        "wall_s": round(record.wall_s, 3),
        "timing_wall_s": None if timing_wall is None else round(timing_wall, 3),
        "overhead_s": None if timing_wall is None else round(record.wall_s - timing_wall, 3),
        "median_s": record.median_s,
        "samples": len(timing.get("samples_s") or []),
        "stop_reason": timing.get("stop_reason"),
        # Fresh inputs, checked outputs and checked calls, with their host seconds
        # (measure/timing/fresh_inputs.py, streams.py): the honesty checks' cost per problem.
        "honesty": timing.get("honesty"),
        "peak_bytes": memory.get("peak_bytes"),
        "footprint_bytes": memory.get("footprint_bytes"),
        "peak_over_footprint": memory.get("peak_over_footprint"),
        "peak_bytes_by_phase": memory.get("peak_bytes_by_phase"),
        "reference_peak_bytes": memory.get("reference_peak_bytes"),
        "inputs_bytes": memory.get("inputs_bytes"),
        "left_allocated_bytes": memory.get("left_allocated_bytes"),
        "flops": roofline.get("flops"),
        "min_bytes": roofline.get("min_bytes"),
        "bound": roofline.get("bound"),
        "peak_name": roofline.get("peak_name"),
        "efficiency": record.efficiency,
        "device": record.device,
        # The correctness rule (measure/output_rule.py): which rule decided, the factor, the
        # kernel's and the reference's normwise errors against the truth, the truth's cost.
        "rule": correctness.get("rule"),
        "factor": correctness.get("factor"),
        "kernel_error": correctness.get("kernel_error"),
        "reference_error": correctness.get("reference_error"),
        "truth_precision": truth.get("precision"),
        "truth_s": truth.get("seconds"),
        "truth_peak_bytes": truth.get("peak_bytes"),
        "truth_skipped": truth.get("skipped"),
        "kernelbench_passed": kernelbench.get("passed"),
    }


def append_line(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(data, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_state(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line from a killed call
    return rows


class SweepPlugin:
    """Orders and filters the items, writes each record, stops at the deadline."""

    def __init__(
        self,
        state: Path,
        done: set[str],
        deadline: float,
        limit: int,
        call: int,
        levels: list[int] | None = None,
        select: str | None = None,
    ):
        self.levels = levels
        self.select = select
        self.state = state
        self.done = done
        self.deadline = deadline
        self.limit = limit
        self.call = call
        self.ran = 0
        self.stopped = False

    def pytest_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        by_id = {i.nodeid: i for i in items}
        order = [n for n in sweep_order(list(by_id), self.levels) if n not in self.done]
        if self.select:
            order = [n for n in order if re.search(self.select, n)]
        if self.limit:
            order = order[: self.limit]
        keep = set(order)
        dropped = [i for i in items if i.nodeid not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = [by_id[n] for n in order]

    def pytest_kernelpro_record(self, record: Any) -> None:
        row = summarize_record(record, self.call)
        append_line(self.state, row)
        self.ran += 1
        mem = ""
        if row["peak_over_footprint"] is not None:
            mem = f" peak {row['peak_bytes'] / 2**30:.2f} GiB = {row['peak_over_footprint']:.2f}x"
        print(
            f"[sweep] {row['problem']}: {row['outcome']} wall {row['wall_s']:.2f}s "
            f"timing {row['timing_wall_s']}s{mem}",
            flush=True,
        )

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        if time.monotonic() >= self.deadline and not self.stopped:
            self.stopped = True
            self._session.shouldstop = f"sweep deadline reached after {self.ran} problems"

    def pytest_sessionstart(self, session: Any) -> None:
        self._session = session


def plugin_autoloaded() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "pytest_kernelpro.plugin" for ep in entry_points(group="pytest11"))


def run_call(args: argparse.Namespace, state: Path, call: int) -> dict[str, Any]:
    import pytest

    problems = Path(args.problems).resolve()
    rows = read_state(state)
    done = {r["nodeid"] for r in rows if r.get("kind") == "problem"}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kp-sweep-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")  # the plugin's defaults, nothing else
        argv = [
            str(problems),
            f"--kernelpro-problems={problems}",
            f"--kernelpro-json={Path(tmp) / 'report.json'}",
            "-c",
            str(ini),
            "--rootdir",
            str(problems.parent),
            "-p",
            "no:cacheprovider",
            "-q",
            "--no-header",
        ]
        if args.device != "auto":
            argv.append(f"--kernelpro-device={args.device}")
        if args.ceilings:
            argv.append(f"--kernelpro-ceilings={Path(args.ceilings).resolve()}")
        if not plugin_autoloaded():
            argv[0:0] = ["-p", "pytest_kernelpro.plugin"]
        levels = [int(x) for x in args.levels.split(",")] if args.levels else None
        plugin = SweepPlugin(
            state, done, started + args.deadline_s, args.limit, call, levels, args.select
        )
        exit_code = pytest.main(argv, plugins=[plugin])
    wall = time.monotonic() - started
    session = {
        "kind": "session",
        "call": call,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall, 1),
        "problems_run": plugin.ran,
        "skipped_as_done": len(done),
        "stopped_by_deadline": plugin.stopped,
        "exit_code": int(exit_code),
        "argv": argv,
        "machine": platform.node(),
        "python": platform.python_version(),
    }
    try:
        import torch

        session["torch"] = torch.__version__
        if torch.cuda.is_available():
            session["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    append_line(state, session)
    return session


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def _gib(value: Any) -> str:
    v = _float(value)
    return "–" if v is None else f"{v / 2**30:.2f}"


def render(rows: list[dict[str, Any]], commit: str | None) -> str:
    problems = [r for r in rows if r.get("kind") == "problem"]
    sessions = [r for r in rows if r.get("kind") == "session"]
    lines = ["# KernelBench sweep", ""]
    if commit:
        lines.append(f"- KernelBench commit: {commit}")
    for s in sessions:
        lines.append(
            f"- call {s['call']}: {s['date']}, {s.get('gpu') or 'no GPU'}, torch {s.get('torch')}, "
            f"{s['problems_run']} problems in {s['wall_s']} s of pytest session (plugin time, "
            f"collection included); stopped by the deadline: {s['stopped_by_deadline']}; "
            f"exit code {s['exit_code']}"
        )
    lines.append("")
    lines.append(
        "| level | problems | passed | failed | skipped | plugin wall s | overhead median s | overhead p95 s | max peak/footprint |"
    )
    lines.append("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for level in sorted({r["level"] for r in problems}):
        sub = [r for r in problems if r["level"] == level]
        over = [r["overhead_s"] for r in sub if r.get("overhead_s") is not None]
        ratios = [
            r["peak_over_footprint"]
            for r in sub
            if r.get("peak_over_footprint") is not None and (r.get("footprint_bytes") or 0) >= 2**26
        ]
        count = {
            k: sum(1 for r in sub if r["outcome"] == k) for k in ("passed", "failed", "skipped")
        }
        med = statistics.median(over) if over else None
        p95 = _pct(over, 0.95)
        lines.append(
            f"| {level} | {len(sub)} | {count['passed']} | {count['failed']} | {count['skipped']} | "
            f"{sum(r['wall_s'] for r in sub):.1f} | "
            f"{'–' if med is None else f'{med:.2f}'} | {'–' if p95 is None else f'{p95:.2f}'} | "
            f"{'–' if not ratios else f'{max(ratios):.2f}'} |"
        )
    lines += [
        "",
        "Overhead = item wall time minus the time spent in the timing loop. Peak/footprint over "
        "problems with a footprint of at least 64 MiB (below that, fixed buffers such as cuBLAS "
        "workspaces dominate).",
        "",
        "| level | problem | outcome | wall s | timing s | overhead s | peak GiB | footprint GiB | peak/fp | FLOPs | bytes | bound | % roofline | peak used |",
        "|--:|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|:--|--:|:--|",
    ]
    for r in sorted(problems, key=lambda r: (r["level"], number_of(r["nodeid"]))):
        eff = _float(r.get("efficiency"))
        ratio = _float(r.get("peak_over_footprint"))
        flops, nbytes = _float(r.get("flops")), _float(r.get("min_bytes"))
        peak = (r.get("peak_name") or "–").replace("|", "/")
        lines.append(
            f"| {r['level']} | {r['problem']} | {r['outcome']} | {r['wall_s']:.2f} | "
            f"{r.get('timing_wall_s') if r.get('timing_wall_s') is not None else '–'} | "
            f"{r.get('overhead_s') if r.get('overhead_s') is not None else '–'} | "
            f"{_gib(r.get('peak_bytes'))} | {_gib(r.get('footprint_bytes'))} | "
            f"{'–' if ratio is None else f'{ratio:.2f}'} | "
            f"{'–' if flops is None else f'{flops:.3g}'} | {'–' if nbytes is None else f'{nbytes:.3g}'} | "
            f"{r.get('bound') or '–'} | {'–' if eff is None else f'{eff * 100:.1f}'} | {peak[:70]} |"
        )
    over = [
        r
        for r in problems
        if (_float(r.get("peak_over_footprint")) or 0) > 3.0
        and (r.get("footprint_bytes") or 0) >= 2**26
    ]
    if over:
        lines += [
            "",
            "## Above 3x the footprint: the peak per phase (GiB above the item's start)",
            "",
            "| level | problem | peak/fp | inputs | reference peak | " + " | ".join(PHASES) + " |",
            "|--:|:--|--:|--:|--:|" + "--:|" * len(PHASES),
        ]
        for r in sorted(over, key=lambda r: (r["level"], number_of(r["nodeid"]))):
            phases = r.get("peak_bytes_by_phase") or {}
            lines.append(
                f"| {r['level']} | {r['problem']} | {r['peak_over_footprint']:.2f} | "
                f"{_gib(r.get('inputs_bytes'))} | {_gib(r.get('reference_peak_bytes'))} | "
                + " | ".join(_gib(phases.get(p)) for p in PHASES)
                + " |"
            )
    lines += _correctness_section(problems)
    failed = [r for r in problems if r["outcome"] != "passed"]
    if failed:
        lines += ["", "## Not passed", ""]
        for r in failed:
            text = (r.get("message") or "").replace("\n", " ")[:400]
            lines.append(f"- level {r['level']} {r['problem']} ({r['outcome']}): {text}")
    return "\n".join(lines) + "\n"


def _rule_kind(rule: str | None) -> str:
    if rule is None:
        return "not recorded"
    if rule.startswith("dtype default"):
        return "dtype default (no truth)"
    if rule.startswith("marker"):
        return "marker"
    return "reference error (truth)"


def _correctness_section(problems: list[dict[str, Any]]) -> list[str]:
    """Which rule decided, the truth's cost, and every problem without a truth (why)."""
    if not any("rule" in r for r in problems):
        return []
    kinds: dict[str, int] = {}
    for r in problems:
        kinds[_rule_kind(r.get("rule"))] = kinds.get(_rule_kind(r.get("rule")), 0) + 1
    truth_s = [v for r in problems if (v := _float(r.get("truth_s"))) is not None]
    peaks = [v for r in problems if (v := _float(r.get("truth_peak_bytes"))) is not None]
    kb_fail = [r for r in problems if r.get("kernelbench_passed") is False]
    lines = [
        "",
        "## Correctness rule",
        "",
        "- decided by: " + ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())),
        f"- the truth's re-run: {len(truth_s)} problems, {sum(truth_s):.2f} s in all, max "
        f"{max(truth_s, default=0.0):.3f} s; peak memory max {_gib(max(peaks, default=0.0))} GiB",
        f"- KernelBench's own check (allclose 1e-2) failed: {len(kb_fail)}",
        "",
        "| level | problem | rule | kernel error | reference error | truth s | truth peak GiB | KernelBench |",
        "|--:|:--|:--|--:|--:|--:|--:|:--|",
    ]
    for r in sorted(problems, key=lambda r: (r["level"], number_of(r["nodeid"]))):
        ke, re_ = _float(r.get("kernel_error")), _float(r.get("reference_error"))
        ts = _float(r.get("truth_s"))
        kb = r.get("kernelbench_passed")
        lines.append(
            f"| {r['level']} | {r['problem']} | {_rule_kind(r.get('rule'))} | "
            f"{'–' if ke is None else f'{ke:.3g}'} | {'–' if re_ is None else f'{re_:.3g}'} | "
            f"{'–' if ts is None else f'{ts:.4f}'} | {_gib(r.get('truth_peak_bytes'))} | "
            f"{'–' if kb is None else 'pass' if kb else 'FAIL'} |"
        )
    skipped = [r for r in problems if r.get("truth_skipped")]
    if skipped:
        lines += ["", "### No truth: the dtype rule decided", ""]
        for r in skipped:
            lines.append(f"- level {r['level']} {r['problem']}: {r['truth_skipped']}")
    return lines


def shrink_problems(source: Path, dest: Path, args: argparse.Namespace) -> list[str]:
    """Copy the chosen levels' problems into `dest`, shrunk to `args.shrink` MiB per call; the
    ones that do not shrink are listed in dest/SHRINK.md and left out. Returns their lines."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernelbench_shrink import MIB, NotShrinkable, shrink

    levels = [int(x) for x in args.levels.split(",")] if args.levels else [1, 2, 3]
    rows = [
        f"# Shrunk KernelBench problems: at most {args.shrink:g} MiB of inputs + output per call",
        "",
        "Numbers from these copies are not KernelBench's sizes.",
        "",
        "| level | problem | MiB before | MiB after | changes |",
        "|--:|:--|--:|--:|:--|",
    ]
    refused: list[str] = []
    for level in levels:
        (dest / f"level{level}").mkdir(parents=True, exist_ok=True)
        files = sorted((source / f"level{level}").glob("*.py"), key=lambda p: number_of(p.name))
        for path in files:
            if args.select and not re.search(args.select, f"level{level}/{path.name}"):
                continue
            try:
                result = shrink(path.read_text(encoding="utf-8"), args.shrink)
            except NotShrinkable as error:
                refused.append(f"- level {level} {path.stem}: not shrinkable: {error}"[:700])
                continue
            (dest / f"level{level}" / path.name).write_text(result.text, encoding="utf-8")
            changes = ", ".join(f"{k} {a}->{b}" for k, (a, b) in result.changes.items())
            note = "" if result.how == "meta" else f" ({result.how})"
            rows.append(
                f"| {level} | {path.stem} | {result.original_bytes / MIB:.1f} | "
                f"{result.shrunk_bytes / MIB:.2f}{note} | {changes or 'none'} |"
            )
    rows += ["", f"## Not shrinkable ({len(refused)})", "", *refused]
    (dest / "SHRINK.md").write_text("\n".join(rows) + "\n", encoding="utf-8")
    print(f"[sweep] shrunk into {dest}; not shrinkable: {len(refused)}", flush=True)
    return refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", required=True, help="folder with level1/ level2/ level3/")
    parser.add_argument("--out", required=True, help="where sweep.jsonl and sweep.md go")
    parser.add_argument("--state", help="state JSONL to resume from (default: OUT/sweep.jsonl)")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="start no problem after")
    parser.add_argument("--limit", type=int, default=0, help="at most this many problems (0: all)")
    parser.add_argument(
        "--levels", help="only these levels, in this order, e.g. 3,1 (default: 1, then 2/3 mixed)"
    )
    parser.add_argument("--select", help="only node ids matching this regular expression")
    parser.add_argument("--device", default="auto", help="--kernelpro-device (auto: plugin's)")
    parser.add_argument("--ceilings", help="ceilings JSON measured on this device kind")
    parser.add_argument("--commit", help="the KernelBench commit (default: PROBLEMS/../COMMIT)")
    parser.add_argument(
        "--shrink",
        type=float,
        metavar="MIB",
        help="copy the problems into OUT/problems/ shrunk to MIB MiB of inputs + output per call",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = args.commit
    commit_file = Path(args.problems).resolve().parent / "COMMIT"
    if commit is None and commit_file.exists():
        commit = commit_file.read_text(encoding="utf-8").strip()
    refused: list[str] = []
    if args.shrink:
        refused = shrink_problems(Path(args.problems), out / "problems", args)
        args.problems = str(out / "problems")
    state_out = out / "sweep.jsonl"
    if (
        args.state
        and Path(args.state).exists()
        and Path(args.state).resolve() != state_out.resolve()
    ):
        state_out.write_text(Path(args.state).read_text(encoding="utf-8"), encoding="utf-8")
    calls = [r for r in read_state(state_out) if r.get("kind") == "session"]
    session = run_call(args, state_out, call=len(calls) + 1)
    print(f"[sweep] call done: {json.dumps(session, default=str)}", flush=True)
    text = render(read_state(state_out), commit)
    if args.shrink:
        text += f"\n## Shrunk to {args.shrink:g} MiB per call: not shrinkable ({len(refused)})\n\n"
        text += "".join(f"{line}\n" for line in refused)
    (out / "sweep.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
