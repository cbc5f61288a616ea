"""One ceilings probe at a time per cache folder (`ceiling_probe._probe_lock`): two processes
that find no cache at once (xdist workers, two CI jobs on one runner) must not probe side by
side, where each would measure the other as load; the one that waited uses what the first
wrote. Real processes and the real lock; the probe itself is a stand-in that records when it
ran (a real probe takes seconds and its load monitor decides caching on a busy machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROCESS = """
import sys, time
from pathlib import Path

from pytest_kernelpro.measure import ceiling_probe
from pytest_kernelpro.measure.ceilings import Ceilings, resolve_device
import torch

cache, log, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])


def stand_in_probe(device, **kw):
    with log.open("a") as f:
        f.write(f"start {time.monotonic()}\\n")
    time.sleep(0.5)
    with log.open("a") as f:
        f.write(f"end {time.monotonic()}\\n")
    return Ceilings(
        device=resolve_device("cpu")[1], bandwidth_Bps=1e10, flops={"fp32": 1e12},
        source="measured", measured_at="2026-12-05T00:00:00+00:00",
        torch_version=torch.__version__, details={"threads": torch.get_num_threads()},
    )


ceiling_probe.measure_ceilings = stand_in_probe
ceiling_probe._monitored = lambda measure, threads: measure()  # no load verdict: cached as is
ready.touch()
while len(list(ready.parent.glob("ready-*"))) < 2:  # both processes start the call together
    time.sleep(0.01)
ceilings = ceiling_probe.load_or_measure_ceilings("cpu", cache)
print("bandwidth", ceilings.bandwidth_Bps)
"""


def _intervals(log: Path) -> list[tuple[float, float]]:
    starts = [float(x.split()[1]) for x in log.read_text().splitlines() if x.startswith("start")]
    ends = [float(x.split()[1]) for x in log.read_text().splitlines() if x.startswith("end")]
    return sorted(zip(starts, ends, strict=True))


def _run_two(tmp_path: Path, folders: tuple[Path, Path], *, cache_nothing: bool = False) -> Path:
    """Two processes asking for the ceilings of `folders` at once; the log of their probes."""
    log = tmp_path / "probes.log"
    script = tmp_path / "probe_process.py"
    text = PROCESS
    if cache_nothing:  # a cache the other process can never use: both must measure
        text = text.replace(
            "ceilings = ceiling_probe.load_or_measure_ceilings",
            "ceiling_probe.atomic_write_json = lambda path, data: None\n"
            "ceilings = ceiling_probe.load_or_measure_ceilings",
        )
    script.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(folder), str(log), str(tmp_path / f"ready-{i}")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i, folder in enumerate(folders)
    ]  # fmt: skip
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "bandwidth 10000000000.0" in out
    return log


def test_two_processes_without_a_cache_probe_once_and_the_second_uses_the_first(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    log = _run_two(tmp_path, (cache, cache))
    assert len(_intervals(log)) == 1, _intervals(log)
    # the lock is on the folder itself: no lock file is left in the cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        p.name for p in cache.glob("ceilings-*.json")
    )


def test_probes_into_one_folder_never_overlap_even_when_both_must_measure(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    log = _run_two(tmp_path, (cache, cache), cache_nothing=True)
    (first_start, first_end), (second_start, _) = _intervals(log)
    assert second_start >= first_end > first_start
