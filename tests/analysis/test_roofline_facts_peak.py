"""The tools read a profiled kernel's share of the roofline at the peak its rate implies: the
H200's 3xTF32 GEMM for 12_Gemm (tests/data/measure/SOURCE.md) at 54% of the 3xTF32 ceiling,
not 145% of the FP32 CUDA-core one (which would mark every finding "near the roofline")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kernelpro.analysis import RooflineFacts
from pytest_kernelpro.measure.ceilings import Ceilings
from pytest_kernelpro.measure.flops import OpCost
from pytest_kernelpro.measure.matrix_paths import matrix_paths

DATA = json.loads(
    (Path(__file__).parents[1] / "data" / "measure" / "h200_12gemm_records.json").read_text()
)


def _roofline_with_paths() -> dict:
    r = dict(DATA["reference"]["roofline"])
    flops = {"fp32": r["peak_flops"], "tf32_tensor": DATA["tf32_tensor_flops"]}
    ceilings = Ceilings("NVIDIA H200", r["bandwidth_Bps"], flops, "measured", "t", "2", {})
    ops = [OpCost(**op) for op in r["ops"]]
    r["paths"] = list(matrix_paths(ops, ceilings, r["flops"], r["memory_time_s"], "cuda"))
    return r


def test_a_candidate_faster_than_fp32_is_read_at_3xtf32() -> None:
    roofline = _roofline_with_paths()
    ref_median = DATA["reference"]["timing"]["stats"]["median_s"]
    win_median = DATA["winner"]["timing"]["stats"]["median_s"]
    facts = RooflineFacts.from_roofline(roofline, median_s=ref_median)
    assert facts.efficiency == pytest.approx(DATA["reference"]["efficiency"], rel=1e-12)
    # The candidate's facts as the profiling child gets them (to_dict over a process edge).
    candidate = RooflineFacts(**json.loads(json.dumps(facts.to_dict()))).for_median(win_median)
    assert candidate.efficiency is not None
    assert 0.5 < candidate.efficiency < 0.6
    # Facts from a record of before the paths: the op-level share, above 100%, as it was.
    old = RooflineFacts.from_roofline(DATA["reference"]["roofline"], median_s=ref_median)
    assert old.for_median(win_median).efficiency == pytest.approx(
        roofline["roofline_time_s"] / win_median
    )
