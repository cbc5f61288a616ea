"""The profiler's one metric list (`analysis.requested_metrics`: the curated catalog plus what
the tools declare) covers every metric the built-in tools actually read.

The reads are recorded while every tool runs on every H200 capture in tests/data (the golden
snapshot's runs), so a counter a tool reads through a shared signal (stall shares, pipe
utilization, saturation) counts too, not only the declared `required_metrics`.
"""

from __future__ import annotations

import pytest
from golden_findings import snapshot

from pytest_kernelpro.analysis import requested_metrics
from pytest_kernelpro.profile import model
from pytest_kernelpro.profile.metrics_catalog import CURATED_METRICS
from pytest_kernelpro.tools import ToolRegistry, signals

# Read by a tool but in no list the profiler asks ncu for: the value is never present in a
# live profile, so the code that reads it sees None. Collecting it would change what ncu
# collects (one more counter, possibly new pipe findings): left as it was, and named here so
# that adding it to the catalog (or dropping the read) makes this test ask for the update.
KNOWN_UNCOLLECTED = {
    # signals.PIPES["XU (transcendentals)"], read by signals.pipe_utilization (optional).
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
}


def _fallbacks(collected: set[str]) -> set[str]:
    """Alternative names of a collected metric (tried only when it is absent: older ncu)."""
    requests = [r for cls in ToolRegistry.tool_classes() for r in cls.required_metrics]
    requests += [v for v in vars(signals).values() if isinstance(v, signals.MetricRequest)]
    requests += list(signals.PIPES.values())
    out = {alt for r in requests if r.name in collected for alt in r.alternatives}
    out |= {
        signals.stall_metric(r, family)
        for r in signals.STALL_REASONS
        for family in signals.STALL_FAMILIES[1:]
    }
    return out


def test_every_metric_the_tools_read_is_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    read: set[str] = set()
    original = model.KernelMetrics.get

    def recording_get(
        self: model.KernelMetrics, name: str, default: float | None = None
    ) -> float | None:
        read.add(name)
        return original(self, name, default)

    monkeypatch.setattr(model.KernelMetrics, "get", recording_get)
    snapshot()
    assert len(read) >= 60
    collected = set(requested_metrics())
    # ncu writes launch and device attributes on every raw page without being asked (the
    # catalog lists the launch ones as implicit).
    implicit = {m.name for m in CURATED_METRICS if m.implicit}
    uncovered = {
        n
        for n in read - collected - implicit - _fallbacks(collected)
        if not n.startswith("device__attribute_")
    }
    assert uncovered == KNOWN_UNCOLLECTED
