"""The clock anchor's measurement side (measure/timing/anchor.py): when the anchored pass runs,
how many pairs it takes, what it records; on a GPU, the pass itself."""

from __future__ import annotations

import json

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.anchor import (
    ANCHOR_MIN_PAIRS,
    ANCHOR_PAIRS,
    anchored_pass,
    pair_count,
    summarize_pass,
    wants_anchor,
)


@pytest.mark.parametrize(
    ("mode", "throttled", "wanted"),
    [
        ("on", [True] * 20, True),
        ("on", [True] * 10 + [False] * 10, True),  # half: the gate's capped share
        ("on", [True] * 9 + [False] * 11, False),
        ("on", [], False),
        ("off", [True] * 20, False),  # the default
    ],
)
def test_the_pass_runs_only_for_mostly_clock_limited_samples(
    mode: str, throttled: list[bool], wanted: bool
) -> None:
    assert wants_anchor(mode, throttled) is wanted


def test_pair_count_fits_the_pass_length_within_its_bounds() -> None:
    assert pair_count(200e-6, 200e-6) == ANCHOR_PAIRS  # 20 pairs of 0.4 ms: 8 ms
    assert pair_count(20e-3, 200e-6) == 12  # 0.25 s / 20.2 ms
    assert pair_count(1.0, 200e-6) == ANCHOR_MIN_PAIRS  # a 1 s kernel still gets the minimum
    assert pair_count(0.0, 0.0) == ANCHOR_PAIRS


def test_summarize_pass_keeps_both_series_and_their_ratios() -> None:
    got = summarize_pass("anchor X", [2.0, 4.0, 3.0], [1.0, 2.0, 1.0], "3 of 3 capped")
    assert got["ratios"] == [2.0, 2.0, 3.0]
    assert got["ratio_median"] == 2.0
    assert got["kernel_median_s"] == 3.0
    assert got["anchor_median_s"] == 1.0
    assert got["pairs"] == 3
    assert got["name"] == "anchor X"
    json.dumps(got, allow_nan=False)


def test_summarize_pass_drops_pairs_with_a_non_positive_time() -> None:
    got = summarize_pass("a", [1.0, 0.0, 2.0], [1.0, 1.0, -1.0], "r")
    assert got["pairs"] == 1
    assert got["ratios"] == [1.0]


def test_the_budget_names_a_bad_clock_anchor_mode() -> None:
    with pytest.raises(KernelproConfigError, match=r"clock_anchor='always' \(use one of off, on\)"):
        TimingBudget(clock_anchor="always")


def test_cpu_timings_carry_no_anchored_pass() -> None:
    result = time_kernel(
        lambda: sum(range(100)), device="cpu", budget=TimingBudget(max_time_s=0.05)
    )
    assert result.anchor is None
    assert result.to_dict()["anchor"] is None


@pytest.mark.gpu
def test_the_anchored_pass_times_kernel_and_anchor_alternately_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    flush_buf = torch.empty(2**24, device="cuda")
    got = anchored_pass(torch, 0, lambda: a @ a, 1, flush_buf.zero_, 200e-6, 1.8e9, 20e-6, "test")
    assert got["pairs"] == ANCHOR_PAIRS
    assert got["name"].startswith("bf16 matmul 4096x4096x4096 (torch ")
    # The same GEMM as the anchor (other data): their ratio is near 1.
    assert 0.7 < got["ratio_median"] < 1.4
    # 2 * 4096^3 FLOP: slower than 3 PFLOP/s, faster than 20 TFLOP/s on any H100/H200-class GPU.
    assert 2 * 4096**3 / 3e15 < got["anchor_median_s"] < 2 * 4096**3 / 20e12


@pytest.mark.gpu
def test_a_gpu_measurement_records_its_pass_only_when_clock_limited() -> None:
    torch = pytest.importorskip("torch")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    budget = TimingBudget(max_time_s=0.5, clock_anchor="on")
    result = time_kernel(lambda: a @ a, device="cuda", budget=budget)
    capped = result.throttled_samples >= 0.5 * len(result.samples_s)
    assert (result.anchor is not None) is capped
    default = time_kernel(lambda: a @ a, device="cuda", budget=TimingBudget(max_time_s=0.5))
    assert default.anchor is None  # off by default
