"""Which micro-profiling tools fire, with what severity, on captured kernels; and how that
compares with Nsight Compute's own rule messages.

Usage:
    python bench/tools_table.py [CAPTURE ...] [--out FILE] [--date YYYY-MM-DD]

A CAPTURE is a folder with `ncu_raw.csv` (`ncu --csv --page raw --print-units base`) and
optionally `sass.txt`, `ptxas.txt` (or `run.log`), `symbols.txt`, `ncu_full_details.txt`
(`ncu --page details --print-details all`) and `kernels.yaml` (roofline facts and
expectations; see tests/data/tools/h200-probe/kernels.yaml), or the path of a raw CSV inside
such a folder. Default: the H200 probe capture in tests/data/tools/h200-probe. Runs on the
CPU: it only reads files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kernelpro.fileio import atomic_write_text
from pytest_kernelpro.tools import ToolRegistry, ToolRun, classify, run_tools
from pytest_kernelpro.tools.contract import SEVERITIES, ToolContext, severity_rank
from pytest_kernelpro.tools.signals import saturation
from pytest_kernelpro.tools.stage1 import Stage1

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "tools"))  # the capture-folder loader the tests share
from capture_folder import (  # noqa: E402
    NcuRuleMessage,
    OfflineKernel,
    load_capture_dir,
    parse_ncu_rule_messages,
    theoretical_class,
)

DEFAULT_CAPTURE = REPO / "tests" / "data" / "tools" / "h200-probe"
NEAR_ROOFLINE_PCT = 80.0
ABBREV = {"critical": "**C**", "high": "**H**", "medium": "M", "low": "L"}

# Nsight Compute rule -> the tools of ours that address the same problem.
RULE_TO_TOOLS: dict[str, tuple[str, ...]] = {
    "SOLBottleneck (small grid)": ("small_grid",),
    "LaunchConfiguration (small grid)": ("small_grid",),
    "LaunchConfiguration (tail effect)": ("tail_effect",),
    "LaunchConfiguration": ("launch_config",),
    "UncoalescedGlobalAccess": ("global_coalescing",),
    "MemoryCacheAccessPattern (global)": ("global_coalescing",),
    "MemoryCacheAccessPattern (local)": ("register_spills",),
    "CPIStall": ("warp_stalls", "barrier_stalls"),
    "IssueSlotUtilization": ("warp_stalls", "occupancy", "small_grid"),
    "AchievedOccupancy": ("occupancy", "small_grid"),
    "TheoreticalOccupancy": ("occupancy",),
    "HighPipeUtilization": ("pipe_utilization", "small_grid"),
    "SlowPipeLimiter": ("fp64_usage", "pipe_utilization"),
    "FPInstructions": ("fma_fusion",),
    "SharedMemoryConflicts": ("shared_bank_conflicts",),
    "UncoalescedSharedAccess": ("shared_bank_conflicts",),
    "SOLFPRoofline": ("fp64_usage",),
    "SOLBottleneck (memory/compute)": ("instruction_overhead", "dram_saturation", "l2_locality"),
    "SOLBottleneck (high throughput)": ("dram_saturation", "pipe_utilization"),
    "SOLBottleneck (latency)": ("occupancy", "warp_stalls"),
    "MemoryL2Compression": (),
    "WorkloadImbalance": ("small_grid", "tail_effect"),
    "PCSamplingData": (),
}


@dataclass
class Row:
    capture: str
    kernel: OfflineKernel
    stage1: Stage1
    how: str
    run: ToolRun
    sat: tuple[str, float, str] | None
    checks: list[tuple[str, bool]] = field(default_factory=list)
    extra_both: list[str] = field(default_factory=list)  # findings added by affinity_mode="both"

    @property
    def label(self) -> str:
        return str(self.kernel.meta.get("label") or self.kernel.base_name)

    def severity(self, tool: str) -> str | None:
        found = [f.severity for f in self.run.findings if f.tool == tool]
        return min(found, key=severity_rank) if found else None

    def cell(self, tool: str) -> str:
        sev = self.severity(tool)
        if sev:
            return ABBREV[sev]
        for s in self.run.skipped:
            if s.tool == tool:
                return "a" if s.reason == "affinity" else "e" if s.reason == "error" else "-"
        return "."


def analyze_capture(folder: Path, csv_name: str) -> list[Row]:
    rows: list[Row] = []
    for k in load_capture_dir(folder, csv_name):
        kernel = k.report.kernels[0]
        metrics = kernel.metrics
        device = None if metrics is None else metrics.text("device__attribute_display_name")
        theo, how = theoretical_class(k.meta, device)
        s1 = classify(theo, metrics)
        run = run_tools(
            k.report,
            s1,
            op_category=k.meta.get("op"),
            min_bytes=k.meta.get("min_bytes"),
            flops=k.meta.get("flops"),
            dtype=k.meta.get("dtype"),
            near_roofline_pct=NEAR_ROOFLINE_PCT,
        )
        sat = saturation(ToolContext(kernel=kernel))
        row = Row(folder.name, k, s1, how, run, sat)
        if s1.measured is not None and s1.measured != s1.cls:
            both = run_tools(
                k.report,
                s1,
                op_category=k.meta.get("op"),
                min_bytes=k.meta.get("min_bytes"),
                flops=k.meta.get("flops"),
                dtype=k.meta.get("dtype"),
                near_roofline_pct=NEAR_ROOFLINE_PCT,
                affinity_mode="both",
            )
            have = {f.tool for f in run.findings}
            row.extra_both = [
                f"{f.severity}: `{f.tool}` - {_short(f.title, 80)}"
                for f in both.sorted_findings()
                if f.tool not in have
            ]
        worst = run.worst()
        for tool, least in (k.meta.get("expect") or {}).items():
            got = row.severity(tool)
            ok = got is not None and severity_rank(got) <= severity_rank(least)
            row.checks.append((f"`{tool}` fires at >= {least} (got {got or 'nothing'})", ok))
        limit = k.meta.get("max_severity")
        if limit is None and sat is not None and sat[1] >= NEAR_ROOFLINE_PCT:
            limit = "medium"  # near a hardware roof: nothing high or critical
        if limit is not None:
            ok = worst is None or severity_rank(worst) >= severity_rank(limit)
            why = (
                f"{sat[0]} at {sat[1]:.1f}%"
                if sat and sat[1] >= NEAR_ROOFLINE_PCT
                else "kernels.yaml"
            )
            row.checks.append((f"nothing above {limit} ({why}; worst: {worst or 'none'})", ok))
        rows.append(row)
    return rows


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _kernel_table(rows: list[Row]) -> list[str]:
    out = [
        "| # | kernel | SASS | Stage 1: class (theoretical / measured, confidence) | SM % | memory % | most saturated roof | findings |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        counts = r.run.counts()
        found = ", ".join(f"{counts[s]} {s}" for s in SEVERITIES if counts[s]) or "none"
        sat = f"{r.sat[0]} {r.sat[1]:.1f}%" if r.sat else "n/a"
        sm = "n/a" if r.stage1.sm_pct is None else f"{r.stage1.sm_pct:.1f}"
        mem = "n/a" if r.stage1.memory_pct is None else f"{r.stage1.memory_pct:.1f}"
        sass = "yes" if r.kernel.report.kernels[0].sass is not None else "no"
        out.append(
            f"| K{i} | `{_short(r.label, 48)}` | {sass} | {r.stage1.cls} ({r.stage1.theoretical or 'n/a'} / "
            f"{r.stage1.measured or 'n/a'}, {r.stage1.confidence}) | {sm} | {mem} | {sat} | {found} |"
        )
    return out


def _matrix(rows: list[Row], tools: list[str]) -> list[str]:
    head = "| tool | " + " | ".join(f"K{i}" for i in range(1, len(rows) + 1)) + " |"
    out = [head, "|---|" + "---|" * len(rows)]
    for tool in tools:
        out.append(f"| `{tool}` | " + " | ".join(r.cell(tool) for r in rows) + " |")
    return out


def _comparison(rows: list[Row], messages: list[NcuRuleMessage]) -> tuple[list[str], Counter[str]]:
    from pytest_kernelpro.profile.symbols import kernel_base_name

    totals: Counter[str] = Counter()
    out: list[str] = []
    by_base = {r.kernel.base_name: r for r in rows}
    for base in dict.fromkeys(kernel_base_name(m.kernel) for m in messages):
        row = by_base.get(base)
        if row is None:
            continue
        mine = {f.tool: f for f in row.run.findings}
        skipped = {s.tool: s for s in row.run.skipped}
        out += [
            f"### `{row.label}`",
            "",
            "| Nsight Compute rule (est. speedup) | its message | ours | verdict |",
            "|---|---|---|---|",
        ]
        covered: set[str] = set()
        for m in (m for m in messages if kernel_base_name(m.kernel) == base):
            tools = RULE_TO_TOOLS.get(m.rule, ())
            covered.update(tools)
            fired = [mine[t] for t in tools if t in mine]
            speed = "" if m.speedup_pct is None else f" ({m.speedup_pct:g}%)"
            if m.kind == "INF":
                verdict = "info only"
            elif fired:
                verdict = "agree"
            elif not tools:
                verdict = "ncu only: no counterpart tool"
            else:
                why = []
                for t in tools:
                    s = skipped.get(t)
                    why.append(f"`{t}` {'skipped: ' + s.reason if s else 'below threshold'}")
                verdict = "ncu only (" + "; ".join(why) + ")"
            totals[verdict.split(" (")[0].split(":")[0]] += 1
            ours = (
                "; ".join(
                    f"{f.severity}: {_short(f.title, 70)} → {_short(f.recommendations[0].action, 90)} ({f.recommendations[0].expected})"
                    if f.recommendations
                    else f"{f.severity}: {_short(f.title, 70)}"
                    for f in fired
                )
                or "-"
            )
            out.append(
                f"| {m.kind} {m.rule}{speed} | {_short(m.message, 150)} | {ours} | {verdict} |"
            )
        for tool, f in mine.items():
            if tool not in covered:
                totals["ours only"] += 1
                rec = (
                    f"→ {_short(f.recommendations[0].action, 90)} ({f.recommendations[0].expected})"
                    if f.recommendations
                    else ""
                )
                out.append(f"| - | - | {f.severity}: {_short(f.title, 70)} {rec} | ours only |")
        out.append("")
    return out, totals


def render(
    rows: list[Row], messages: list[NcuRuleMessage], sources: list[Path], date: str, command: str
) -> str:
    tools = ToolRegistry.names()
    lines = [
        "# Micro-profiling tools on captured kernels",
        "",
        f"- Date: {date}",
        "- Source data: "
        + ", ".join(f"`{_rel(p)}`" for p in sources)
        + (
            " (copy of the H200 capture in /work/shared/fixtures/h200-probe: NVIDIA H200, ncu 2025.3.1, CUDA 13.0)"
            if any(p.resolve() == DEFAULT_CAPTURE for p in sources)
            else ""
        ),
        f"- Command: `{command}`",
        f"- Kernels: {len(rows)} (first profiled launch of each name); tools: {len(tools)}",
        "- Stage 1: theoretical class from kernels.yaml FLOPs / minimal bytes against the device "
        "table's ridge point; measured class from ncu SOL. Severities after the registry's "
        f"policies (near a hardware roof at >= {NEAR_ROOFLINE_PCT:g}%: capped at low; library kernels: capped at medium).",
        "",
        "## Kernels",
        "",
        *_kernel_table(rows),
        "",
        "## Tool x kernel",
        "",
        "C critical, H high, M medium, L low; `.` ran without a finding; `a` skipped by Stage-1 affinity; "
        "`-` skipped, inputs missing (e.g. no SASS for library/Triton kernels, no timeline, no minimal bytes).",
        "",
        *_matrix(rows, tools),
        "",
    ]
    extra = [(r, e) for r in rows for e in r.extra_both]
    lines += [
        "## Stage-1 disagreement: what the measured class's tools would add",
        "",
        '`run_tools(..., affinity_mode="both")` also runs the tools of the measured class when it '
        "differs from the final (theoretical) one. The table above uses the design's default "
        '(`"final"`); these findings are what that filter hides.',
        "",
    ]
    lines += [
        f"- `{_short(r.label, 40)}` ({r.stage1.theoretical} by roofline, {r.stage1.measured} measured): {e}"
        for r, e in extra
    ] or ["- none"]
    lines.append("")
    checks = [(r, text, ok) for r in rows for text, ok in r.checks]
    if checks:
        lines += ["## Expectations", "", "| kernel | check | result |", "|---|---|---|"]
        lines += [
            f"| `{_short(r.label, 40)}` | {text} | {'PASS' if ok else '**FAIL**'} |"
            for r, text, ok in checks
        ]
        lines.append("")
    if messages:
        comparison, totals = _comparison(rows, messages)
        lines += [
            "## Comparison with Nsight Compute's rule messages",
            "",
            "Kernels with a details page (`ncu_full_details.txt`). 'agree': one of our tools for the "
            "same problem fired; 'ncu only': none did (why in parentheses); 'ours only': our finding "
            "has no rule message on that kernel.",
            "",
            "Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())),
            "",
            *comparison,
        ]
    return "\n".join(lines).rstrip() + "\n"


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captures", nargs="*", type=Path, help="capture folders or raw CSV paths")
    parser.add_argument("--out", type=Path, default=Path("tools_table.md"), help="Markdown output")
    parser.add_argument("--date", default=dt.date.today().isoformat(), help="date for the header")
    args = parser.parse_args(argv)
    inputs = args.captures or [DEFAULT_CAPTURE]
    rows: list[Row] = []
    messages: list[NcuRuleMessage] = []
    sources: list[Path] = []
    for item in inputs:
        folder, csv_name = (item.parent, item.name) if item.is_file() else (item, "ncu_raw.csv")
        sources.append(folder)
        rows += analyze_capture(folder, csv_name)
        details = folder / "ncu_full_details.txt"
        if details.is_file():
            messages += parse_ncu_rule_messages(
                details.read_text(encoding="utf-8", errors="replace")
            )
    command = "python bench/tools_table.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    atomic_write_text(args.out, render(rows, messages, sources, args.date, command.strip()))
    failed = [(r.label, t) for r in rows for t, ok in r.checks if not ok]
    print(f"{'kernel':48} {'stage1':10} worst     findings")
    for r in rows:
        print(
            f"{_short(r.label, 48):48} {str(r.stage1.cls):10} {str(r.run.worst()):9} {len(r.run.findings)}"
        )
    print(
        f"wrote {args.out}; expectation checks: {sum(len(r.checks) for r in rows) - len(failed)} pass, {len(failed)} fail"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
