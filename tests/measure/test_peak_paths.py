"""The peak an fp32 GEMM really runs at: the faster paths of fp32 matrix work (3xTF32, TF32)
and a measured kernel priced at the path its rate implies, on the H200 records of KernelBench
12_Gemm_Multiply_LeakyReLU (tests/data/measure/SOURCE.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from pytest_kernelpro.measure.ceilings import Ceilings
from pytest_kernelpro.measure.flops import TF32X3_KEY, OpCost
from pytest_kernelpro.measure.matrix_paths import matrix_paths
from pytest_kernelpro.measure.roofline import (
    FEWER_FLOPS,
    analyze_reference,
    kernel_efficiency,
    price_measured,
)
from pytest_kernelpro.optimize.agents.prompt_reference import attainable_path
from pytest_kernelpro.record import KernelRecord, RooflinePart, part_of

DATA = json.loads(
    (Path(__file__).parents[1] / "data" / "measure" / "h200_12gemm_records.json").read_text()
)
REFERENCE, WINNER = DATA["reference"], DATA["winner"]


def h200_ceilings() -> Ceilings:
    """The ceilings 12_Gemm was priced on: FP32 and bandwidth as its record says, TF32 measured
    on the same H200 model the day before (the session's own ceilings file was not kept)."""
    r = REFERENCE["roofline"]
    return Ceilings(
        "NVIDIA H200",
        r["bandwidth_Bps"],
        {"fp32": r["peak_flops"], "tf32_tensor": DATA["tf32_tensor_flops"]},
        "measured",
        "2026-12-01T16:58:00+00:00",
        "2.11.0+cu130",
        {},
    )


def repriced_roofline(record: dict[str, Any]) -> dict[str, Any]:
    """The record's roofline with the paths today's analysis adds, from its own recorded ops."""
    r = dict(record["roofline"])
    ops = [OpCost(**op) for op in r["ops"]]
    r["paths"] = list(matrix_paths(ops, h200_ceilings(), r["flops"], r["memory_time_s"], "cuda"))
    return r


def test_fp32_gemm_paths_start_at_the_op_level_rule_and_add_3xtf32_then_tf32() -> None:
    paths = repriced_roofline(REFERENCE)["paths"]
    assert [p["key"] for p in paths] == ["fp32", TF32X3_KEY, "tf32_tensor"]
    assert [p["accuracy"] for p in paths] == ["fp32", "fp32", "tf32"]
    # The first path is the pricing the record already had (cuBLAS fp32 on the CUDA cores).
    recorded = REFERENCE["roofline"]
    assert paths[0]["roofline_time_s"] == pytest.approx(recorded["roofline_time_s"], rel=1e-9)
    assert paths[0]["peak_flops"] == pytest.approx(recorded["peak_flops"], rel=1e-9)
    # 3xTF32: the GEMM at a third of the TF32 rate, the elementwise multiply still on FP32.
    gemm, mul = (op["flops"] for op in recorded["ops"][:2])
    expected = gemm / (DATA["tf32_tensor_flops"] / 3) + mul / recorded["peak_flops"]
    assert paths[1]["compute_time_s"] == pytest.approx(expected, rel=1e-9)
    assert paths[1]["peak_name"].startswith("mixed, effective 136 TFLOP/s")
    assert "3xTF32 tensor core" in paths[1]["peak_name"]
    assert paths[0]["roofline_time_s"] > paths[1]["roofline_time_s"] > paths[2]["roofline_time_s"]


def test_the_3xtf32_winner_is_priced_at_3xtf32_not_at_145_percent_of_fp32() -> None:
    median = WINNER["timing"]["stats"]["median_s"]
    assert WINNER["efficiency"] == pytest.approx(1.446, abs=1e-3)  # what the H200 run reported
    priced = price_measured(repriced_roofline(WINNER), median)
    assert priced is not None
    assert priced.inferred
    assert priced.problem is None
    assert priced.key == TF32X3_KEY
    assert 0.5 < priced.efficiency < 0.6  # 73.7 TFLOP/s of a 136 TFLOP/s ceiling
    assert priced.measured_flops_per_s == pytest.approx(WINNER["roofline"]["flops"] / median)
    assert priced.note is not None
    assert priced.note == (
        "peak: 3xTF32 tensor core (fp32 as three TF32 MMAs), 136 TFLOP/s, inferred: 73.7 TFLOP/s "
        "measured exceeds the FP32 CUDA core peak (50.9 TFLOP/s)"
    )
    assert priced.short() == "3xTF32, inferred"


def test_the_cublas_reference_keeps_its_fp32_pricing() -> None:
    median = REFERENCE["timing"]["stats"]["median_s"]
    priced = price_measured(repriced_roofline(REFERENCE), median)
    assert priced is not None
    assert not priced.inferred
    assert priced.note is None
    assert priced.efficiency == pytest.approx(REFERENCE["efficiency"], rel=1e-12)  # 99.2%


def test_a_rate_above_every_path_stays_above_100_percent_and_is_named() -> None:
    r = repriced_roofline(WINNER)
    median = r["paths"][-1]["compute_time_s"] / 2  # twice the TF32 tensor-core rate
    priced = price_measured(r, median)
    assert priced is not None
    assert not priced.inferred
    assert priced.problem == "flops"
    assert priced.efficiency == pytest.approx(r["roofline_time_s"] / median)
    assert priced.efficiency > 1
    assert priced.note is not None
    assert FEWER_FLOPS in priced.note  # reported, never failed: the rewrite's own FLOPs are fewer
    assert "the fastest: TF32 tensor core, 409 TFLOP/s)" in priced.note
    assert priced.short() == "fewer FLOPs than the reference"


def test_a_record_from_before_the_paths_is_flagged_not_repriced() -> None:
    """Older records carry no paths: a rate above the op-level peak is said, not guessed."""
    assert "paths" not in WINNER["roofline"]
    median = WINNER["timing"]["stats"]["median_s"]
    priced = price_measured(msgspec.convert(WINNER["roofline"], RooflinePart), median)
    assert priced is not None
    assert priced.problem == "flops"
    assert priced.efficiency == pytest.approx(WINNER["efficiency"], rel=1e-12)
    assert kernel_efficiency(WINNER["roofline"], median) == pytest.approx(WINNER["efficiency"])
    record = msgspec.convert(WINNER, KernelRecord)
    assert record.peak_used is None
    assert record.roofline is not None
    assert record.roofline.paths is None


def test_a_byte_rate_above_dram_is_named() -> None:
    r = repriced_roofline(REFERENCE)
    r.update(memory_time_s=2 * r["compute_time_s"], roofline_time_s=2 * r["compute_time_s"])
    r.update(compulsory_bytes=r["memory_time_s"] * r["bandwidth_Bps"])  # its own inputs too
    median = r["compute_time_s"]  # at the FP32 rate, but faster than its bytes allow
    priced = price_measured(r, median)
    assert priced is not None
    assert priced.problem == "bytes"
    assert not priced.inferred
    assert priced.efficiency == pytest.approx(2.0)
    assert priced.note is not None
    assert "above the DRAM ceiling 4.26 TB/s" in priced.note
    assert priced.short() == "above the bandwidth ceiling"


def test_weights_beyond_dram_with_the_calls_own_bytes_within_it_are_not_a_problem() -> None:
    """A kernel may fold its module's weights at construction: only the call's own inputs and
    outputs are compulsory (measure/roofline.py)."""
    r = repriced_roofline(REFERENCE)
    r.update(memory_time_s=2 * r["compute_time_s"], roofline_time_s=2 * r["compute_time_s"])
    r.update(compulsory_bytes=0.5 * r["compute_time_s"] * r["bandwidth_Bps"])
    priced = price_measured(r, r["compute_time_s"])
    assert priced is not None
    assert priced.problem is None
    assert priced.note is not None
    assert "(not impossible)" in priced.note


def test_attainable_path_is_the_fastest_at_the_references_accuracy() -> None:
    r = repriced_roofline(REFERENCE)
    best = attainable_path(r)
    assert best is not None
    assert best["key"] == TF32X3_KEY
    assert attainable_path(REFERENCE["roofline"]) is None  # no paths: nothing to offer
    # Without a TF32 ceiling neither tensor-core path is a path of this device.
    ops = [OpCost(**op) for op in r["ops"]]
    fp32_only = Ceilings(
        "x", r["bandwidth_Bps"], {"fp32": r["peak_flops"]}, "measured", "t", "2", {}
    )
    paths = matrix_paths(ops, fp32_only, r["flops"], r["memory_time_s"], "cuda")
    assert [p["key"] for p in paths] == ["fp32"]
    assert attainable_path({**r, "paths": list(paths)}) is None


def test_only_fp32_matrix_work_on_a_gpu_has_paths() -> None:
    ceilings = h200_ceilings()
    bf16 = [OpCost("aten.mm.default", "gemm", 1e12, 1e9, "bfloat16", "bf16_tensor")]
    tf32_on = [OpCost("aten.mm.default", "gemm", 1e12, 1e9, "float32", "tf32_tensor")]
    elementwise = [OpCost("aten.mul.Tensor", "elementwise", 1e9, 1e9, "float32", "fp32")]
    for ops in (bf16, tf32_on, elementwise):
        assert matrix_paths(ops, ceilings, 1e12, 1e-4, "cuda") == ()
    fp32 = [OpCost("aten.mm.default", "gemm", 1e12, 1e9, "float32", "fp32")]
    assert matrix_paths(fp32, ceilings, 1e12, 1e-4, "cpu") == ()
    # SDPA's memory-efficient kernel is already priced as 3xTF32: only TF32 is faster.
    sdpa = [OpCost("aten._scaled_dot_product_efficient_attention.default", "attention",
                   1e12, 1e9, "float32", TF32X3_KEY)]  # fmt: skip
    keys = [p["key"] for p in matrix_paths(sdpa, ceilings, 1e12, 1e-4, "cuda")]
    assert keys == [TF32X3_KEY, "tf32_tensor"]


def test_cpu_analysis_carries_no_paths_and_round_trips() -> None:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ceilings = Ceilings("cpu (test)", 1e10, {"fp32": 1e11}, "measured", "t", torch.__version__, {})
    analysis = analyze_reference(torch.matmul, (a, b), ceilings=ceilings)
    assert analysis.paths == ()
    part = part_of(RooflinePart, analysis)
    assert part.paths == []
    assert msgspec.to_builtins(part)["paths"] == []


def test_the_benchmarking_agents_own_section_names_the_faster_ceiling() -> None:
    from pytest_kernelpro.measure.roofline import ReferenceAnalysis
    from pytest_kernelpro.optimize.agents.benchmarking import render_reference_analysis

    r = repriced_roofline(REFERENCE)
    analysis = ReferenceAnalysis(
        **{
            **{k: v for k, v in r.items() if k not in ("ops", "notes", "bound_band", "paths")},
            "ops": tuple(OpCost(**op) for op in r["ops"]),
            "notes": tuple(r["notes"]),
            "bound_band": tuple(r["bound_band"]),
            "paths": tuple(r["paths"]),
        }
    )
    text = render_reference_analysis(analysis, measured_s=REFERENCE["timing"]["stats"]["median_s"])
    assert (
        "- At fp32 accuracy the work can run faster, at the 3xTF32 tensor core (fp32 as three "
        "TF32 MMAs) peak (136 TFLOP/s): roofline time 1.01 ms." in text
    )
    assert "- The reference takes 2.72 ms: 99.2% of the roofline, 37.0% of the faster one." in text


def test_a_library_kernel_a_little_above_its_measured_ceiling_keeps_its_unit() -> None:
    """cuBLAS fp32 ran up to 3.4% above the measured FP32 ceiling in the H200 KernelBench sweep
    (6_Matmul_with_large_K_dimension_: 52.6 vs 50.9 TFLOP/s, sweep run1): that is FFMA beating
    one GEMM size's rate, not tensor cores, so it stays on FP32 and the note says by how much."""
    r = repriced_roofline(REFERENCE)
    median = r["compute_time_s"] / 1.034
    priced = price_measured(r, median)
    assert priced is not None
    assert not priced.inferred
    assert priced.problem is None
    assert priced.efficiency == pytest.approx(1.034)
    assert priced.note is not None
    assert "3.4% above the FP32 CUDA core peak (50.9 TFLOP/s): within the 10%" in priced.note
    assert priced.short() is None
