"""Helpers for pytester runs of small kernel projects."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# In-process pytester runs drop modules first imported inside them; torch registers
# operator libraries on import and refuses a second registration, so import the heavy
# parts here, once, before any inner run.
import torch

from pytest_kernelpro.measure import timing  # imported once here, so injected_timing's patch holds
from pytest_kernelpro.measure.ceilings import Ceilings
from pytest_kernelpro.measure.correctness_check import check_correctness
from pytest_kernelpro.measure.roofline import analyze_reference

# Round numbers so roofline results can be checked by hand: 100 GB/s, 1 TFLOP/s (fp32),
# 0.5 TFLOP/s (fp64).
FIXED_CEILINGS = {
    "device": "test-cpu",
    "bandwidth_Bps": 100e9,
    "flops": {"fp32": 1e12, "fp64": 0.5e12, "bf16": 1e12},
    "source": "measured",
    "measured_at": "2026-11-30T00:00:00",
    "torch_version": "test",
    "details": {},
}


def _warm_up_lazy_imports() -> None:
    check_correctness(torch.neg, torch.neg, lambda seed: (torch.ones(4),), device="cpu", trials=1)
    analyze_reference(
        torch.mm, (torch.ones(4, 4), torch.ones(4, 4)), ceilings=Ceilings.from_dict(FIXED_CEILINGS)
    )


_warm_up_lazy_imports()


@pytest.fixture
def kp_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester project with fixed ceilings and a short timing budget, on the CPU.

    The device is pinned to the CPU (the plugin's default, auto, takes a CUDA GPU when one is
    visible): the fixed ceilings are round CPU-scale numbers, and these tests are about the
    CPU's behaviour (its timer, cache flush, anchors, summary lines), which must be the same
    on a GPU host as on CPU-only CI. A test about another device passes --kernelpro-device
    (the command line wins over the ini); KERNELPRO_DEVICE would win over the ini, so it goes.
    """
    monkeypatch.delenv("KERNELPRO_DEVICE", raising=False)
    ceilings = pytester.path / "ceilings.json"
    ceilings.write_text(json.dumps(FIXED_CEILINGS))
    pytester.makeini(
        f"""
        [pytest]
        kernelpro_device = cpu
        kernelpro_ceilings = {ceilings}
        kernelpro_time_budget = 0.2
        kernelpro_warmup_ms = 1
        """
    )
    return pytester


def load_report(pytester: pytest.Pytester) -> dict:
    path = Path(pytester.path) / ".kernelpro" / "kernelpro-report.json"
    return json.loads(path.read_text())


def records_by_name(pytester: pytest.Pytester) -> dict[str, dict]:
    return {r["name"]: r for r in load_report(pytester)["records"]}


SLOWDOWN_ENV = "KP_TEST_SLOWDOWN"  # factor the injected timer multiplies every sample by
BUSY_ENV = "KP_TEST_OVERSUBSCRIBED"  # set: the injected timer reports a busy CPU
# Set: the injected timer says the cache was flushed before every sample (inputs from memory).
FLUSHED_ENV = "KP_TEST_FLUSHED"


def injected_result(
    samples: tuple[float, ...], cpu_load: dict, anchor: dict | None = None
) -> timing.TimingResult:
    """What an injected CPU timer returns for `samples` (and the CPU anchor's `anchor`
    pairs, when given)."""
    from pytest_kernelpro.measure.timing.budget import summarize

    return timing.TimingResult(
        samples_s=samples,
        stats=summarize(samples),
        method="cpu-perf-counter",
        device="cpu (injected)",
        stop_reason="max-samples",
        wall_s=0.0,
        warmup_runs=0,
        throttled_samples=0,
        clocks=None,
        # Physics tests mark the inputs as really coming from memory (a flushed cache).
        flushed_l2=bool(os.environ.get(FLUSHED_ENV)),
        threads=1,
        cpu_load=cpu_load,
        anchor=anchor,
    )


@pytest.fixture
def injected_timing(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Replace the CPU timer of in-process pytester runs with deterministic samples.

    Every call of `time_kernel` still calls the kernel once (so a broken kernel still
    fails), then returns 200 samples drawn from a lognormal around 1 ms (5% spread), a new
    seed per call (each measurement is independent, as a real one would be) and multiplied
    by the `KP_TEST_SLOWDOWN` environment variable; with `KP_TEST_OVERSUBSCRIBED` set, the
    CPU load it reports is an oversubscribed one; with `KP_TEST_FLUSHED` set, it says the
    cache was flushed before every sample. Gate tests built on it decide nothing by
    wall clock, so a loaded machine cannot flip them. Returns the list of medians handed out.
    """
    import os

    import numpy as np

    from pytest_kernelpro.measure.timing.budget import summarize
    from pytest_kernelpro.measure.timing.cpu_load import CpuLoad

    medians: list[float] = []

    def fake_time_kernel(fn, *, device, budget=None, fresh=None):  # noqa: ANN001, ANN202
        fresh.call() if fresh is not None else fn()  # the kernel still runs once
        factor = float(os.environ.get(SLOWDOWN_ENV, "1"))
        rng = np.random.default_rng(len(medians))
        samples = tuple(float(v) for v in 1e-3 * factor * rng.lognormal(0.0, 0.05, 200))
        stats = summarize(samples)
        medians.append(stats.median_s)
        others = 1.5 if os.environ.get(BUSY_ENV) else 0.0
        load = CpuLoad(cores=2, cpus=2, threads=1, others_cores=others, loadavg_1m=3.5,
                       runnable_threads=4, wall_s=0.2)  # fmt: skip
        return injected_result(samples, load.to_dict())

    monkeypatch.setattr(timing, "time_kernel", fake_time_kernel)
    # The injected timer lives in this process: a confirmation re-measured in a fresh one
    # (the default) would time the real kernel, so these runs confirm in the same process.
    monkeypatch.setenv("KERNELPRO_CONFIRM_PROCESS", "same")
    return medians
