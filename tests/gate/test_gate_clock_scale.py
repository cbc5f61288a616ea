"""The gate for power-capped kernels: the baseline keeps the clock its samples ran at, and a
comparison with the clock held down by a limit gets a wider tolerance."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from gate_factories import make_record

from pytest_kernelpro.gate.baseline import BaselineEntry, load_baseline
from pytest_kernelpro.gate.baseline_save import entry_from_record, save_baseline
from pytest_kernelpro.gate.confirmation import confirm
from pytest_kernelpro.gate.verdict import REGRESSED, decide_verdict
from pytest_kernelpro.record import KernelRecord

US = 1e-6


def capped(
    median_s: float,
    sm_mhz: float,
    *,
    seed: int,
    bound: str = "compute",
    share: float = 1.0,
    max_sm_mhz: float | None = None,
) -> KernelRecord:
    """A GEMM-like record timed with the clock set by the power cap (`share` of its samples)."""
    record = make_record("gemm[4096]", median_s=median_s, seed=seed, bound=bound, noise=0.004)
    assert record.timing is not None
    n = len(record.timing.samples_s)
    record.timing = msgspec.structs.replace(
        record.timing,
        clocks={"sm_mhz_mean": sm_mhz, "reasons_seen": ["sw_power_cap"], "max_sm_mhz": max_sm_mhz},
        throttled_samples=round(share * n),
    )
    return record


def entry_from(record: KernelRecord) -> BaselineEntry:
    entry = entry_from_record(record)
    assert entry is not None
    return entry


def test_the_baseline_keeps_the_clock_and_only_when_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "baseline.yaml"
    gpu = capped(200 * US, 1575.0, seed=10)
    cpu = make_record("add[cpu]", seed=11, device="cpu (x86_64, 2 threads)")
    save_baseline(path, [gpu, cpu], commit="abc")
    text = path.read_text()
    assert text.count("sm_mhz:") == 1
    loaded = load_baseline(path)
    entry = loaded.entries[gpu.nodeid]
    assert entry.sm_mhz == pytest.approx(1575.0)
    assert entry.clock_capped_share == pytest.approx(1.0)
    assert entry.bound == "compute"
    assert loaded.entries[cpu.nodeid].sm_mhz is None


def test_a_clock_held_down_by_the_cap_widens_the_tolerance_to_three_thresholds() -> None:
    """4% slower at 1568 of 1980 MHz: beyond 2%, within 6%: suspect, not a failure; 8%
    slower still fails."""
    entry = entry_from(capped(1600 * US, 1575.0, seed=20, max_sm_mhz=1980.0))
    now = capped(1600 * US * 1.04, 1568.0, seed=21, max_sm_mhz=1980.0)
    verdict = decide_verdict(now, entry, threshold=0.02)
    assert verdict.status == "suspect"
    assert verdict.tolerance == pytest.approx(0.06)
    assert verdict.clock_limited is not None
    assert "1568 of 1980 MHz in this run" in verdict.clock_limited
    assert "1575 of 1980 MHz in the baseline" in verdict.clock_limited
    assert "tolerance 3x the threshold" in verdict.basis
    assert "within the 6% allowed" in verdict.reason
    assert not verdict.failed
    slow = decide_verdict(capped(1600 * US * 1.08, 1568.0, seed=22, max_sm_mhz=1980.0), entry,
                   threshold=0.02)  # fmt: skip
    assert slow.status == REGRESSED
    final = confirm(slow, capped(1600 * US * 1.08, 1560.0, seed=23, max_sm_mhz=1980.0), entry)
    assert final.status == REGRESSED


def test_a_capped_kernel_near_its_maximum_clock_keeps_the_threshold() -> None:
    """A convolution at 1965 of 1980 MHz under the power cap: its time does not move with
    the cap (0.3% A/A spread on the H200), so 4% slower is a regression."""
    entry = entry_from(capped(300 * US, 1965.0, seed=24, max_sm_mhz=1980.0))
    verdict = decide_verdict(
        capped(312 * US, 1965.0, seed=25, max_sm_mhz=1980.0), entry, threshold=0.02
    )
    assert verdict.clock_limited is None
    assert verdict.tolerance == pytest.approx(0.02)
    assert verdict.status == REGRESSED
