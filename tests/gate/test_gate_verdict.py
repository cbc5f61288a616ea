"""Verdict logic on synthetic sample sets: every status, the confirmation, the bases."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from gate_factories import make_record

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.gate.baseline import BaselineEntry
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.confirmation import confirm
from pytest_kernelpro.gate.verdict import (
    BELOW_ROOFLINE,
    IMPROVED,
    INCOMPARABLE,
    NEW,
    OK,
    REGRESSED,
    SUSPECT,
    UNMEASURED,
    decide_verdict,
    needs_confirmation,
)

US = 1e-6


def entry_of(**kw: object) -> BaselineEntry:
    record = make_record(seed=1000, **kw)  # type: ignore[arg-type]
    entry = entry_from_record(record)
    assert entry is not None
    return entry


def test_same_kernel_again_is_ok() -> None:
    v = decide_verdict(make_record(seed=1), entry_of(), threshold=0.05)
    assert v.status == OK
    assert not v.failed
    assert v.basis == "time (same device: NVIDIA H200)"
    assert abs(v.change) < 0.01
    assert v.p_value is not None
    assert v.p_value > 0.01
    assert not needs_confirmation(v)


def test_clear_regression_needs_and_survives_confirmation() -> None:
    entry = entry_of()
    v = decide_verdict(make_record(median_s=55 * US, seed=2), entry, threshold=0.05)
    assert v.status == REGRESSED
    assert v.change == pytest.approx(0.10, abs=0.01)
    assert v.change_low == pytest.approx(0.10, abs=0.01)  # every call is slower
    assert v.p_value < 1e-6
    assert needs_confirmation(v)
    assert v.failed  # provisional: the plugin must confirm before reporting
    final = confirm(v, make_record(median_s=55 * US, seed=3), entry)
    assert final.status == REGRESSED
    assert final.confirmed
    assert final.failed
    assert final.confirmation["reproduced"] is True
    assert final.confirmation["change"] == pytest.approx(0.10, abs=0.01)
    assert "confirmed by a re-measurement" in final.reason
    assert not needs_confirmation(final)
    assert confirm(final, make_record(seed=4), entry) is final  # already settled


def test_regression_that_does_not_reproduce_is_suspect() -> None:
    entry = entry_of()
    first = decide_verdict(make_record(median_s=56 * US, seed=5), entry, threshold=0.05)
    assert first.status == REGRESSED
    final = confirm(first, make_record(median_s=50 * US, seed=6), entry)
    assert final.status == SUSPECT
    assert not final.failed
    assert not final.confirmed
    assert final.confirmation["reproduced"] is False
    assert "did not reproduce" in final.reason


def test_small_noisy_change_beyond_threshold_is_suspect_not_failed() -> None:
    base = [50.0, 65.0, 40.0, 55.0, 45.0]
    now = [v * 1.06 for v in base]  # median +6% but the samples overlap almost entirely
    entry = BaselineEntry(name="k", median_s=50 * US, samples_s=[v * US for v in base], n=5)
    entry.device = "NVIDIA H200"
    record = make_record(name="k", n=5)
    record.timing = msgspec.structs.replace(
        record.timing,
        samples_s=tuple(v * US for v in now),
        stats=msgspec.structs.replace(record.timing.stats, median_s=53 * US),
    )
    v = decide_verdict(record, entry, threshold=0.05)
    assert v.change == pytest.approx(0.06)
    assert v.status == SUSPECT
    assert v.p_value >= 0.01
    assert not v.failed
    assert not needs_confirmation(v)
    assert "not statistically clear" in v.reason


def test_interference_that_spares_the_fastest_calls_is_suspect() -> None:
    # 60% of the calls lost 30% to another process; the other 40% ran as before: the median
    # is far beyond the threshold, the fastest calls are not. Not a slower kernel.
    record = make_record(seed=21, n=400)
    samples = record.timing.samples_s
    hit = set(range(0, 400, 5)) | set(range(1, 400, 5)) | set(range(2, 400, 5))
    slower = tuple(v * 1.3 if i in hit else v for i, v in enumerate(samples))
    record.timing = msgspec.structs.replace(
        record.timing,
        samples_s=slower,
        stats=msgspec.structs.replace(record.timing.stats, median_s=float(np.median(slower))),
    )
    v = decide_verdict(record, entry_of(), threshold=0.05)
    assert v.change > 0.2
    assert v.p_value < 1e-6
    assert v.change_low < 0.05
    assert v.status == SUSPECT
    assert not v.failed
    assert "fastest 10% of calls were only " in v.reason
    assert "% slower: time was added to some calls" in v.reason


def test_fastest_calls_that_got_faster_are_said_so_beside_a_slower_median() -> None:
    # A loaded CPU: the median 50% slower while the fastest calls ran faster than the
    # baseline's. "fastest 10% of calls only -52.2%" read as a contradiction.
    record = make_record(seed=22, n=400)
    samples = record.timing.samples_s
    moved = tuple(v * 0.5 if i % 4 == 0 else v * 1.6 for i, v in enumerate(samples))
    record.timing = msgspec.structs.replace(
        record.timing,
        samples_s=moved,
        stats=msgspec.structs.replace(record.timing.stats, median_s=float(np.median(moved))),
    )
    v = decide_verdict(record, entry_of(), threshold=0.05)
    assert v.change > 0.4
    assert v.change_low < 0
    assert v.status == SUSPECT
    assert f"fastest 10% of calls were {-v.change_low * 100:.1f}% faster:" in v.reason


def test_significant_change_within_threshold_is_ok() -> None:
    # +2% with 0.2% noise: statistically clear, but below the 5% the user gates on.
    v = decide_verdict(
        make_record(median_s=51 * US, noise=0.002, seed=8), entry_of(noise=0.002), threshold=0.05
    )
    assert v.status == OK
    assert v.p_value < 1e-6
    assert v.change == pytest.approx(0.02, abs=0.003)


def test_improvement_is_reported() -> None:
    v = decide_verdict(make_record(median_s=45 * US, seed=9), entry_of(), threshold=0.05)
    assert v.status == IMPROVED
    assert v.change == pytest.approx(-0.10, abs=0.01)
    assert not v.failed
    assert "faster" in v.reason


def test_threshold_comes_from_the_record_by_default() -> None:
    loose = make_record(median_s=55 * US, seed=10, threshold=0.2)
    assert decide_verdict(loose, entry_of()).status == OK
    assert decide_verdict(loose, entry_of(), threshold=0.05).status == REGRESSED


def test_other_device_compares_efficiency_with_wider_tolerance() -> None:
    h100 = entry_of(device="NVIDIA H100 80GB HBM3", median_s=60 * US, roofline_time_s=36 * US)
    # Same efficiency (0.6) on the H200, 1.2x faster in time: not a change.
    same_eff = decide_verdict(make_record(median_s=50 * US, seed=11), h100, threshold=0.05)
    assert same_eff.status == OK
    assert same_eff.basis == "efficiency (other device: NVIDIA H100 80GB HBM3 vs NVIDIA H200)"
    assert same_eff.tolerance == pytest.approx(0.15)
    # 10% further from the roofline: a regression on one device, within 15% across devices.
    ten = decide_verdict(make_record(median_s=55 * US, seed=12), h100, threshold=0.05)
    assert ten.status == OK
    assert ten.change == pytest.approx(0.10, abs=0.01)
    # 25% further: a regression by efficiency.
    worse = decide_verdict(make_record(median_s=62.5 * US, seed=13), h100, threshold=0.05)
    assert worse.status == REGRESSED
    assert worse.baseline_device == "NVIDIA H100 80GB HBM3"
    assert "roofline" in worse.reason
    explicit = decide_verdict(
        make_record(median_s=55 * US, seed=12), h100, threshold=0.05, cross_device_tolerance=0.05
    )
    assert explicit.status == REGRESSED


def test_other_device_without_roofline_is_incomparable() -> None:
    h100 = entry_of(device="NVIDIA H100 80GB HBM3", roofline_time_s=None)
    v = decide_verdict(make_record(seed=14), h100, threshold=0.05)
    assert v.status == INCOMPARABLE
    assert not v.failed
    assert "Save a baseline on NVIDIA H200" in v.reason


def test_new_kernel() -> None:
    v = decide_verdict(make_record(seed=15), None, threshold=0.05)
    assert v.status == NEW
    assert not v.failed
    assert "--kernelpro-save-baseline" in v.reason


def test_unmeasured_kernel_is_not_a_gate_failure() -> None:
    v = decide_verdict(make_record(timed=False, outcome="failed"), entry_of(), threshold=0.05)
    assert v.status == UNMEASURED
    assert not v.failed


def test_below_roofline_fails_without_any_baseline() -> None:
    v = decide_verdict(make_record(seed=16, min_roofline=0.8), None, threshold=0.05)  # eff 0.6
    assert v.status == BELOW_ROOFLINE
    assert v.change_status == NEW
    assert v.below_roofline
    assert v.failed
    assert "below min_roofline=80%" in v.reason
    assert decide_verdict(make_record(seed=16, min_roofline=0.5), None).failed is False


def test_below_roofline_and_regressed_keeps_both() -> None:
    entry = entry_of()
    first = decide_verdict(make_record(median_s=60 * US, seed=17, min_roofline=0.8), entry)
    assert first.status == REGRESSED
    assert first.below_roofline
    # The regression does not reproduce: still fails on the floor.
    final = confirm(first, make_record(seed=18, min_roofline=0.8), entry)
    assert final.status == BELOW_ROOFLINE
    assert final.change_status == SUSPECT
    assert final.failed


def test_min_roofline_without_a_roofline_fails_with_the_fix() -> None:
    v = decide_verdict(make_record(seed=19, roofline_time_s=None, min_roofline=0.5), None)
    assert v.failed
    assert "flops=/bytes=" in v.reason


def test_the_records_verdict_has_its_failure_and_message() -> None:
    """The record's part reads `failed` and `message` from the verdict's properties."""
    from pytest_kernelpro.record import VerdictPart, part_of

    v = decide_verdict(make_record(median_s=55 * US, seed=20), entry_of())
    part = part_of(VerdictPart, v)
    assert part.failed is True
    assert part.message == v.reason


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"threshold": -0.1}, "threshold"), ({"alpha": 0.0}, "alpha"), ({"alpha": 1.5}, "alpha")],
)
def test_bad_settings_are_config_errors(kw: dict[str, float], match: str) -> None:
    with pytest.raises(KernelproConfigError, match=match):
        decide_verdict(make_record(), entry_of(), **kw)


def test_no_false_alarm_over_200_a_a_comparisons() -> None:
    """Same distribution, different draws: no kernel may fail (before confirmation even)."""
    entry = entry_of(noise=0.02)
    statuses = [
        decide_verdict(make_record(noise=0.02, seed=s), entry, threshold=0.05).status
        for s in range(200)
    ]
    assert statuses.count(REGRESSED) == 0
    assert statuses.count(OK) == 200


def test_detects_ten_percent_in_every_trial() -> None:
    entry = entry_of(noise=0.02)
    entries = [
        decide_verdict(
            make_record(median_s=55 * US, noise=0.02, seed=s), entry, threshold=0.05
        ).status
        for s in range(50)
    ]
    assert entries.count(REGRESSED) == 50
