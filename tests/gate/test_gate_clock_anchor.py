"""The gate for power-capped kernels relative to the clock anchor (gate/clock_basis.py), its
fall-backs, and the baseline keys that carry the anchored samples (old files still load)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import pytest
from gate_factories import make_record

from pytest_kernelpro.gate.baseline import BaselineEntry, BaselineError, load_baseline
from pytest_kernelpro.gate.baseline_save import entry_dict, entry_from_record, save_baseline
from pytest_kernelpro.gate.confirmation import confirm
from pytest_kernelpro.gate.verdict import OK, REGRESSED, SUSPECT, decide_verdict
from pytest_kernelpro.measure.timing.anchor import summarize_pairs
from pytest_kernelpro.record import KernelRecord

US = 1e-6
ANCHOR = "bf16 matmul 4096x4096x4096 (torch 2.11.0+cu130, CUDA 13.0)"
MAX_MHZ = 1980.0


def capped(
    kernel_s: float,
    sm_mhz: float,
    *,
    seed: int,
    anchored: bool = True,
    anchor_s: float = 200 * US,
    anchor: str = ANCHOR,
    capped_share: float = 1.0,
) -> KernelRecord:
    """A GEMM timed at the power cap with its SM clock at `sm_mhz`: every time (its samples,
    each paired with an anchor time as the timer takes them) scales with 1980 / sm_mhz, as a
    compute-bound kernel's does; `kernel_s` is its time at the maximum clock, `capped_share`
    the share of its samples in rounds with a clock-lowering NVML reason."""
    slow = MAX_MHZ / sm_mhz
    record = make_record("gemm[4096]", median_s=kernel_s * slow, seed=seed, bound="compute",
                         noise=0.003, n=40)  # fmt: skip
    assert record.timing is not None
    rng = np.random.default_rng(seed + 1000)
    n = len(record.timing.samples_s)
    throttled = [i < round(capped_share * n) for i in range(n)]
    pairs = None
    if anchored:
        anchors = anchor_s * slow * np.exp(0.002 * rng.standard_normal(n))
        pairs = summarize_pairs(anchor, list(record.timing.samples_s), list(anchors),
                                "warm-up capped", throttled=throttled)  # fmt: skip
    record.timing = msgspec.structs.replace(
        record.timing,
        clocks={"sm_mhz_mean": sm_mhz, "reasons_seen": ["sw_power_cap"], "max_sm_mhz": MAX_MHZ},
        throttled_samples=sum(throttled),
        anchor=pairs,
    )
    return record


def entry_from(record: KernelRecord) -> BaselineEntry:
    entry = entry_from_record(record)
    assert entry is not None
    return entry


def without_anchor(
    record: KernelRecord, entry: BaselineEntry
) -> tuple[KernelRecord, BaselineEntry]:
    """The same measurements with no anchored pairs on either side, as
    `--kernelpro-clock-anchor=off` times them: the rule without the anchor decides."""
    assert record.timing is not None
    timing = msgspec.structs.replace(record.timing, anchor=None)
    bare = dataclasses.replace(entry, anchor=None, anchor_median_s=None, anchor_ratios=None)
    return msgspec.structs.replace(record, timing=timing), bare


def test_the_clock_moving_under_the_cap_is_not_a_regression_relative_to_the_anchor() -> None:
    """The cap allowed 1700 MHz for the baseline and 1600 now: +6.2% time, same ratio."""
    entry = entry_from(capped(200 * US, 1700.0, seed=1))
    now = capped(200 * US, 1600.0, seed=2)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.status == OK
    assert verdict.basis.startswith("time relative to the clock anchor (same device: NVIDIA H200")
    assert ANCHOR in verdict.basis
    assert "1600 of 1980 MHz in this run and 1700 of 1980 MHz in the baseline" in verdict.basis
    assert verdict.anchor == ANCHOR
    assert verdict.raw_change == pytest.approx(1700 / 1600 - 1, abs=0.01)
    assert verdict.anchor_change == pytest.approx(1700 / 1600 - 1, abs=0.01)
    assert abs(verdict.change or 1.0) < 0.005
    assert verdict.tolerance == pytest.approx(0.015)  # 0.75x the threshold
    # The rule before the anchor: the time moved 6.2%, beyond even the 3x tolerance (6%).
    widened = decide_verdict(*without_anchor(now, entry), threshold=0.02)
    assert widened.change == pytest.approx(1700 / 1600 - 1, abs=0.01)
    assert widened.tolerance == pytest.approx(0.06)


def test_a_three_percent_slowdown_under_a_moving_cap_is_caught_relative_to_the_anchor() -> None:
    """3% more work while the clock rose 3%: the time did not change, the ratio did."""
    entry = entry_from(capped(200 * US, 1600.0, seed=3))
    now = capped(206 * US, 1648.0, seed=4)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.status == REGRESSED
    assert verdict.change == pytest.approx(0.03, abs=0.004)
    assert (
        "slower by 3.0% relative to the clock anchor (tolerance 1.5%; plain time +0.0%, "
        "anchor GEMM -2.8%, SM clock held at 1648 of 1980 MHz in this run"
    ) in verdict.reason
    final = confirm(verdict, capped(206 * US, 1580.0, seed=5), entry)
    assert final.status == REGRESSED
    assert final.confirmed
    assert final.confirmation is not None
    assert str(final.confirmation["basis"]).startswith("time relative to the clock anchor")
    # Without the anchor the same comparison sees no time change: ok, the slowdown missed.
    assert decide_verdict(*without_anchor(now, entry), threshold=0.02).status == OK


def test_a_baseline_without_an_anchored_pass_keeps_the_widened_tolerance_and_says_why() -> None:
    entry = entry_from(capped(200 * US, 1600.0, seed=6, anchored=False))
    assert entry.anchor is None
    now = capped(200 * US * 1.04, 1600.0, seed=7)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.status == SUSPECT  # +4%: beyond 2%, within the widened 6%
    assert verdict.tolerance == pytest.approx(0.06)
    assert verdict.anchor is None
    assert "no clock anchor: the baseline has no anchored samples" in verdict.basis
    assert "re-save it" in verdict.basis


def test_another_anchor_is_not_compared() -> None:
    entry = entry_from(capped(200 * US, 1600.0, seed=8, anchor="bf16 matmul (torch 2.10)"))
    verdict = decide_verdict(capped(200 * US, 1600.0, seed=9), entry, threshold=0.02)
    assert verdict.anchor is None
    assert "the anchor differs" in verdict.basis
    assert verdict.tolerance == pytest.approx(0.06)


def test_a_capped_kernel_near_the_maximum_clock_is_compared_relative_to_the_anchor() -> None:
    """Capped by the per-round reasons at 1965 of 1980 MHz (NVML's mean: not clock-limited):
    the anchor still applies, at the threshold, and the basis says what made it capped."""
    entry = entry_from(capped(300 * US, 1965.0, seed=10))
    now = capped(300 * US * 1.03, 1965.0, seed=11)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.anchor == ANCHOR
    assert verdict.basis.startswith(
        "time relative to the clock anchor (same device: NVIDIA H200; samples under a power or "
        "thermal limit: 100% in this run at 1965 of 1980 MHz, 100% in the baseline at 1965 of "
        "1980 MHz: kernel / bf16 matmul"
    )
    assert verdict.tolerance == pytest.approx(0.015)
    assert verdict.status == REGRESSED


def test_the_cap_noise_nvml_missed_is_cancelled_by_the_anchor() -> None:
    """Session 4's one false alarm: both NVML means at or above 95% of the maximum, the kernel
    100% capped, its time +4.5% from the cap alone. The time rule fails it; the anchor does
    not."""
    entry = entry_from(capped(350 * US, 1960.0, seed=20))
    now = capped(350 * US, 1960.0 / 1.045, seed=21)  # 1876 MHz: 94.7% of the maximum
    now.timing = msgspec.structs.replace(
        now.timing, clocks={**now.timing.clocks, "sm_mhz_mean": 1900.0}
    )
    assert decide_verdict(*without_anchor(now, entry), threshold=0.02).status == REGRESSED
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.status == OK
    assert verdict.raw_change == pytest.approx(0.045, abs=0.005)
    assert abs(verdict.change or 1.0) < 0.005


def test_samples_mostly_without_a_clock_limit_compare_times() -> None:
    """Anchored samples on both sides, but under half of each side's samples capped: times."""
    entry = entry_from(capped(300 * US, 1965.0, seed=22, capped_share=0.4))
    now = capped(300 * US * 1.03, 1965.0, seed=23, capped_share=0.45)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.basis == "time (same device: NVIDIA H200)"
    assert verdict.anchor is None
    assert verdict.status == REGRESSED


def test_an_old_baseline_without_pairs_falls_back_to_times_and_says_why() -> None:
    """This run anchored, the baseline saved without the anchor; the NVML clock near the
    maximum, so today's rule is the plain threshold on times."""
    entry = entry_from(capped(300 * US, 1965.0, seed=24, anchored=False))
    verdict = decide_verdict(capped(300 * US * 1.03, 1965.0, seed=25), entry, threshold=0.02)
    assert verdict.anchor is None
    assert verdict.tolerance == pytest.approx(0.02)
    assert verdict.basis.startswith(
        "time (same device: NVIDIA H200; samples under a power or thermal limit: 100% in this "
        "run at 1965 of 1980 MHz, 100% in the baseline at 1965 of 1980 MHz; no clock anchor: "
        "the baseline has no anchored samples"
    )
    assert verdict.status == REGRESSED


def test_the_anchored_tolerance_is_three_quarters_of_the_threshold() -> None:
    """+1.8% relative to the anchor: beyond the 1.5% (0.75 x 2%) of a 2% threshold."""
    entry = entry_from(capped(200 * US, 1600.0, seed=26))
    now = capped(200 * US * 1.018, 1650.0, seed=27)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.tolerance == pytest.approx(0.015)
    assert verdict.status == REGRESSED
    assert "relative to the clock anchor (tolerance 1.5%;" in verdict.reason
    final = confirm(verdict, capped(200 * US * 1.018, 1580.0, seed=28), entry)
    assert final.status == REGRESSED
    assert final.confirmation is not None
    assert final.confirmation["basis"].startswith("time relative to the clock anchor")
    # A user's threshold scales it: 5% -> 3.75%.
    assert decide_verdict(now, entry, threshold=0.05).tolerance == pytest.approx(0.0375)


def test_the_rule_without_the_anchor_ignores_the_pairs() -> None:
    entry = entry_from(capped(300 * US, 1965.0, seed=29))
    verdict = decide_verdict(*without_anchor(capped(300 * US, 1965.0, seed=30), entry),
                             threshold=0.02)  # fmt: skip
    assert verdict.basis == "time (same device: NVIDIA H200)"
    assert verdict.anchor is None


def test_the_anchored_pass_round_trips_through_a_baseline_file(tmp_path: Path) -> None:
    record = capped(200 * US, 1600.0, seed=12)
    path = tmp_path / "baseline.yaml"
    save_baseline(path, [record], commit="abc")
    text = path.read_text()
    assert f"anchor: {ANCHOR}" in text
    entry = load_baseline(path).entry_for(record)
    assert entry is not None
    assert entry.anchor == ANCHOR
    assert entry.anchor_ratios is not None
    assert len(entry.anchor_ratios) == 40
    assert record.timing is not None
    assert record.timing.anchor is not None
    assert entry.anchor_median_s == pytest.approx(record.timing.anchor["anchor_median_s"], rel=1e-5)
    verdict = decide_verdict(capped(200 * US, 1700.0, seed=13), entry, threshold=0.02)
    assert verdict.anchor == ANCHOR
    assert verdict.status == OK


# The first entry of a baseline the plugin wrote on the H200 on 2026-12-01, before the clock
# and anchor keys existed (bench/results/raw/2026-12-01-restructure-parity-h200/before/
# ex-baseline.yaml, in git at 08d3359), copied verbatim.
OLD_BASELINE = """\
# pytest-kernelpro baseline: written by --kernelpro-save-baseline; read by --kernelpro-check --kernelpro-baseline
schema_version: 1
tool: pytest-kernelpro 0.1.0
device: NVIDIA H200
commit: f527e7801a020e848e156ea0a8402e2f7f1d7411
created: '2026-12-01T11:27:30+00:00'
kernels:
  test_kernels.py::RMSNorm:
    name: RMSNorm
    kernel: RMSNorm
    device: NVIDIA H200
    median_s: 0.000169456
    q1_s: 0.000169056
    q3_s: 0.000170128
    n: 20
    efficiency: 0.186255
    roofline_time_s: 3.1562e-05
    method: cuda-events
    samples_s: [0.000168, 0.000168832, 0.000168832, 0.00016896, 0.000169056, 0.000169056, 0.000169216,
      0.00016928, 0.000169344, 0.00016944, 0.000169472, 0.000169568, 0.000169696, 0.000169728, 0.000170048,
      0.000170368, 0.000170848, 0.000170912, 0.000171264, 0.000171872]
"""


def test_a_baseline_from_before_the_anchor_loads_and_gates_as_before(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(OLD_BASELINE)
    entry = load_baseline(path).entries["test_kernels.py::RMSNorm"]
    assert entry.anchor is None
    assert entry.anchor_ratios is None
    assert entry.sm_mhz is None
    assert "anchor" not in entry_dict(entry)
    now = make_record("RMSNorm", median_s=0.000169456 * 1.05, seed=14, noise=0.002, n=40)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.basis == "time (same device: NVIDIA H200)"
    assert verdict.status == REGRESSED


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("anchor_ratios", "[]", "anchor_ratios is [], expected a non-empty list"),
        ("anchor_ratios", "[1.2, -3]", "anchor_ratios is [1.2, -3], expected"),
        ("anchor_median_s", "0", "anchor_median_s is 0, expected a positive number"),
        ("anchor", "12", "anchor is 12, expected a string"),
    ],
)
def test_a_bad_anchor_key_is_a_clear_error(tmp_path: Path, key: str, value: str, says: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(OLD_BASELINE.replace("    method: cuda-events\n",
                                         f"    method: cuda-events\n    {key}: {value}\n"))  # fmt: skip
    with pytest.raises(BaselineError, match="RMSNorm") as info:
        load_baseline(path)
    assert says in str(info.value)
