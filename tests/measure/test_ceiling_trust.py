"""CPU ceilings that load cannot lower (measure/ceilings.py): the best of an old and a new
probe is kept, a re-probe makes them trusted, and provisional ones never are."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.measure.ceilings import (
    Ceilings,
    best_of,
    exceedance_note,
    measured_under_load,
    reprobe,
)

UNDER_LOAD = {"oversubscribed": True, "reasons": ["other processes used 1.9 of 2 core(s)"]}


def cpu(fp32: float, bandwidth: float, **details: object) -> Ceilings:
    return Ceilings(
        device="cpu (AMD EPYC)",
        bandwidth_Bps=bandwidth,
        flops={"fp32": fp32, "fp64": fp32 / 2},
        source="measured",
        measured_at="2026-12-02T03:00:00+00:00",
        torch_version="2.13.0+cpu",
        details={"probe_passes": 3, **details},
    )


def test_each_ceiling_keeps_the_best_probe_and_says_what_rose() -> None:
    old = cpu(45e9, 20e9, load=UNDER_LOAD, not_cached="provisional: measured under load")
    new = cpu(143e9, 12e9)
    merged, rose = best_of(old, new)
    assert merged.flops["fp32"] == 143e9  # the new probe was faster
    assert merged.bandwidth_Bps == 20e9  # the old copy was faster: load only lowers a probe
    assert rose == ["fp32 45 GFLOP/s -> 143 GFLOP/s", "fp64 22.5 GFLOP/s -> 71.5 GFLOP/s"]
    assert merged.details["probe_passes"] == 6
    assert merged.details["reprobes"] == 1
    assert "not_cached" not in merged.details
    assert merged.trusted
    assert measured_under_load(merged) is None  # the best of two is no longer provisional


def test_provisional_and_fresh_ceilings_are_not_trusted() -> None:
    provisional = cpu(45e9, 20e9, load=UNDER_LOAD, not_cached="provisional: measured under load")
    assert not provisional.trusted
    assert "provisional, measured under load" in provisional.trust_reason()
    assert "could not be re-probed here" in exceedance_note(provisional)
    one_probe = cpu(143e9, 20e9, probe_passes=1, reprobes=3)
    assert not one_probe.trusted  # an older version's single probe


def test_reprobe_writes_the_best_of_both_to_the_cache(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    old = cpu(45e9, 20e9)
    old = Ceilings(**{**old.__dict__, "torch_version": torch.__version__})
    fresh = Ceilings(**{**cpu(143e9, 12e9).__dict__, "torch_version": torch.__version__})
    merged = reprobe(
        old, "cpu", tmp_path, why="k exceeded them", measure=lambda device, quick: fresh
    )
    assert merged.trusted
    assert merged.details["reprobe_history"][-1] == {
        "at": merged.details["reprobe_history"][-1]["at"],
        "why": "k exceeded them",
        "rose": ["fp32 45 GFLOP/s -> 143 GFLOP/s", "fp64 22.5 GFLOP/s -> 71.5 GFLOP/s"],
    }
    (written,) = tmp_path.glob("ceilings-*.json")
    assert '"reprobes": 1' in written.read_text()
    assert "the ceilings were re-probed and still hold" in exceedance_note(merged)


def test_gpu_ceilings_are_never_re_probed(tmp_path: Path) -> None:
    gpu = Ceilings("NVIDIA H200", 4.8e12, {"fp32": 6e13}, "measured", "", "2.11")
    assert reprobe(gpu, "cuda", tmp_path, why="x", measure=pytest.fail) is gpu
