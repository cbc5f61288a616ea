"""Every ncu metric a tool reads is a real Hopper name: a column of one of the H200 raw CSVs
(the probe, or bench/profile_capture.py's), or a base listed by `ncu --query-metrics` on gh100
with a suffix that fits its type."""

from __future__ import annotations

import csv
import re

from tools_factories import CAPTURE_DIR, PROBE_DIR

from pytest_kernelpro.tools import ToolRegistry, signals

# Suffixes each metric type accepts (ncu --query-metrics-mode suffix).
SUFFIXES = {
    "Counter": re.compile(
        r"\.(sum|avg|max|min)(\.(per_second|per_cycle_active|pct_of_peak_sustained_(active|elapsed)))?$"
    ),
    "Ratio": re.compile(r"\.(ratio|pct|max_rate)$"),
    "Throughput": re.compile(r"\.(avg|max|min|sum)\.pct_of_peak_sustained_(active|elapsed)$"),
}


METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]*__[a-z0-9_]+(\.[a-z0-9_]+)*$")


def tool_metric_names() -> set[str]:
    names: set[str] = set()
    for name in ToolRegistry.names():
        for request in ToolRegistry.get(name).required_metrics:
            names.update(request.names)
    for value in vars(signals).values():
        if isinstance(value, str) and METRIC_NAME.match(value):
            names.add(value)
        elif isinstance(value, signals.MetricRequest):
            names.update(value.names)
    names.update(signals.OCC_LIMITS.values())
    for request in signals.PIPES.values():
        names.update(request.names)
    for family in signals.STALL_FAMILIES:
        names.update(signals.stall_metric(r, family) for r in signals.STALL_REASONS)
    return names


def csv_columns() -> set[str]:
    columns: set[str] = set()
    for folder in (PROBE_DIR, CAPTURE_DIR):
        rows = list(csv.reader((folder / "ncu_raw.csv").read_text().splitlines()))
        columns.update(next(r for r in rows if r and r[0] == "ID"))
    return columns


def query_types() -> dict[str, str]:
    types = {}
    for line in (PROBE_DIR / "query_metrics_subset.txt").read_text().splitlines():
        m = re.match(r"^([a-z][a-z0-9_]*__[a-z0-9_]+)\s+(Counter|Ratio|Throughput)\b", line)
        if m:
            types[m.group(1)] = m.group(2)
    return types


def test_tool_metrics_exist_on_hopper() -> None:
    names = tool_metric_names()
    columns, types = csv_columns(), query_types()
    assert len(names) > 100
    in_csv = {n for n in names if n in columns}
    assert len(in_csv) >= 100  # most of what the tools read was in the capture
    bad = []
    for name in sorted(names - in_csv):
        base = name.split(".", 1)[0]
        kind = types.get(base)
        if kind is None or not SUFFIXES[kind].search(name):
            bad.append(f"{name} ({kind or 'not in --query-metrics'})")
    assert bad == []


def test_suffix_check_catches_a_made_up_name() -> None:
    types = query_types()
    assert not SUFFIXES[types["smsp__inst_executed_op_ldgsts"]].search(
        "smsp__inst_executed_op_ldgsts.ratio"
    )
    assert "smsp__warp_issue_stalled_memory_dependency_per_warp_active.pct" not in csv_columns()
