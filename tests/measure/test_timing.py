"""time_kernel on real CPU callables (and on a GPU when there is one)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from pytest_kernelpro.errors import KernelproConfigError, KernelproError
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.budget import CPU_MIN_SAMPLES_FLOOR, parse_device
from pytest_kernelpro.measure.timing.cpu import (
    CPU_FLUSH_LLC_CAP,
    cpu_cache_levels,
    cpu_flush_bytes,
    cpu_flush_decision,
    last_level_cache_bytes,
    sample_floor,
)

QUICK = TimingBudget(warmup_ms=5, max_time_s=0.5, flush_l2=False)


def busy(seconds: float) -> None:
    """Spin for `seconds` of wall time (unlike sleep, no wake-up latency under load)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_known_duration_ratio_is_measured() -> None:
    """0.25 ms and 0.5 ms of work: medians in a 2:1 ratio (within 10%), sane statistics.

    Short calls keep the median clear of preemptions on a loaded CI machine (a 4 ms spin on
    an oversubscribed 2-core runner straddles a scheduler time slice in most samples).
    """
    short = time_kernel(lambda: busy(0.00025), device="cpu", budget=QUICK)
    long = time_kernel(lambda: busy(0.0005), device="cpu", budget=QUICK)
    assert long.median_s / short.median_s == pytest.approx(2.0, rel=0.1)
    assert 0.00025 <= short.median_s < 0.0004
    for r in (short, long):
        assert r.method == "cpu-perf-counter"
        assert r.device.startswith("cpu (")
        # min_samples gives way to the budget once the floor is in: on a loaded machine
        # (two busy loops beside) a 0.5 s budget held 8 of these samples, not 20.
        assert r.stats.n == len(r.samples_s) >= sample_floor(QUICK)
        assert r.stats.min_s <= r.stats.q1_s <= r.stats.median_s <= r.stats.q3_s <= r.stats.max_s
        assert r.clocks is None
        assert r.throttled_samples == 0
        assert r.warmup_runs >= 2  # the first call and at least one estimate (warm-up) sample


def test_converges_on_a_steady_callable() -> None:
    budget = TimingBudget(warmup_ms=5, max_time_s=10.0, target_rel_ci=0.05, flush_l2=False)
    r = time_kernel(lambda: busy(0.0002), device="cpu", budget=budget)
    assert r.stop_reason == "converged"
    assert r.stats.rel_ci_halfwidth <= 0.05
    assert r.wall_s < 5.0  # stopped well before the 10 s budget


def test_time_budget_stops_sampling() -> None:
    x = np.random.default_rng(0).random(20_000)
    budget = TimingBudget(warmup_ms=1, max_time_s=0.2, target_rel_ci=0.0, flush_l2=False)
    r = time_kernel(lambda: np.sort(x), device="cpu", budget=budget)
    assert r.stop_reason == "time-budget"
    # The floor, not min_samples: how many fit in 0.2 s is the machine's speed (11 under
    # load). That the rounds fit the time left is checked on a simulated clock
    # (test_timing_budget.py), not on this machine's.
    assert r.stats.n >= sample_floor(budget)


def test_max_samples_stops_sampling() -> None:
    x = np.random.default_rng(0).random(1000)
    budget = TimingBudget(
        warmup_ms=1, max_time_s=30.0, target_rel_ci=0.0, max_samples=50, flush_l2=False
    )
    r = time_kernel(lambda: np.cumsum(x), device="cpu", budget=budget)
    assert r.stop_reason == "max-samples"
    assert r.stats.n == 50
    assert r.rounds == 3  # 20, then doubling capped by max_samples: 20, 10


def test_min_samples_shrink_to_the_floor_when_the_budget_is_short() -> None:
    """A 3 ms call and a 10 ms budget: min_samples=8 does not fit, the floor of 5 is taken."""
    budget = TimingBudget(warmup_ms=0, max_time_s=0.01, min_samples=8, flush_l2=False)
    r = time_kernel(lambda: time.sleep(0.003), device="cpu", budget=budget)
    assert r.stats.n == CPU_MIN_SAMPLES_FLOOR
    assert r.stop_reason in ("time-budget", "converged")


def test_cache_flush_makes_cached_data_cold() -> None:
    """Summing data that fits in the last-level cache is slower after the flush."""
    llc = last_level_cache_bytes() or 32 * 1024 * 1024
    # A quarter of the LLC, at most 1 MiB: a VM can report its host's whole L3 (480 MiB on a
    # CPU VM, about 300 MiB on the H200 host), and a quarter of that did not stay cached
    # between calls there (cold and warm medians equal); 1 MiB stays in a core's L2 or any LLC.
    x = np.random.default_rng(0).random(min(llc // 4, 1024 * 1024) // 8)
    base = {"warmup_ms": 5, "max_time_s": 0.5, "target_rel_ci": 0.01}
    cold = time_kernel(x.sum, device="cpu", budget=TimingBudget(**base, flush_l2=True))
    warm = time_kernel(x.sum, device="cpu", budget=TimingBudget(**base, flush_l2=False))
    assert cold.flushed_l2
    assert cold.flush_bytes == cpu_flush_bytes() >= min(llc, CPU_FLUSH_LLC_CAP)
    assert not warm.flushed_l2
    assert warm.flush_bytes == 0
    # The premise, data kept in the cache between unflushed calls, needs the cores to itself:
    # other processes on them (14.7 of 16 cores on the H200 host under pytest -n 4) can evict
    # it. The timer says when they did (its `cpu_load`).
    busy = any((r.cpu_load or {}).get("oversubscribed") for r in (cold, warm))
    if cold.median_s <= 1.1 * warm.median_s and busy:
        pytest.skip(f"the CPU was oversubscribed while timed: {warm.cpu_load}")
    assert cold.median_s > 1.1 * warm.median_s


def test_very_fast_calls_are_repeated_within_a_sample() -> None:
    r = time_kernel(lambda: None, device="cpu", budget=QUICK)
    assert r.calls_per_sample > 1
    assert r.median_s < 2e-6


def test_json_round_trip() -> None:
    r = time_kernel(lambda: time.sleep(0.0005), device="cpu", budget=QUICK)
    text = json.dumps(r.to_dict(), allow_nan=False)
    data = json.loads(text)
    assert data["samples_s"] == list(r.samples_s)
    assert data["stats"]["median_s"] == r.median_s
    assert data["budget"]["max_time_s"] == QUICK.max_time_s


def test_kernel_raising_is_a_kernelpro_error() -> None:
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) > 3:
            raise ValueError("tile size 0")

    with pytest.raises(KernelproError, match="raised ValueError during timing") as info:
        time_kernel(flaky, device="cpu", budget=QUICK)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize(
    ("text", "parsed"), [("cpu", ("cpu", None)), ("cuda", ("cuda", None)), ("cuda:1", ("cuda", 1))]
)
def test_parse_device(text: str, parsed: tuple[str, int | None]) -> None:
    assert parse_device(text) == parsed


@pytest.mark.parametrize("text", ["tpu", "cuda:x", "cpu:0", ""])
def test_parse_device_rejects(text: str) -> None:
    with pytest.raises(KernelproConfigError, match="unknown timing device"):
        parse_device(text)


def test_budget_validation_names_the_bad_values() -> None:
    with pytest.raises(KernelproConfigError, match=r"max_time_s=0 .*min_samples=10"):
        TimingBudget(max_time_s=0, min_samples=10, max_samples=5)


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(KernelproError, match="torch.cuda.is_available"):
        time_kernel(lambda: None, device="cuda")


@pytest.mark.gpu
def test_cuda_events_time_a_matmul() -> None:
    torch = pytest.importorskip("torch")
    a = torch.randn(2048, 2048, device="cuda")
    r = time_kernel(lambda: a @ a, device="cuda", budget=TimingBudget(max_time_s=1.0))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert r.method == "cuda-events"
    assert r.device == torch.cuda.get_device_name(0)
    assert r.flush_bytes == 2 * l2
    assert r.flushed_l2
    # 2*2048^3 FLOP cannot run faster than 2 PFLOP/s nor slower than 1 TFLOP/s on a real GPU.
    assert 2 * 2048**3 / 2e15 < r.median_s < 2 * 2048**3 / 1e12
    json.dumps(r.to_dict(), allow_nan=False)


@pytest.mark.gpu
def test_cuda_graph_mode_times_a_tiny_kernel() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(1024, device="cuda")
    events = time_kernel(lambda: x + x, device="cuda", budget=TimingBudget(max_time_s=0.5))
    graph = time_kernel(
        lambda: x + x, device="cuda", budget=TimingBudget(max_time_s=0.5, cuda_graph=True)
    )
    assert graph.method == "cuda-graph"
    assert graph.calls_per_sample > 1
    assert events.calls_per_sample == 1
    assert 0 < graph.median_s < 50e-6
    assert 0 < events.median_s < 50e-6


@pytest.mark.parametrize(
    ("mode", "working_set", "flushes", "reason"),
    [
        ("on", 10**12, True, "on"),
        ("off", 1, False, "off"),
        ("auto", 1024, True, "auto: the inputs fit in the cache"),
        ("auto", None, True, "auto: the inputs fit in the cache"),
        ("auto", 10**12, False, "auto: the inputs (953674 MiB) exceed the"),
    ],
)
def test_cpu_flush_switch_decides_by_mode_and_working_set(
    mode: str, working_set: int | None, flushes: bool, reason: str
) -> None:
    budget = TimingBudget(cpu_flush=mode, working_set_bytes=working_set)
    nbytes, why = cpu_flush_decision(budget)
    assert (nbytes == cpu_flush_bytes()) is flushes
    assert (nbytes == 0) is not flushes
    assert why.startswith(reason)


def test_cpu_flush_is_sized_to_this_cpus_last_two_cache_levels() -> None:
    levels = cpu_cache_levels()
    if not levels:
        pytest.skip("no cache sizes in sysfs here")
    top = sorted(levels)[-2:]
    assert cpu_flush_bytes() == levels[top[0]] + min(levels[top[1]], CPU_FLUSH_LLC_CAP)
    assert last_level_cache_bytes() == levels[max(levels)]


@pytest.mark.parametrize(
    ("llc_mib", "flush_mib", "capped"),
    [(32, 33, False), (64, 65, False), (480, 65, True), (1536, 65, True)],
)
def test_a_flush_writes_the_l2_and_at_most_the_cap_of_the_llc(
    monkeypatch: pytest.MonkeyPatch, llc_mib: int, flush_mib: int, capped: bool
) -> None:
    """A VM that reports its host's 480 MiB L3 no longer gets 482 MiB written before every
    sample; the flush reason says when the cap applies and what it means."""
    from pytest_kernelpro.measure.timing import cpu

    mib = 2**20
    monkeypatch.setattr(cpu, "cpu_cache_levels", lambda: {1: 32 * 1024, 2: mib, 3: llc_mib * mib})
    monkeypatch.setattr(cpu, "last_level_cache_bytes", lambda: llc_mib * mib)
    assert cpu.cpu_flush_bytes() == flush_mib * mib
    nbytes, why = cpu_flush_decision(TimingBudget(cpu_flush="on"))
    assert nbytes == flush_mib * mib
    assert ("64 MiB of the" in why) is capped
    nbytes, why = cpu_flush_decision(TimingBudget(working_set_bytes=100 * mib))
    assert nbytes == 0  # inputs beyond what a flush writes are not flushed for
    assert why.endswith("no flush makes them cold" if capped else "from memory anyway")
    # An explicit flush size is the user's: no cap, no cap note.
    nbytes, why = cpu_flush_decision(TimingBudget(cpu_flush="on", flush_bytes=600 * mib))
    assert (nbytes, why) == (600 * mib, "on")


def test_unknown_cache_sizes_flush_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kernelpro.measure.timing import cpu

    monkeypatch.setattr(cpu, "cpu_cache_levels", dict)
    monkeypatch.setattr(cpu, "last_level_cache_bytes", lambda: None)
    assert cpu.cpu_flush_bytes() == CPU_FLUSH_LLC_CAP
    assert "cache sizes are unknown" in cpu_flush_decision(TimingBudget(cpu_flush="on"))[1]


def test_cpu_flush_mode_is_validated() -> None:
    with pytest.raises(KernelproConfigError, match="cpu_flush='sometimes'"):
        TimingBudget(cpu_flush="sometimes")


def test_cpu_timing_reports_its_threads_and_load() -> None:
    r = time_kernel(lambda: busy(0.0001), device="cpu", budget=QUICK)
    load = r.cpu_load or {}
    assert load["cores"] >= 1
    assert load["threads"] >= 1
    assert load["wall_s"] > 0
    assert isinstance(load["oversubscribed"], bool)
