"""A CPU kernel whose compulsory bytes beat its cached bandwidth ceiling: the ceilings are
re-probed before the kernel is blamed (measure/ceilings.py), the best of both kept and
cached, and the record says whether the ceilings behind the verdict are trusted
(`Ceilings.trusted`: a probe on a quiet machine, what the impossible-time rule may use)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FLUSHED_ENV, load_report, records_by_name

from pytest_kernelpro.measure import ceiling_probe as probe_module
from pytest_kernelpro.measure.ceilings import (
    CACHE_DIR_ENV,
    CACHE_SCHEMA,
    Ceilings,
    cache_path,
    resolve_device,
)

# 1e8 compulsory bytes (the marker's bytes=) in the ~1 ms the injected timer hands out:
# 100 GB/s, against a cached 10 GB/s bandwidth ceiling; the FLOPs are within every ceiling.
FAST = """
import pytest, torch
@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.randn(1000, device=device),),
                       flops=1e3, bytes=1e8)
def neg(x):
    return -x
"""


def _ceilings(bandwidth: float, *, passes: int = 3, quiet: int = 0) -> Ceilings:
    name = resolve_device("cpu")[1]
    return Ceilings(
        device=name,
        bandwidth_Bps=bandwidth,
        flops={"fp32": 1e12, "fp64": 5e11, "bf16": 1e12},
        source="measured",
        measured_at="2026-12-02T00:00:00+00:00",
        torch_version=torch.__version__,
        details={"probe_passes": passes, "threads": 1, "quiet_probes": quiet},
    )


class _QuietMonitor:
    """The re-probe's load monitor, seeing a quiet machine (this machine may be busy)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def stop(self) -> object:
        return type("Load", (), {"oversubscribed": False, "to_dict": lambda _s: {}})()


@pytest.fixture
def cpu_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project whose cached CPU ceilings are far too low (as measured under load), in a
    ceilings cache of its own. On the CPU on every host: the default device, auto, would
    take a visible CUDA GPU instead."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(pytester.path / "ceilings-cache"))
    pytester.makeini(
        """
        [pytest]
        kernelpro_device = cpu
        kernelpro_time_budget = 0.2
        kernelpro_warmup_ms = 1
        """
    )
    low = _ceilings(10e9)
    path = cache_path(pytester.path / "ceilings-cache", low.device, low.torch_version, False, 1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": CACHE_SCHEMA, "quick": False, "ceilings": low.to_dict()}))
    pytester.makepyfile(test_k=FAST)
    monkeypatch.setenv(FLUSHED_ENV, "1")  # inputs read from memory
    monkeypatch.setattr(probe_module, "CpuLoadMonitor", _QuietMonitor)
    return pytester


def _cached(pytester: pytest.Pytester) -> Ceilings:
    low = _ceilings(10e9)
    path = cache_path(pytester.path / "ceilings-cache", low.device, low.torch_version, False, 1)
    return Ceilings.from_dict(json.loads(path.read_text())["ceilings"])


def test_a_kernel_beyond_the_ceilings_gets_them_re_probed_before_it_is_blamed(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    probes: list[str] = []

    def probe(device: str, **kw: object) -> Ceilings:
        probes.append(device)
        return _ceilings(1e12)  # the machine, measured when the load let it

    monkeypatch.setattr(probe_module, "measure_ceilings", probe)
    result = cpu_project.runpytest()
    result.assert_outcomes(passed=1)
    assert probes == ["cpu"]  # re-probed once
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is True
    assert record["peak_used"] is None  # within the re-probed ceilings: nothing to blame
    cached = _cached(cpu_project)
    assert cached.bandwidth_Bps == 1e12  # the best of both, cached
    assert cached.trusted
    assert cached.details["reprobe_history"][-1]["why"] == "neg exceeded them"
    result.stdout.fnmatch_lines(["kernelpro: ceilings of cpu*re-probed (neg exceeded them)*"])
    assert any(
        "re-probed (neg exceeded them): bandwidth 10 GB/s -> 1 TB/s" in note
        for note in load_report(cpu_project)["meta"]["notes"]
    )


def test_ceilings_that_still_hold_after_a_quiet_re_probe_are_trusted_and_the_time_fails(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    # The new probe is lower still (more load): the old, higher ceilings are kept, trusted
    # (one probe ran quiet), and the kernel's compulsory bytes are impossible on them.
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, **kw: _ceilings(1e9))
    result = cpu_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*neg: impossible time*compulsory bytes*the ceilings were re-probed and still hold*"]
    )
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is True
    assert record["peak_used"]["problem"] == "bytes"
    assert "the ceilings were re-probed and still hold" in record["peak_used"]["note"]
    assert _cached(cpu_project).bandwidth_Bps == 10e9


def test_a_re_probe_on_a_busy_machine_blames_nothing(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    """Two probes under load agree on a ceiling: still not an upper bound (the unchanged
    matrix-vector product that beat a 13.8 GB/s ceiling both busy probes had measured)."""

    class Busy(_QuietMonitor):
        def stop(self) -> object:
            return type("Load", (), {"oversubscribed": True, "to_dict": lambda _s: {}})()

    monkeypatch.setattr(probe_module, "CpuLoadMonitor", Busy)
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, **kw: _ceilings(1e9))
    result = cpu_project.runpytest()
    result.assert_outcomes(passed=1)
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is False
    assert record["peak_used"]["problem"] == "bytes"  # named, not failed


def test_inputs_left_in_cache_are_never_impossible(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    """No flush and inputs inside the cache: moving them faster than DRAM is honest, and
    no re-probe is spent on it."""
    monkeypatch.delenv(FLUSHED_ENV)
    monkeypatch.setattr(probe_module, "measure_ceilings", pytest.fail)
    cpu_project.runpytest().assert_outcomes(passed=1)
    assert records_by_name(cpu_project)["neg"]["peak_used"]["problem"] == "bytes"


def test_a_ceilings_file_is_not_re_probed_and_an_exceedance_blames_the_ceilings_first(
    cpu_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    path = cpu_project.path / "ceilings.json"
    path.write_text(json.dumps(_ceilings(10e9).to_dict()))
    monkeypatch.setattr(probe_module, "measure_ceilings", pytest.fail)
    cpu_project.runpytest(f"--kernelpro-ceilings={path}").assert_outcomes(passed=1)
    record = records_by_name(cpu_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is False
    note = record["peak_used"]["note"]
    assert "could not be re-probed here: they may have been measured under load" in note
    assert "before suspecting the FLOP or byte count" in note


def test_trust_rules() -> None:
    fresh = _ceilings(1e11)
    assert not fresh.trusted
    assert fresh.trust_reason() == (
        "not trusted: best of 3 probes, none on a quiet machine (load only lowers a probe)"
    )
    assert _ceilings(1e11, quiet=1).trusted
    assert not _ceilings(1e11, passes=1, quiet=1).trusted
    gpu = Ceilings("NVIDIA H200", 4.8e12, {"fp32": 6e13}, "measured", "", "2.11")
    assert gpu.trusted
