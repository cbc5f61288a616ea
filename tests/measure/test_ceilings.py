"""Ceilings measured for real on this machine's CPU (quick sizes), and their cache."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.errors import KernelproError, KernelproWarning  # noqa: E402
from pytest_kernelpro.measure import ceiling_probe as probe_module  # noqa: E402
from pytest_kernelpro.measure.ceiling_probe import load_or_measure_ceilings, measure_ceilings  # noqa: E402
from pytest_kernelpro.measure.ceilings import (  # noqa: E402
    CACHE_SCHEMA,
    Ceilings,
    cache_path,
    combine_with_spec,
    format_rate,
    resolve_device,
)
from pytest_kernelpro.measure.devices import find_device_spec  # noqa: E402
from pytest_kernelpro.measure.timing.cpu_load import CpuLoad  # noqa: E402


@pytest.fixture(scope="module")
def cpu_quick() -> Ceilings:
    return measure_ceilings("cpu", quick=True)


@pytest.fixture
def probe_once(monkeypatch: pytest.MonkeyPatch, cpu_quick: Ceilings) -> Ceilings:
    """For the tests of the cache's rules: each probe returns this module's one real quick
    measurement (as measured now), instead of probing the machine again (seconds each, tens
    under load). What a probe measures is checked by the tests that call `measure_ceilings`."""

    def probe(device: str, **kwargs: object) -> Ceilings:
        assert device == "cpu"
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return replace(cpu_quick, measured_at=now, details=dict(cpu_quick.details))

    monkeypatch.setattr(probe_module, "measure_ceilings", probe)
    return cpu_quick


def _load(oversubscribed: bool) -> CpuLoad:
    others = 1.9 if oversubscribed else 0.0
    return CpuLoad(cores=2, cpus=2, threads=1, others_cores=others, loadavg_1m=None,
                   runnable_threads=None, wall_s=1.0)  # fmt: skip


class _FakeMonitor:
    """Reports a fixed CPU load: the cache tests must not depend on the machine's load."""

    oversubscribed = False

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def stop(self) -> CpuLoad:
        return _load(self.oversubscribed)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> type[_FakeMonitor]:
    monkeypatch.setattr(probe_module, "CpuLoadMonitor", _FakeMonitor)
    monkeypatch.setattr(_FakeMonitor, "oversubscribed", False)
    # The load average is the machine's; here "quiet" is what the fake monitor says.
    monkeypatch.setattr(probe_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    return _FakeMonitor


def test_quiet_now_needs_a_low_load_average_and_a_quiet_look(
    monkeypatch: pytest.MonkeyPatch, quiet_machine: type[_FakeMonitor]
) -> None:
    assert probe_module.quiet_now(1, seconds=0.0) is True
    quiet_machine.oversubscribed = True
    assert probe_module.quiet_now(1, seconds=0.0) is False
    quiet_machine.oversubscribed = False
    cpus = probe_module.os.cpu_count() or 1
    monkeypatch.setattr(probe_module.os, "getloadavg", lambda: (float(cpus), 0.0, 0.0))
    assert probe_module.quiet_now(1, seconds=0.0) is False


def _path(tmp_path: Path, name: str, threads: int | None = None) -> Path:
    return cache_path(tmp_path, name, torch.__version__, True, threads or torch.get_num_threads())


def test_ceilings_measured_under_load_are_provisional_until_a_quiet_session(
    tmp_path: Path,
    quiet_machine: type[_FakeMonitor],
    monkeypatch: pytest.MonkeyPatch,
    probe_once: Ceilings,
) -> None:
    measured: list[str] = []
    real_measure = probe_module.measure_ceilings

    def counting_measure(*args: object, **kwargs: object) -> Ceilings:
        measured.append("x")
        return real_measure(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(probe_module, "measure_ceilings", counting_measure)
    quiet_machine.oversubscribed = True
    lines: list[str] = []
    busy = load_or_measure_ceilings("cpu", tmp_path, quick=True, progress=lines.append)
    assert busy.details["not_cached"].startswith("provisional: measured under load")
    assert lines
    assert lines[0].startswith(f"kernelpro: measuring the ceilings of {busy.device}")
    path = _path(tmp_path, busy.device)
    assert json.loads(path.read_text())["ceilings"]["details"]["load"]["oversubscribed"] is True
    # Still busy: the provisional numbers are used, not re-measured, and still named so.
    again = load_or_measure_ceilings("cpu", tmp_path, quick=True)
    assert measured == ["x"]
    assert again.bandwidth_Bps == busy.bandwidth_Bps
    assert "provisional" in again.details["not_cached"]
    # Quiet: re-measured, cached for good.
    quiet_machine.oversubscribed = False
    good = load_or_measure_ceilings("cpu", tmp_path, quick=True)
    assert measured == ["x", "x"]
    assert "not_cached" not in good.details
    assert json.loads(path.read_text())["ceilings"]["details"]["load"]["oversubscribed"] is False


def test_cpu_ceilings_are_cached_per_thread_count(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = load_or_measure_ceilings("cpu", tmp_path, quick=True)
        assert _path(tmp_path, one.device, 1).exists()
        assert one.details["threads"] == 1
        assert not _path(tmp_path, one.device, 2).exists()
    finally:
        torch.set_num_threads(before)


def test_cpu_ceilings_are_measured_and_plausible(cpu_quick: Ceilings) -> None:
    c = cpu_quick
    assert c.device.startswith("cpu (")
    assert c.device_type == "cpu"
    assert c.source == "measured"
    assert c.torch_version == torch.__version__
    datetime.fromisoformat(c.measured_at)
    # a 64 MiB copy on any CPU of the last decade: 0.5 to 500 GB/s (bytes read + written)
    assert 5e8 < c.bandwidth_Bps < 5e11
    assert c.details["copy"]["bytes_moved"] == 2 * (64 << 20)
    assert set(c.flops) == {"fp32", "fp64", "bf16"}
    for key, rate in c.flops.items():
        assert 1e7 < rate < 1e14, key  # 10 MFLOP/s .. 100 TFLOP/s
        assert c.origin(key) == "measured"
        gemm = c.details["gemm"][key]
        # CPU ceilings come from the fastest run (stalls of a busy host only slow runs down)
        assert gemm["statistic"] == "min"
        assert rate == 2 * gemm["n"] ** 3 / min(gemm["times_s"])
        assert len(gemm["times_s"]) == 5
    assert c.origin("bf16_tensor") == "missing"


def test_round_trip_and_validation(cpu_quick: Ceilings) -> None:
    assert Ceilings.from_dict(json.loads(json.dumps(cpu_quick.to_dict()))) == cpu_quick
    data = cpu_quick.to_dict()
    del data["bandwidth_Bps"]
    with pytest.raises(KernelproError, match="malformed"):
        Ceilings.from_dict(data)
    with pytest.raises(KernelproError, match="bandwidth_Bps=-1.0 must be a positive"):
        Ceilings("cpu (x)", -1.0, {"fp32": 1.0}, "measured", "t", "v", {})
    with pytest.raises(KernelproError, match="flops\\['fp32'\\]=0.0"):
        Ceilings("cpu (x)", 1.0, {"fp32": 0.0}, "measured", "t", "v", {})


def test_spec_fills_what_was_not_measured() -> None:
    spec = find_device_spec("NVIDIA H200")
    assert spec is not None
    measured = {"bf16_tensor": 790e12, "fp32": 51e12}
    c = combine_with_spec("NVIDIA H200", 4.3e12, measured, spec, {}, "t", "2.11")
    assert c.source == "measured+datasheet"
    assert c.flops["bf16_tensor"] == 790e12
    assert c.origin("bf16_tensor") == "measured"
    assert c.flops["fp8_tensor"] == spec.peak_flops["fp8_tensor"]
    assert c.origin("fp8_tensor") == "datasheet"
    assert c.bandwidth_Bps == 4.3e12
    no_copy = combine_with_spec("NVIDIA H200", None, measured, spec, {}, "t", "2.11")
    assert no_copy.bandwidth_Bps == 4.8e12
    assert no_copy.details["bandwidth_origin"] == "datasheet"
    with pytest.raises(KernelproError, match="could neither be measured nor found"):
        combine_with_spec("NVIDIA X", None, measured, None, {}, "t", "2.11")


def test_cache_round_trip(tmp_path: Path, probe_once: Ceilings) -> None:
    first = load_or_measure_ceilings("cpu", tmp_path, quick=True)
    path = _path(tmp_path, first.device)
    record = json.loads(path.read_text())
    assert record["schema"] == CACHE_SCHEMA
    assert record["ceilings"]["device"] == first.device
    # Doctor the cached bandwidth: a second call must return the cached value, not measure.
    record["ceilings"]["bandwidth_Bps"] = 123.0
    path.write_text(json.dumps(record))
    assert load_or_measure_ceilings("cpu", tmp_path, quick=True).bandwidth_Bps == 123.0
    refreshed = load_or_measure_ceilings("cpu", tmp_path, quick=True, refresh=True)
    assert refreshed.bandwidth_Bps > 5e8
    assert json.loads(path.read_text())["ceilings"]["bandwidth_Bps"] == refreshed.bandwidth_Bps


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"schema": 99, "ceilings": {}}), json.dumps({"schema": CACHE_SCHEMA})],
    ids=["garbage", "old-schema", "no-ceilings"],
)
def test_corrupt_cache_warns_and_remeasures(
    tmp_path: Path, content: str, probe_once: Ceilings
) -> None:
    _, name, _ = resolve_device("cpu")
    path = _path(tmp_path, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    with pytest.warns(KernelproWarning, match="ignoring ceilings cache"):
        c = load_or_measure_ceilings("cpu", tmp_path, quick=True)
    assert c.bandwidth_Bps > 5e8
    assert Ceilings.from_dict(json.loads(path.read_text())["ceilings"]) == c


def test_cache_of_another_device_is_not_trusted(tmp_path: Path, probe_once: Ceilings) -> None:
    cpu_quick = probe_once
    path = _path(tmp_path, cpu_quick.device)
    other = {**cpu_quick.to_dict(), "device": "cpu (some other model)"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": CACHE_SCHEMA, "ceilings": other}))
    with pytest.warns(KernelproWarning, match="holds 'cpu \\(some other model\\)'"):
        c = load_or_measure_ceilings("cpu", tmp_path, quick=True)
    assert c.device == cpu_quick.device


@pytest.mark.parametrize("legacy", [False, True])
def test_the_gemm_probes_tf32_setting_is_restored_after_its_block(
    legacy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU probe's TF32 switch sets one of torch's two flag APIs (the newer where it
    exists, never a mix) for its block, and restores what it found, even on an error."""
    import torch

    matmul = torch.backends.cuda.matmul
    if legacy:  # a torch before fp32_precision: a stand-in with the legacy flag only
        matmul = type("LegacyMatmul", (), {"allow_tf32": False})()
        monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    flag, on, off = ("allow_tf32", True, False) if legacy else ("fp32_precision", "tf32", "ieee")
    before = getattr(matmul, flag)
    with probe_module._matmul_tf32(True):
        assert getattr(matmul, flag) == on
    assert getattr(matmul, flag) == before
    seen = []

    def failed_gemm() -> None:
        with probe_module._matmul_tf32(False):
            seen.append(getattr(matmul, flag))
            raise RuntimeError("a failed GEMM")

    with pytest.raises(RuntimeError):
        failed_gemm()
    assert seen == [off]
    assert getattr(matmul, flag) == before


def test_format_rate() -> None:
    assert format_rate(788e12, "FLOP/s") == "788 TFLOP/s"
    assert format_rate(4.3e12, "B/s") == "4.3 TB/s"
    assert format_rate(2.25e15, "FLOP/s") == "2.25 PFLOP/s"
    assert format_rate(12.0, "B/s") == "12 B/s"


@pytest.mark.gpu
def test_gpu_ceilings_quick() -> None:
    c = measure_ceilings("cuda", quick=True)
    assert c.device_type == "cuda"
    assert {"bf16_tensor", "fp16_tensor", "tf32_tensor", "fp32"} <= {
        k for k in c.flops if c.origin(k) == "measured"
    }
    # tensor cores beat the CUDA-core fp32 GEMM; TF32 sits between
    assert c.flops["bf16_tensor"] > c.flops["tf32_tensor"] > c.flops["fp32"]
    spec = find_device_spec(c.device)
    if spec is not None:  # measured ceilings stay below the datasheet, within reason
        assert 0.4 * spec.dram_bandwidth_Bps < c.bandwidth_Bps < 1.05 * spec.dram_bandwidth_Bps
        assert (
            0.3 * spec.peak_flops["bf16_tensor"]
            < c.flops["bf16_tensor"]
            < 1.05 * spec.peak_flops["bf16_tensor"]
        )
