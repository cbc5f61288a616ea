"""The CUDA probe of the sandbox: the driver check per rung, the machine's verdict cache, the
re-probe after CUDA did not start (optimize/sandbox/cuda_probe.py, isolation.Isolation.probe).

No GPU here, so the driver check runs against a stand-in `libcuda.so.1` compiled from C below:
it answers like the driver does (CUDA_ERROR_OPERATING_SYSTEM, 304) unless the sandbox gives it
what FAKE_CUDA_NEEDS names: "ptmx" (the host's /dev: the minimal one has no /dev/ptmx),
"writable_proc" (a /proc that is not mounted read-only), "nothing" or "never". The checks run
inside the real namespaces, through the real ladder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox import cuda_probe, isolation
from pytest_kernelpro.optimize.sandbox.cuda_probe import (
    VerdictCache,
    cuda_init_failure,
    walk_ladder,
)
from pytest_kernelpro.optimize.sandbox.isolation import CUDA_LADDER, Isolation

ISOLATION = Isolation.probe()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

FAKE_DRIVER = r"""
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>
static int allowed(void) {
    const char *needs = getenv("FAKE_CUDA_NEEDS");
    if (!needs || !strcmp(needs, "nothing")) return 1;
    if (!strcmp(needs, "ptmx")) return access("/dev/ptmx", F_OK) == 0;
    if (!strcmp(needs, "writable_proc")) {
        struct statvfs st;
        return statvfs("/proc", &st) == 0 && !(st.f_flag & ST_RDONLY);
    }
    return 0;
}
int cuInit(unsigned flags) { (void)flags; return allowed() ? 0 : 304; }
int cuGetErrorName(int rc, const char **out) {
    *out = rc == 304 ? "CUDA_ERROR_OPERATING_SYSTEM" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)0x1; return 0; }
int cuDevicePrimaryCtxRelease(int d) { (void)d; return 0; }
int cuCtxSetCurrent(void *c) { (void)c; return 0; }
static unsigned buffer[1 << 18];
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
    (void)n; *p = (unsigned long long)(size_t)buffer; return 0;
}
int cuMemsetD32_v2(unsigned long long p, unsigned v, size_t n) {
    unsigned *b = (unsigned *)(size_t)p;
    for (size_t i = 0; i < n; i++) b[i] = v;
    return 0;
}
int cuCtxSynchronize(void) { return 0; }
int cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("fake-libcuda")
    (where / "fake.c").write_text(FAKE_DRIVER, encoding="utf-8")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(where / "libcuda.so.1"), str(where / "fake.c")],
        check=True,
        capture_output=True,
    )
    return where


def driver_env(fake: Path, needs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    env.update(LD_LIBRARY_PATH=str(fake), FAKE_CUDA_NEEDS=needs)
    return env


def wrapper_for(env: dict[str, str]):  # noqa: ANN201
    """The ladder's wrapper; the sandbox shows the directories of `env` (the stand-in
    driver's LD_LIBRARY_PATH), as the evaluator's does for its workers."""

    def wrapper(relax: tuple[str, ...], command: list[str], scratch: Path) -> list[str]:
        return dataclasses.replace(ISOLATION, relax=relax).wrap(command, scratch=scratch, env=env)

    return wrapper


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A driver version and a boot id this test controls, and a private cache directory."""
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    boot = tmp_path / "boot_id"
    boot.write_text("11111111-2222-3333-4444-555555555555\n")
    monkeypatch.setattr(cuda_probe, "DRIVER_FILES", (str(driver),))
    monkeypatch.setattr(cuda_probe, "BOOT_ID_FILE", str(boot))
    cache = tmp_path / "cache"
    monkeypatch.setenv(cuda_probe.CACHE_ENV, str(cache))
    return tmp_path


@needs_namespaces
@needs_cc
@pytest.mark.parametrize(
    ("needs", "rung"),
    [("nothing", ()), ("ptmx", ("host_dev",)), ("writable_proc", ("host_dev", "writable_proc"))],
)
def test_the_driver_check_picks_the_first_rung_cuda_starts_in(
    fake_driver: Path, needs: str, rung: tuple[str, ...]
) -> None:
    env = driver_env(fake_driver, needs)
    found = walk_ladder(CUDA_LADDER, wrapper_for(env), env)
    assert found.relax == rung
    # Every rung tried was decided by the driver check (no torch import), stronger ones first.
    assert found.checks == ["driver"] * (CUDA_LADDER.index(rung) + 1)
    assert len(found.tried) == CUDA_LADDER.index(rung)
    for line in found.tried:
        assert "cuInit: CUDA_ERROR_OPERATING_SYSTEM (304)" in line


@needs_namespaces
@needs_cc
def test_no_rung_means_the_fallback_with_each_rungs_reason_and_nothing_cached(
    fake_driver: Path, machine: Path
) -> None:
    cache = VerdictCache(machine / "cache")
    found = isolation._probe_cuda(ISOLATION, driver_env(fake_driver, "never"), cache=cache)
    assert found.level == "fallback"
    assert found.why.startswith("CUDA does not initialise inside the namespaces (tried full: ")
    assert found.why.count("CUDA_ERROR_OPERATING_SYSTEM") == len(CUDA_LADDER)
    assert not (machine / "cache").exists() or not list((machine / "cache").iterdir())


def test_without_a_driver_library_each_rung_falls_back_to_the_torch_check(tmp_path: Path) -> None:
    # Here libcuda.so.1 cannot be loaded: the driver check says so (exit 3) and the rung is
    # decided by importing torch, as before the driver check existed.
    calls: list[tuple[str, ...]] = []

    def plain(relax: tuple[str, ...], command: list[str], scratch: Path) -> list[str]:
        calls.append(relax)
        program = command[-1]
        if "ctypes.CDLL" in program:
            return [sys.executable, "-c", "import sys; sys.exit(3)"]
        return [sys.executable, "-c", "raise SystemExit('torch says: no CUDA')"]

    found = walk_ladder(CUDA_LADDER, plain, None)
    assert found.relax is None
    assert found.checks == ["torch"] * len(CUDA_LADDER)
    assert calls == [r for r in CUDA_LADDER for _ in range(2)]  # driver, then torch, per rung
    assert all(t.endswith("torch says: no CUDA") for t in found.tried)


@needs_namespaces
@needs_cc
def test_a_verdict_is_probed_once_then_read_from_the_machine_cache(
    fake_driver: Path, machine: Path
) -> None:
    cache = VerdictCache.default()
    first = isolation._probe_cuda(ISOLATION, driver_env(fake_driver, "ptmx"), cache=cache)
    assert first.relax == ("host_dev",)
    assert first.verdict.startswith("probed (driver check, ")
    files = list((machine / "cache").iterdir())
    assert len(files) == 1
    assert files[0].stat().st_mode & 0o777 == 0o600
    # The driver now refuses every rung: a second probe that ran the checks would fall back.
    # The cached verdict is used instead, and says where it came from.
    second = isolation._probe_cuda(ISOLATION, driver_env(fake_driver, "never"), cache=cache)
    assert second == first
    assert second.verdict.startswith("cached (driver check at ")
    assert str(files[0]) in second.verdict
    # A reboot (another boot id) makes it a different machine: probed again.
    (machine / "boot_id").write_text("99999999-2222-3333-4444-555555555555\n")
    third = isolation._probe_cuda(ISOLATION, driver_env(fake_driver, "never"), cache=cache)
    assert third.level == "fallback"


def _stored(machine: Path, relax: tuple[str, ...] = ("host_dev",)) -> tuple[VerdictCache, dict]:
    cache = VerdictCache(machine / "cache")
    key = isolation._machine_key(ISOLATION, None)
    assert key is not None
    assert cache.store(key, relax, check="driver", seconds=1.0) is not None
    return cache, key


def test_a_cached_verdict_is_refused_when_tampered_stale_or_foreign(machine: Path) -> None:
    cache, key = _stored(machine)
    assert cache.load(key, CUDA_LADDER).relax == ("host_dev",)
    path = cache.path(key)
    data = json.loads(path.read_text())

    def rewrite(**changes: object) -> None:
        path.write_text(json.dumps({**data, **changes}))
        path.chmod(0o600)

    rewrite(relax=["host_dev", "writable_tmp"])  # not a rung of the ladder
    assert cache.load(key, CUDA_LADDER) is None
    rewrite(level="fallback")
    assert cache.load(key, CUDA_LADDER) is None
    rewrite(key={**data["key"], "driver": "NVRM version: 999.0"})  # written for another driver
    assert cache.load(key, CUDA_LADDER) is None
    rewrite(probed_at=data["probed_at"] - cuda_probe.MAX_AGE_S - 60)  # older than a day
    assert cache.load(key, CUDA_LADDER) is None
    rewrite()
    assert cache.load(key, CUDA_LADDER) is not None
    path.chmod(0o620)  # another user could have written it
    assert cache.load(key, CUDA_LADDER) is None
    path.chmod(0o600)
    (machine / "cache").chmod(0o777)  # so could anyone, through the directory
    assert cache.load(key, CUDA_LADDER) is None
    (machine / "cache").chmod(0o700)
    assert cache.load(key, CUDA_LADDER) is not None
    # The sandbox's code is part of the key: a changed ladder is a different key.
    other = isolation._machine_key(ISOLATION, None)
    assert other == key
    changed = cuda_probe.machine_key(ladder=CUDA_LADDER[:2], base=key["base"], env=None)
    assert changed is not None
    assert cache.load(changed, CUDA_LADDER) is None


def test_no_cache_without_a_driver_or_when_turned_off(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_probe, "DRIVER_FILES", (str(machine / "absent"),))
    assert isolation._machine_key(ISOLATION, None) is None
    monkeypatch.setenv(cuda_probe.CACHE_ENV, "off")
    assert cuda_probe.cache_dir() is None
    assert VerdictCache.default().store({"k": 1}, (), check="driver", seconds=0.0) is None


def test_the_cuda_start_failure_is_recognised_in_a_log() -> None:
    log = (
        "kernelpro worker: RLIMIT_AS not set (CUDA)\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: CUDA error: OS call failed or operation not supported on this OS\n"
    )
    assert cuda_init_failure(log).startswith("RuntimeError: CUDA error: OS call failed")
    assert cuda_init_failure("AssertionError: output 0 differs at (0, 1)") is None


@needs_namespaces
def test_a_re_probe_replaces_the_cached_rung_with_the_torch_checks_verdict(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, key = _stored(machine)
    cached = dataclasses.replace(
        ISOLATION, relax=("host_dev",), verdict=cache.load(key, CUDA_LADDER).describe()
    )
    monkeypatch.setattr(isolation, "_PROBED", {"auto": ISOLATION, "cuda": cached})
    monkeypatch.setattr(isolation, "_REPROBED", [])
    failure = "RuntimeError: CUDA error: OS call failed or operation not supported on this OS"
    found = Isolation.reprobe_cuda("auto", failure, env=None)
    # No CUDA for torch on this machine: the torch check finds no rung, so the honest answer
    # is the fallback, and the verdict says why it changed.
    assert found is not None
    assert found.level == "fallback"
    assert found.verdict.startswith("re-probed with the torch check after CUDA did not start")
    assert failure[:60] in found.verdict
    assert Isolation.probe(cuda=True) == found  # the process's verdict now
    assert cache.load(key, CUDA_LADDER) is None  # and the stale entry is gone
    assert Isolation.reprobe_cuda("auto", failure) is None  # once per process


CUDA_DID_NOT_START = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        raise RuntimeError("CUDA error: OS call failed or operation not supported on this OS")
"""


@needs_namespaces
@pytest.mark.slow
def test_an_evaluation_whose_cuda_did_not_start_re_probes_and_runs_again(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_kernelpro.optimize.sandbox.evaluator import (
        KernelBenchTask,
        SandboxEvaluator,
        SandboxLimits,
    )
    from pytest_kernelpro.optimize.search.interfaces import Candidate

    data = Path(__file__).resolve().parents[2] / "data" / "search" / "cpu"
    task = KernelBenchTask(
        (data / "reference.py").read_text(encoding="utf-8"),
        name="softmax_linear",
        device="cpu",
        timing={"warmup_ms": 1.0, "max_time_s": 0.02, "min_samples": 5, "max_samples": 10},
    )
    evaluator = SandboxEvaluator(task, SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0))
    # As on a GPU machine whose cached rung CUDA does not start in (the worker's log says so).
    cached = dataclasses.replace(ISOLATION, relax=("host_dev",), verdict="cached (driver check)")
    monkeypatch.setattr(isolation, "_PROBED", {"auto": ISOLATION, "cuda": cached})
    monkeypatch.setattr(isolation, "_REPROBED", [])
    monkeypatch.setattr(evaluator, "_needs_cuda", lambda: True)
    evaluator._isolation = cached
    runs: list[Isolation] = []
    original = evaluator._run_worker

    def counted(workdir: Path):  # type: ignore[no-untyped-def]
        runs.append(evaluator.isolation)
        return original(workdir)

    monkeypatch.setattr(evaluator, "_run_worker", counted)
    evaluation = evaluator.evaluate(Candidate(CUDA_DID_NOT_START))
    assert evaluation.status in ("build_error", "run_error")
    # Run under the cached rung, re-probed with the torch check (no CUDA for torch here: the
    # fallback), run once more under it, and every part of that is in the record.
    assert [r.relax for r in runs] == [("host_dev",), ()]
    assert runs[1].level == "fallback"
    assert evaluation.metrics["sandbox"] == runs[1].describe()
    assert evaluation.metrics["sandbox_reprobe"].startswith(
        "re-probed with the torch check after CUDA did not start under namespaces"
    )
    # A second failure in the same process does not probe again.
    again = evaluator.evaluate(Candidate(CUDA_DID_NOT_START))
    assert "sandbox_reprobe" not in again.metrics
    assert len(runs) == 3
