"""A kernel faster than its op-level peak, in the reports and the gate: the H200's 3xTF32 GEMM
for KernelBench 12_Gemm_Multiply_LeakyReLU (tests/data/measure/SOURCE.md), re-priced at
3xTF32, shown as such in every table, and judged by the gate exactly as before."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pytest_kernelpro.gate.baseline import BaselineEntry, load_baseline
from pytest_kernelpro.gate.baseline_save import entry_from_record, save_baseline
from pytest_kernelpro.gate.format import item_section, terminal_row
from pytest_kernelpro.gate.junit import junit_properties
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.measure.ceilings import Ceilings
from pytest_kernelpro.measure.flops import OpCost
from pytest_kernelpro.measure.matrix_paths import matrix_paths
from pytest_kernelpro.measure.roofline import record_pricing
from pytest_kernelpro.optimize.agents.prompt_reference import reference_summary
from pytest_kernelpro.record import KernelRecord, RooflinePart, decode_record, encode_record
from pytest_kernelpro.review.comment import comment_details, comment_row

DATA = json.loads(
    (Path(__file__).parents[1] / "data" / "measure" / "h200_12gemm_records.json").read_text()
)


def _ceilings(roofline: dict[str, Any]) -> Ceilings:
    flops = {"fp32": roofline["peak_flops"], "tf32_tensor": DATA["tf32_tensor_flops"]}
    return Ceilings("NVIDIA H200", roofline["bandwidth_Bps"], flops, "measured", "t", "2", {})


def as_recorded(which: str) -> KernelRecord:
    """The record as the H200 run wrote it (no paths, no peak_used)."""
    return msgspec.convert(copy.deepcopy(DATA[which]), KernelRecord)


def as_today(which: str) -> KernelRecord:
    """The same record as the roofline stage now writes it: the analysis's paths (from the
    record's own ops) and the efficiency and peak_used of `record_pricing`."""
    data = copy.deepcopy(DATA[which])
    r = data["roofline"]
    ops = [OpCost(**op) for op in r["ops"]]
    r["paths"] = list(matrix_paths(ops, _ceilings(r), r["flops"], r["memory_time_s"], "cuda"))
    record = msgspec.convert(data, KernelRecord)
    efficiency, record.peak_used = record_pricing(record.roofline, record.median_s or 0.0)
    record.efficiency = efficiency
    return record


def test_the_winner_is_reported_at_3xtf32_in_every_table() -> None:
    record = as_today("winner")
    assert record.efficiency is not None
    assert 0.5 < record.efficiency < 0.6
    assert record.peak_used is not None
    assert record.peak_used["inferred"] is True
    row = terminal_row(record, show_device=False, narrow=False, bar_width=10, color=False)
    assert row[-2] == "compute (3xTF32, inferred)"
    assert row[-3].endswith("54%")
    assert "| compute (3xTF32, inferred) |" in comment_row(record)
    section = item_section(record)
    assert "reaches 54.0%" in section
    assert (
        "peak used for this kernel: peak: 3xTF32 tensor core (fp32 as three TF32 MMAs), "
        "136 TFLOP/s, inferred: 73.7 TFLOP/s measured exceeds the FP32 CUDA core peak" in section
    )
    details = comment_details(record, with_guidance=False)
    assert "- **Peak used:** `peak: 3xTF32 tensor core" in details
    # The reference (cuBLAS at 99.2% of FP32) keeps its op-level pricing and says nothing more.
    reference = as_today("reference")
    assert reference.peak_used is None
    assert reference.efficiency == pytest.approx(DATA["reference"]["efficiency"], rel=1e-12)
    assert (
        terminal_row(reference, show_device=False, narrow=False, bar_width=10, color=False)[-2]
        == "compute"
    )


def test_a_hostile_peak_used_key_never_reaches_the_comment_as_markdown() -> None:
    record = as_today("winner")
    assert record.peak_used is not None
    record.peak_used = {**record.peak_used, "key": "<img src=x>", "note": "**bold** @someone"}
    assert "<img" not in comment_row(record)  # an unknown unit: no words in the cell
    assert "- **Peak used:** `**bold** @someone`" in comment_details(record, with_guidance=False)


def test_peak_used_survives_json_and_junit() -> None:
    record = as_today("winner")
    again = decode_record(encode_record(record), source="test")
    assert again.peak_used == record.peak_used
    assert again.roofline is not None
    assert again.roofline.paths == record.roofline.paths
    props = dict(junit_properties(record))
    assert json.loads(props["kernelpro.peak_used"]) == record.peak_used


def test_the_gate_decides_exactly_as_before_the_repricing() -> None:
    """Same device: times. Other device: time over the roofline time, which stays the op-level
    rule's in the record and the baseline. Neither moves when the efficiency is re-priced."""
    baseline_entry = entry_from_record(as_recorded("reference"))
    assert baseline_entry is not None
    old, new = as_recorded("winner"), as_today("winner")
    assert new.roofline_time_s == old.roofline_time_s
    assert new.efficiency != old.efficiency
    for entry in (
        baseline_entry,
        BaselineEntry(**{**asdict(baseline_entry), "device": "NVIDIA H100"}),
    ):
        before = msgspec.structs.asdict(decide_verdict(old, entry, threshold=0.1))
        after = msgspec.structs.asdict(decide_verdict(new, entry, threshold=0.1))
        assert {k: v for k, v in after.items() if k != "efficiency"} == {
            k: v for k, v in before.items() if k != "efficiency"
        }
        assert before["change_status"] == "improved"
    # What the H200 run decided with its recorded baseline: improved by 31.4%.
    same = decide_verdict(new, baseline_entry, threshold=0.1)
    assert same.change == pytest.approx(DATA["winner"]["gate"]["change"], rel=1e-5)


def test_baselines_keep_the_op_level_roofline_time_and_old_ones_load(tmp_path: Path) -> None:
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    save_baseline(old_file, [as_recorded("winner")], commit="x")
    save_baseline(new_file, [as_today("winner")], commit="x")
    (old_entry,) = load_baseline(old_file).entries.values()
    (new_entry,) = load_baseline(new_file).entries.values()
    assert new_entry.roofline_time_s == old_entry.roofline_time_s
    assert new_entry.median_s == old_entry.median_s
    assert old_entry.efficiency == pytest.approx(1.44626, rel=1e-5)  # as the old run saved it
    # A check of today's record against the old baseline decides as against the new one.
    today = as_today("winner")
    assert (
        decide_verdict(today, old_entry).change_status
        == decide_verdict(today, new_entry).change_status
    )


def test_the_optimizer_hears_the_3xtf32_headroom_for_the_cublas_reference() -> None:
    reference = as_today("reference")
    assert reference.roofline is not None
    median = reference.median_s
    text = reference_summary(reference.roofline, reference_s=median, current_s=median)
    assert "headroom at most 1.01x" not in text
    assert (
        "- Roofline time 2.7 ms at the FP32 CUDA core peak; the reference takes 2.72 ms (99.2% of "
        "the FP32 CUDA core roofline); the current kernel 2.72 ms (99.2% of it)." in text
    )
    assert (
        "- At fp32 accuracy the work can run faster, at the 3xTF32 tensor core (fp32 as three "
        "TF32 MMAs) peak (136 TFLOP/s): roofline time 1.01 ms; the reference reaches 37.0% of it; "
        "the current kernel 37.0%: headroom at most 2.7x against this ceiling." in text
    )
    # The winner, as the current kernel of a next search: its own peak is inferred.
    winner = as_today("winner")
    text = reference_summary(reference.roofline, reference_s=median, current_s=winner.median_s)
    assert (
        "the current kernel 1.87 ms is faster than that roofline allows: it does not run on the "
        "FP32 CUDA cores alone." in text
    )
    assert "the current kernel 54.0%: headroom at most 1.85x against this ceiling." in text


def test_a_roofline_without_paths_reads_as_before() -> None:
    """Records from before the paths (and memory-bound work) keep the old text."""
    part = msgspec.convert(DATA["reference"]["roofline"], RooflinePart)
    median = DATA["reference"]["timing"]["stats"]["median_s"]
    text = reference_summary(part, reference_s=median, current_s=median)
    assert "(99.2% of roofline): headroom at most 1.01x." in text


def test_the_search_summary_prices_a_candidate_at_the_peak_its_rate_implies() -> None:
    """% of roofline after: the 3xTF32 candidate, 1.46x the cuBLAS reference (the H200
    re-check's medians), reads 54% where current % x speedup said 145%."""
    from pytest_kernelpro.optimize.loop.item import _efficiency_of
    from pytest_kernelpro.optimize.loop.outcome import rank_nodes
    from pytest_kernelpro.optimize.search import Candidate, Evaluation
    from pytest_kernelpro.optimize.search.tree import SearchNode

    reference, winner = as_today("reference"), as_today("winner")
    assert reference.median_s is not None
    assert winner.median_s is not None
    speedup = reference.median_s / winner.median_s
    root = SearchNode(0)
    node = SearchNode(
        1,
        parent=root,
        candidate=Candidate(code="3xTF32 GEMM", strategy="3xTF32"),
        evaluation=Evaluation(status="correct", speedup=speedup),
        mode="optimize",
    )
    before = reference.efficiency
    (plain,), _ = rank_nodes([node], current_speedup=1.0, efficiency_before=before)
    # (the two clones measured their own ceilings: their roofline times differ by 0.01%)
    assert plain["efficiency_after"] == pytest.approx(DATA["winner"]["efficiency"], rel=1e-3)
    (priced,), _ = rank_nodes(
        [node],
        current_speedup=1.0,
        efficiency_before=before,
        efficiency_of=_efficiency_of(reference),
    )
    assert priced["efficiency_after"] == pytest.approx(winner.efficiency, rel=1e-3)
    assert priced["efficiency_after"] < 0.6


def test_a_roofline_floor_reads_the_repriced_share() -> None:
    """min_roofline is judged against the ceiling the kernel really ran under: the 3xTF32 GEMM
    at 54% of 3xTF32 is below a 0.8 floor that its 145% 'of FP32' used to pass. The regression
    decision (change status) is the same either way."""
    old, new = as_recorded("winner"), as_today("winner")
    old.min_roofline = new.min_roofline = 0.8
    entry = entry_from_record(as_recorded("reference"))
    before, after = (
        decide_verdict(old, entry, threshold=0.1),
        decide_verdict(new, entry, threshold=0.1),
    )
    assert before.change_status == after.change_status == "improved"
    assert before.below_roofline is False
    assert after.below_roofline is True
