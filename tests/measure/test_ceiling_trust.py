"""CPU ceilings that load cannot lower (measure/ceilings.py): the best of an old and a new
probe is kept; only a probe on a quiet machine makes them trusted (an upper bound the
impossible-time rule may use), re-probed or not; provisional ones never are."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.measure import ceiling_probe as probe_module
from pytest_kernelpro.measure.ceiling_probe import best_of, exceedance_note, reprobe
from pytest_kernelpro.measure.ceilings import Ceilings, measured_under_load

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
    new = cpu(143e9, 12e9, quiet_probes=1)
    merged, rose = best_of(old, new)
    assert merged.flops["fp32"] == 143e9  # the new probe was faster
    assert merged.bandwidth_Bps == 20e9  # the old copy was faster: load only lowers a probe
    assert rose == ["fp32 45 GFLOP/s -> 143 GFLOP/s", "fp64 22.5 GFLOP/s -> 71.5 GFLOP/s"]
    assert merged.details["probe_passes"] == 6
    assert merged.details["reprobes"] == 1
    assert "not_cached" not in merged.details
    assert merged.trusted
    assert merged.trust_reason() == (
        "trusted: best of 6 probes, 1 on a quiet machine, re-probed 1 time(s)"
    )
    assert measured_under_load(merged) is None  # the best of two is no longer provisional


def test_probes_all_taken_under_load_are_never_trusted_however_often_re_probed() -> None:
    """The unchanged matrix-vector product that moved 15.5 GB/s against a 13.8 GB/s
    ceiling two busy probes had agreed on: a ceiling only ever probed under load is not
    known to be an upper bound."""
    merged = cpu(45e9, 13.8e9, load=UNDER_LOAD)
    for _ in range(3):
        merged, _ = best_of(merged, cpu(44e9, 13.5e9, load=UNDER_LOAD, quiet_probes=0))
    assert merged.details["reprobes"] == 3
    assert not merged.trusted
    assert "none on a quiet machine" in merged.trust_reason()


def test_provisional_and_fresh_ceilings_are_not_trusted() -> None:
    provisional = cpu(45e9, 20e9, load=UNDER_LOAD, not_cached="provisional: measured under load")
    assert not provisional.trusted
    assert "provisional, measured under load" in provisional.trust_reason()
    assert "could not be re-probed here" in exceedance_note(provisional)
    one_probe = cpu(143e9, 20e9, probe_passes=1, reprobes=3)
    assert not one_probe.trusted  # an older version's single probe


class _Quiet:
    """A load monitor that saw the machine quiet (or busy) during the probe."""

    busy = False

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def stop(self) -> object:
        busy = self.busy
        return type(
            "Load", (), {"oversubscribed": busy, "to_dict": lambda _s: {"oversubscribed": busy}}
        )()


def test_reprobe_writes_the_best_of_both_to_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(probe_module, "CpuLoadMonitor", _Quiet)
    old = cpu(45e9, 20e9)
    old = Ceilings(**{**old.__dict__, "torch_version": torch.__version__})
    fresh = Ceilings(**{**cpu(143e9, 12e9).__dict__, "torch_version": torch.__version__})
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, quick: fresh)
    merged = reprobe(old, "cpu", tmp_path, why="k exceeded them")
    assert merged.trusted
    assert merged.details["reprobe_history"][-1] == {
        "at": merged.details["reprobe_history"][-1]["at"],
        "why": "k exceeded them",
        "rose": ["fp32 45 GFLOP/s -> 143 GFLOP/s", "fp64 22.5 GFLOP/s -> 71.5 GFLOP/s"],
    }
    (written,) = tmp_path.glob("ceilings-*.json")
    assert '"reprobes": 1' in written.read_text()
    assert "the ceilings were re-probed and still hold" in exceedance_note(merged)


def test_a_re_probe_under_load_does_not_make_ceilings_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    busy = type("Busy", (_Quiet,), {"busy": True})
    monkeypatch.setattr(probe_module, "CpuLoadMonitor", busy)
    old = Ceilings(**{**cpu(45e9, 20e9).__dict__, "torch_version": torch.__version__})
    fresh = Ceilings(**{**cpu(143e9, 12e9).__dict__, "torch_version": torch.__version__})
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, quick: fresh)
    merged = reprobe(old, "cpu", tmp_path, why="k exceeded them")
    assert merged.details["reprobes"] == 1
    assert merged.details["quiet_probes"] == 0
    assert not merged.trusted


def test_gpu_ceilings_are_never_re_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_module, "measure_ceilings", pytest.fail)
    gpu = Ceilings("NVIDIA H200", 4.8e12, {"fp32": 6e13}, "measured", "", "2.11")
    assert reprobe(gpu, "cuda", tmp_path, why="x") is gpu
