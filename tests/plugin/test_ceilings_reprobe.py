"""A CPU kernel faster than its cached ceilings allow: the ceilings are re-probed before the
kernel's FLOP count is blamed (measure/ceilings.py), the best of both kept and cached,
and the record says whether the ceilings behind the verdict are trusted (`Ceilings.trusted`,
what the impossible-time rule may use)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_report, records_by_name

from pytest_kernelpro.measure import ceilings as ceilings_module
from pytest_kernelpro.measure.ceilings import CACHE_SCHEMA, Ceilings, cache_path, resolve_device

# 1e9 FLOPs in the ~1 ms the injected timer hands out: 1e12 FLOP/s.
FAST = """
import pytest, torch
@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.randn(1000, device=device),),
                       flops=1e9, bytes=8000)
def neg(x):
    return -x
"""


def _ceilings(fp32: float, *, passes: int = 3) -> Ceilings:
    name = resolve_device("cpu")[1]
    return Ceilings(
        device=name,
        bandwidth_Bps=10e9,
        flops={"fp32": fp32, "fp64": fp32 / 2, "bf16": fp32},
        source="measured",
        measured_at="2026-12-02T00:00:00+00:00",
        torch_version=torch.__version__,
        details={"probe_passes": passes, "threads": 1},
    )


@pytest.fixture
def cpu_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project whose cached CPU ceilings are far too low (as measured under load). On the
    CPU on every host: the default device, auto, would take a visible CUDA GPU instead."""
    pytester.makeini(
        """
        [pytest]
        kernelpro_device = cpu
        kernelpro_time_budget = 0.2
        kernelpro_warmup_ms = 1
        """
    )
    low = _ceilings(1e10)
    path = cache_path(
        pytester.path / ".kernelpro" / "cache", low.device, low.torch_version, False, 1
    )
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": CACHE_SCHEMA, "quick": False, "ceilings": low.to_dict()}))
    pytester.makepyfile(test_k=FAST)
    return pytester


def _cached(pytester: pytest.Pytester) -> Ceilings:
    low = _ceilings(1e10)
    path = cache_path(
        pytester.path / ".kernelpro" / "cache", low.device, low.torch_version, False, 1
    )
    return Ceilings.from_dict(json.loads(path.read_text())["ceilings"])


def test_a_kernel_beyond_the_ceilings_gets_them_re_probed_not_its_flop_count_blamed(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    probes: list[str] = []

    def probe(device: str, **kw: object) -> Ceilings:
        probes.append(device)
        return _ceilings(1e13)  # the machine, measured when the load let it

    monkeypatch.setattr(ceilings_module, "measure_ceilings", probe)
    result = cpu_project.runpytest()
    result.assert_outcomes(passed=1)
    assert probes == ["cpu"]  # re-probed once
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is True
    assert record["peak_used"] is None  # within the re-probed ceilings: nothing to blame
    assert record["efficiency"] == pytest.approx(1e9 / 1e13 / injected_timing[0])
    cached = _cached(cpu_project)
    assert cached.flops["fp32"] == 1e13  # the best of both, cached
    assert cached.trusted
    assert cached.details["reprobe_history"][-1]["why"] == "neg exceeded them"
    result.stdout.fnmatch_lines(["kernelpro: ceilings of cpu*re-probed (neg exceeded them)*(-v)"])
    assert any(
        "re-probed (neg exceeded them): fp32 10 GFLOP/s -> 10 TFLOP/s" in note
        for note in load_report(cpu_project)["meta"]["notes"]
    )


def test_ceilings_that_still_hold_after_the_re_probe_are_trusted_and_load_is_not_blamed(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    # The new probe is lower still (more load): the old, higher ceilings are kept, trusted,
    # and the kernel's time is impossible on them (measure/roofline.py fails the item).
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: _ceilings(1e9))
    result = cpu_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*neg: impossible time*the ceilings were re-probed and still hold*"]
    )
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is True
    assert record["peak_used"]["problem"] == "flops"
    assert "the ceilings were re-probed and still hold" in record["peak_used"]["note"]
    assert _cached(cpu_project).flops["fp32"] == 1e10


def test_a_ceilings_file_is_not_re_probed_and_an_exceedance_blames_the_ceilings_first(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    path = cpu_project.path / "ceilings.json"
    path.write_text(json.dumps(_ceilings(1e10).to_dict()))
    monkeypatch.setattr(ceilings_module, "measure_ceilings", pytest.fail)
    cpu_project.runpytest(f"--kernelpro-ceilings={path}").assert_outcomes(passed=1)
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is False
    note = record["peak_used"]["note"]
    assert "could not be re-probed here: they may have been measured under load" in note
    assert "before suspecting the FLOP or byte count" in note


def test_trust_rules() -> None:
    fresh = _ceilings(1e11)
    assert not fresh.trusted
    assert fresh.trust_reason() == "not trusted: best of 3 probes, not re-probed yet"
    assert not _ceilings(1e11, passes=1).trusted
    gpu = Ceilings("NVIDIA H200", 4.8e12, {"fp32": 6e13}, "measured", "", "2.11")
    assert gpu.trusted
