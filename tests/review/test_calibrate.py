"""`kernelpro calibrate`: the ceilings re-measured for real on this machine's CPU (quick sizes),
cached, printed as a table or JSON; its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure import ceiling_probe as probe_module  # noqa: E402
from pytest_kernelpro.measure.ceilings import Ceilings, cache_path, format_rate, resolve_device  # noqa: E402
from pytest_kernelpro.measure.timing.cpu_load import CpuLoad  # noqa: E402
from pytest_kernelpro.review.calibrate import calibrate_main  # noqa: E402


class _FixedLoadMonitor:
    """Reports a fixed CPU load: whether the ceilings are kept must not depend on the load of
    the machine running the tests."""

    others_cores = 0.0

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def stop(self) -> CpuLoad:
        return CpuLoad(cores=2, cpus=2, threads=1, others_cores=self.others_cores,
                       loadavg_1m=None, runnable_threads=None, wall_s=1.0)  # fmt: skip


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> type[_FixedLoadMonitor]:
    monkeypatch.setattr(probe_module, "CpuLoadMonitor", _FixedLoadMonitor)
    monkeypatch.setattr(_FixedLoadMonitor, "others_cores", 0.0)
    monkeypatch.setattr(probe_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    return _FixedLoadMonitor


def _path(tmp_path: Path, name: str, threads: int) -> Path:
    return cache_path(tmp_path, name, torch.__version__, True, threads)


def test_calibrate_prints_table_and_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = calibrate_main(["--device", "cpu", "--quick", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    _, name, _ = resolve_device("cpu")
    cached = Ceilings.from_dict(json.loads(_path(tmp_path, name, 1).read_text())["ceilings"])
    assert name in out
    assert format_rate(cached.bandwidth_Bps, "B/s") in out
    for key in ("fp32", "fp64", "bf16"):
        assert format_rate(cached.flops[key], "FLOP/s") in out
    assert "cached in" in out


def test_calibrate_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        calibrate_main(["--device", "cpu", "--quick", "--json", "--cache-dir", str(tmp_path)]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    out_file = tmp_path / "ceilings.json"
    assert calibrate_main(["--device", "cpu", "--quick", "--json", "--out", str(out_file),
                           "--cache-dir", str(tmp_path)]) == 0  # fmt: skip
    capsys.readouterr()
    assert Ceilings.from_dict(json.loads(out_file.read_text())).device == data["device"]
    assert data["device"].startswith("cpu (")
    assert data["bandwidth_Bps"] > 0
    assert calibrate_main(["--device", "tpu", "--cache-dir", str(tmp_path)]) == 2
    assert "device 'tpu' is not 'cpu', 'cuda' or 'cuda:N'" in capsys.readouterr().err
    assert calibrate_main(["--bogus"]) == 2


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without a GPU"
)
def test_calibrate_cuda_without_gpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert calibrate_main(["--device", "cuda", "--cache-dir", str(tmp_path)]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err


def test_calibrate_on_a_busy_machine_exits_1_and_says_the_ceilings_are_provisional(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet_machine: type[_FixedLoadMonitor]
) -> None:
    quiet_machine.others_cores = 1.9  # other processes took 1.9 of the 2 cores
    rc = calibrate_main(["--device", "cpu", "--quick", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "only until a quiet session re-measures them; re-run on a quiet machine" in out
    assert "cached in" not in out
