"""The verdict's two steps on their own: `verdict_basis.choose_basis` (which time is compared,
its baseline side, its label, the factors applied and why) and `verdict.decide_change` (the
status on a given basis), and the module layout that keeps the basis in one place without an
import cycle through the baseline."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
from gate_factories import make_record
from test_gate_clock_anchor import capped, entry_from
from test_gate_cpu_anchor import MS, cpu_record, entry

import pytest_kernelpro
from pytest_kernelpro.gate.baseline import (
    BaselineEntry,
    Basis,
    Incomparable,
    anchor_of_timing,
    record_cpu_anchor,
)
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.clock_basis import ANCHOR_THRESHOLD_FACTOR, CLOCK_LIMITED_FACTOR
from pytest_kernelpro.gate.verdict import (
    IMPROVED,
    OK,
    REGRESSED,
    SUSPECT,
    UNRESOLVED,
    decide_change,
    decide_verdict,
)
from pytest_kernelpro.gate.verdict_basis import choose_basis
from pytest_kernelpro.record import KernelRecord

US = 1e-6
GATE = Path(pytest_kernelpro.__file__).resolve().parent / "gate"


def basis_of(record: KernelRecord, base: BaselineEntry, **options: object) -> Basis:
    samples = list(record.timing.samples_s) if record.timing else []
    chosen = choose_basis(record, base, samples, threshold=0.05, cross_tolerance=0.15, **options)  # type: ignore[arg-type]
    assert isinstance(chosen, Basis), chosen
    return chosen


# Choosing the basis.


def test_a_steady_gpu_kernel_is_compared_on_its_wall_times() -> None:
    base = entry_from_record(make_record(seed=1))
    assert base is not None
    chosen = basis_of(make_record(seed=2, median_s=55e-6), base)
    assert chosen.text == "time (same device: NVIDIA H200)"
    assert chosen.tolerance == 0.05
    assert chosen.gated_label is None  # the wall medians decide: nothing relabelled
    assert chosen.ref == list(base.samples_s)
    assert chosen.ratio == pytest.approx(1.1, rel=0.01)


def test_a_cpu_kernel_with_pairs_on_both_sides_is_read_against_the_cpu_anchor() -> None:
    base = entry(cpu_record(1 * MS, seed=1))
    chosen = basis_of(cpu_record(2 * MS, seed=2, wall_factor=3.0), base)
    assert chosen.text.startswith("on-CPU time checked against the CPU anchor")
    assert chosen.gated_label in ("on-CPU", "on-CPU, anchor-scaled")
    assert chosen.load_cancelled
    # The compared ratio is the on-CPU one (about 2x), not the wall time's (about 6x).
    assert chosen.ratio == pytest.approx(2.0, rel=0.15)
    assert chosen.raw_change == pytest.approx(5.0, rel=0.15)
    assert chosen.tolerance >= 0.25
    assert chosen.low_tolerance is not None


def test_a_cpu_baseline_without_pairs_falls_back_to_wall_times_and_says_why() -> None:
    base = entry(cpu_record(1 * MS, seed=1, anchor=None))
    chosen = basis_of(cpu_record(1 * MS, seed=2), base)
    assert "no CPU anchor: the baseline has no CPU-anchored samples" in chosen.text
    assert chosen.gated_label is None
    assert not chosen.load_cancelled


def test_a_capped_gpu_kernel_with_pairs_is_compared_relative_to_the_clock_anchor() -> None:
    base = entry_from(capped(200 * US, 1700.0, seed=1))
    chosen = basis_of(capped(200 * US, 1600.0, seed=2), base)
    assert chosen.text.startswith("time relative to the clock anchor")
    assert chosen.tolerance == pytest.approx(0.05 * ANCHOR_THRESHOLD_FACTOR)
    assert chosen.gated_label == "anchor-scaled"
    assert chosen.anchor is not None
    assert chosen.sm_mhz == 1600.0
    assert chosen.ratio == pytest.approx(1.0, abs=0.01)  # the clock cancelled


def test_a_capped_kernel_without_pairs_gets_the_wider_clock_limited_tolerance() -> None:
    base = entry_from(capped(200 * US, 1575.0, seed=1, anchored=False))
    chosen = basis_of(capped(200 * US, 1568.0, seed=2, anchored=False), base)
    assert chosen.tolerance == pytest.approx(0.05 * CLOCK_LIMITED_FACTOR)
    assert chosen.clock_limited is not None
    assert "1568 of 1980 MHz in this run" in chosen.clock_limited


def test_another_device_compares_time_relative_to_each_roofline() -> None:
    base = entry_from_record(make_record(seed=1, device="NVIDIA A100"))
    assert base is not None
    chosen = basis_of(make_record(seed=2), base)
    assert chosen.text == "efficiency (other device: NVIDIA A100 vs NVIDIA H200)"
    assert chosen.tolerance == 0.15
    assert chosen.gated_label == "roofline-scaled"


@pytest.mark.parametrize(
    ("base_device", "roofline", "why"),
    [
        ("NVIDIA A100", None, "has no roofline time"),
        ("cpu (Intel Xeon, 2 threads)", 30e-6, "another CPU or thread count"),
    ],
)
def test_what_cannot_gate_is_incomparable_with_the_reason(
    base_device: str, roofline: float | None, why: str
) -> None:
    base = entry_from_record(make_record(seed=1, device=base_device))
    assert base is not None
    now = make_record(seed=2, device="cpu (AMD EPYC, 1 thread)", roofline_time_s=roofline)
    chosen = choose_basis(now, base, list(now.timing.samples_s), threshold=0.05,  # type: ignore[union-attr]
                          cross_tolerance=0.15)  # fmt: skip
    assert isinstance(chosen, Incomparable)
    assert why in chosen.reason
    gated = choose_basis(now, base, list(now.timing.samples_s), threshold=0.05,  # type: ignore[union-attr]
                         cross_tolerance=0.15, cross_cpu="gate")  # fmt: skip
    assert isinstance(gated, Incomparable) == (roofline is None)


# Attacks on the readers: a timing dict the basis must not trust.


@pytest.mark.parametrize(
    "anchor",
    [
        {"name": "a", "anchor_median_s": float("nan"), "ratios": [1.0]},
        {"name": "a", "anchor_median_s": True, "ratios": [1.0]},
        {"name": "a", "anchor_median_s": "2e-4", "ratios": [1.0]},
        {"name": "", "anchor_median_s": 2e-4, "ratios": [1.0]},
        {"name": "a", "anchor_median_s": 2e-4, "ratios": [float("inf"), -1.0, True, "1"]},
        ["a", 2e-4, [1.0]],
    ],
)
def test_an_anchor_with_no_usable_pairs_reads_as_none(anchor: object) -> None:
    assert anchor_of_timing(anchor) is None


def test_bad_ratios_are_dropped_and_good_ones_kept() -> None:
    read = anchor_of_timing({"name": "a", "anchor_median_s": 2e-4, "ratios": [1.0, -2, "x", 1.5]})
    assert read is not None
    assert read.ratios == (1.0, 1.5)


def test_cpu_pairs_of_another_layout_are_not_read_as_cpu_anchored() -> None:
    record = cpu_record(1 * MS, seed=1)
    assert record.timing is not None
    assert isinstance(record.timing.anchor, dict)
    forged = msgspec.structs.replace(
        record.timing, anchor={**record.timing.anchor, "layout": "per-sample"}
    )
    assert record_cpu_anchor(msgspec.structs.replace(record, timing=forged)) is None


def test_an_entry_without_samples_cannot_be_forged_into_a_cpu_anchored_basis() -> None:
    """A baseline entry whose CPU pairs hold only non-positive values compares wall times."""
    base = entry(cpu_record(1 * MS, seed=1))
    base.cpu_kernel_s = [0.0, -1.0]
    chosen = basis_of(cpu_record(1 * MS, seed=2), base)
    assert "no CPU anchor" in chosen.text


# Deciding on a given basis.


def plain_basis(ratio: float, *, tolerance: float = 0.05, spread: float = 0.005) -> Basis:
    ref = [1.0 + spread * ((i % 21) - 10) / 10 for i in range(200)]
    return Basis(text="time (same device: x)", tolerance=tolerance, now=[v * ratio for v in ref],
                 ref=ref, ratio=ratio)  # fmt: skip


def test_a_clear_slowdown_beyond_the_tolerance_regresses() -> None:
    decided = decide_change(plain_basis(1.2), 0.05, 0.01, None, "NVIDIA H200")
    assert decided.status == REGRESSED
    assert decided.change == pytest.approx(0.2)
    assert decided.p_value < 0.01


def test_a_clear_speedup_is_improved() -> None:
    assert decide_change(plain_basis(0.8), 0.05, 0.01, None, "NVIDIA H200").status == IMPROVED


def test_a_slowdown_on_an_oversubscribed_cpu_is_suspect_unless_the_basis_cancels_load() -> None:
    busy = "other processes used 1.9 of 2 core(s)"
    assert decide_change(plain_basis(1.2), 0.05, 0.01, busy, "cpu").status == SUSPECT
    cancelled = replace(plain_basis(1.2), load_cancelled=True)
    assert decide_change(cancelled, 0.05, 0.01, busy, "cpu").status == REGRESSED


def test_an_unusable_anchor_never_lets_a_change_fail() -> None:
    unusable = replace(plain_basis(2.0), unusable="the CPU anchor shows the measurement unusable")
    decided = decide_change(unusable, 0.05, 0.01, None, "cpu")
    assert decided.status == SUSPECT
    assert "unusable" in decided.reason


def test_a_clock_limited_change_within_its_wider_tolerance_is_suspect() -> None:
    limited = replace(plain_basis(1.08, tolerance=0.15), clock_limited="SM clock held at ...")
    assert decide_change(limited, 0.05, 0.01, None, "NVIDIA H200").status == SUSPECT


def test_no_change_at_a_tolerance_too_wide_to_catch_1_5x_is_unresolved() -> None:
    decided = decide_change(plain_basis(1.0, tolerance=0.6), 0.05, 0.01, None, "cpu")
    assert decided.status == UNRESOLVED
    assert "1.5x" in decided.reason


def test_decide_verdict_is_the_basis_then_the_decision() -> None:
    base = entry(cpu_record(1 * MS, seed=1))
    now = cpu_record(2 * MS, seed=2)
    verdict = decide_verdict(now, base)
    chosen = basis_of(now, base)
    decided = decide_change(chosen, 0.05, 0.01, None, now.device)
    assert (verdict.change_status, verdict.change, verdict.p_value, verdict.reason) == (
        decided.status, decided.change, decided.p_value, decided.reason,
    )  # fmt: skip
    assert (verdict.basis, verdict.tolerance, verdict.gated_label) == (
        chosen.text, chosen.tolerance, chosen.gated_label,
    )  # fmt: skip
    assert verdict.status == REGRESSED
    assert decide_verdict(cpu_record(1 * MS, seed=3), base).status == OK


# The layout: one module chooses, the baseline does not reach it.


def _gate_imports(name: str) -> set[str]:
    """Every pytest_kernelpro.gate module `gate/<name>.py` imports, in any form (module level,
    inside functions, under TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse((GATE / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "pytest_kernelpro.gate."
        ):
            found.add(node.module.removeprefix("pytest_kernelpro.gate."))  # type: ignore[union-attr]
    return found


def test_the_baseline_does_not_import_the_rules() -> None:
    assert _gate_imports("baseline") & {"verdict_basis", "verdict", "confirmation"} == set()
    assert "verdict" not in _gate_imports("verdict_basis")
    for below in ("clock_basis", "other_device_basis"):
        assert _gate_imports(below) & {"verdict", "verdict_basis", "confirmation"} == set()


def test_the_basis_rules_have_one_home() -> None:
    # One module chooses (verdict_basis.py); the rules of a GPU under a clock limit
    # (clock_basis.py) and of a baseline from another device (other_device_basis.py) are
    # their own modules, which a CPU session against its own baseline never imports.
    for gone in ("clock_scale", "clock_anchor", "cpu_anchor", "compare"):
        assert not (GATE / f"{gone}.py").exists(), gone
    homes = {
        "def choose_basis": "verdict_basis.py",
        "def same_device_basis": "verdict_basis.py",
        "def cross_device_basis": "other_device_basis.py",
        "def cpu_anchor_missing": "verdict_basis.py",
        "def clock_basis": "clock_basis.py",
        "def clock_limit_text": "clock_basis.py",
        "def anchor_missing": "clock_basis.py",
    }
    found: dict[str, list[str]] = {chooser: [] for chooser in homes}
    for path in Path(pytest_kernelpro.__file__).resolve().parent.rglob("*.py"):
        text = path.read_text()
        for chooser in homes:
            if chooser + "(" in text:
                found[chooser].append(path.name)
    assert found == {chooser: [home] for chooser, home in homes.items()}
