"""The curated metrics against the H200's real metric catalog and raw page."""

from __future__ import annotations

import pytest

from pytest_kernelpro.profile.metrics_catalog import (
    CATEGORIES,
    CURATED_METRICS,
    STALL_REASONS,
    drop_unavailable,
    metric_base_name,
    metrics_by_category,
    parse_query_metrics,
    requested_metric_names,
    stall_metric,
)
from pytest_kernelpro.profile.ncu_csv import parse_ncu_raw_table


@pytest.fixture(scope="module")
def catalog(probe_catalog: str) -> frozenset[str]:
    return parse_query_metrics(probe_catalog)


def test_catalog_parse(catalog: frozenset[str]) -> None:
    assert len(catalog) == 3515
    assert "dram__bytes_read" in catalog
    assert "smsp__warp_issue_stalled_gmma_per_warp_active" in catalog
    # only listed under a configuration prefix ("FBSP.TriageCompute.dramc__throughput")
    assert "dramc__throughput" not in catalog


def test_every_curated_counter_exists_on_hopper(catalog: frozenset[str]) -> None:
    names = [m.name for m in CURATED_METRICS]
    kept, dropped = drop_unavailable(names, catalog)
    assert dropped == []
    assert kept == names


def test_implicit_metrics_are_not_in_the_catalog_but_on_the_raw_page(
    catalog: frozenset[str], probe_csv: str
) -> None:
    """Why implicit metrics are never dropped by the catalog: the H200 capture did not request
    them (the catalog lacks them) and ncu wrote them anyway."""
    columns = set(parse_ncu_raw_table(probe_csv).metric_names)
    implicit = [m for m in CURATED_METRICS if m.implicit]
    assert len(implicit) >= 10
    for metric in implicit:
        assert metric.base_name not in catalog, metric.name
        assert metric.name in columns, metric.name
    assert not set(requested_metric_names()) & {m.name for m in implicit}


def test_missing_counters_are_dropped_and_reported(catalog: frozenset[str]) -> None:
    older = catalog - {
        "sm__pipe_tma_cycles_active",
        "smsp__warp_issue_stalled_gmma_per_warp_active",
    }
    kept, dropped = drop_unavailable([m.name for m in CURATED_METRICS], older)
    assert set(dropped) == {
        "sm__pipe_tma_cycles_active.avg.pct_of_peak_sustained_active",
        stall_metric("gmma"),
    }
    assert len(kept) == len(CURATED_METRICS) - 2
    names, lost = drop_unavailable(
        ["dram__bytes_read.sum", "launch__grid_size", "sm__nonexistent.sum"], catalog
    )
    assert names == ["dram__bytes_read.sum", "launch__grid_size"]
    assert lost == ["sm__nonexistent.sum"]


def test_catalog_shape() -> None:
    names = [m.name for m in CURATED_METRICS]
    assert len(names) == len(set(names))
    assert 50 <= len(requested_metric_names()) <= 70
    groups = metrics_by_category()
    assert list(groups) == list(CATEGORIES)
    assert all(m.label and m.category in CATEGORIES for m in CURATED_METRICS)
    stalls = {m.name for m in groups["stalls"]}
    for reason in (
        "long_scoreboard",
        "short_scoreboard",
        "barrier",
        "branch_resolving",
        "mio_throttle",
    ):
        assert reason in STALL_REASONS
        assert stall_metric(reason) in stalls
    pipes = {m.name for m in groups["pipes"]}
    assert (
        "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active"
        in pipes
    )
    flops = {m.name for m in groups["instructions"]}
    for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma"):
        assert f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" in flops


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("dram__bytes_read.sum", "dram__bytes_read"),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput"),
        ("launch__grid_size", "launch__grid_size"),
    ],
)
def test_metric_base_name(name: str, base: str) -> None:
    assert metric_base_name(name) == base
