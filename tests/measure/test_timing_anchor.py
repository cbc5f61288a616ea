"""The clock anchor's measurement side (measure/timing/anchor.py): when a kernel is timed in
pairs with the anchor, how many pairs it takes, what it records; on a GPU, the pairs."""

from __future__ import annotations

import json

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.anchor import (
    ANCHOR_MIN_PAIRS,
    LAYOUT,
    anchored_min_samples,
    summarize_pairs,
    warmup_capped,
)


@pytest.mark.parametrize(
    ("mode", "throttled", "wanted"),
    [
        ("on", [True] * 30, True),
        ("on", [False, True], True),  # half of the warm-up's readings: capped
        ("on", [True, False, False], False),
        ("on", [], False),  # no NVML readings: timed alone
        ("off", [True] * 30, False),
    ],
)
def test_the_warm_up_readings_decide_whether_the_samples_are_anchored(
    mode: str, throttled: list[bool], wanted: bool
) -> None:
    assert warmup_capped(mode, throttled) is wanted


def test_an_anchored_measurement_takes_at_least_the_minimum_pairs_within_max_samples() -> None:
    assert anchored_min_samples(20, 5000) == ANCHOR_MIN_PAIRS
    assert anchored_min_samples(100, 5000) == 100  # a larger min_samples is kept
    assert anchored_min_samples(5, 10) == 10  # max_samples bounds it


def test_summarize_pairs_keeps_the_anchor_series_and_the_ratios() -> None:
    got = summarize_pairs(
        "anchor X", [2.0, 4.0, 3.0], [1.0, 2.0, 1.0], "3 of 3 capped",
        throttled=[True, False, True], flush_s=0.5,
    )  # fmt: skip
    assert got["ratios"] == [2.0, 2.0, 3.0]
    assert got["ratio_median"] == 2.0
    assert got["kernel_median_s"] == 3.0
    assert got["anchor_median_s"] == 1.0
    assert got["anchor_s"] == [1.0, 2.0, 1.0]
    assert got["pairs"] == 3
    assert got["throttled_pairs"] == 2
    assert got["added_gpu_s"] == pytest.approx(4.0 + 3 * 0.5)  # anchors plus their flushes
    assert got["layout"] == LAYOUT == "per-sample"
    assert got["name"] == "anchor X"
    json.dumps(got, allow_nan=False)


def test_summarize_pairs_drops_pairs_with_a_non_positive_time() -> None:
    got = summarize_pairs("a", [1.0, 0.0, 2.0], [1.0, 1.0, -1.0], "r")
    assert got["pairs"] == 1
    assert got["ratios"] == [1.0]
    assert got["throttled_pairs"] == 0


def test_summarize_pairs_refuses_series_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="zip"):
        summarize_pairs("a", [1.0, 2.0], [1.0], "r")


def test_the_budget_names_a_bad_clock_anchor_mode() -> None:
    with pytest.raises(KernelproConfigError, match=r"clock_anchor='always' \(use one of off, on\)"):
        TimingBudget(clock_anchor="always")


def test_cpu_timings_carry_no_anchor() -> None:
    # Changed with the CPU anchor (measure/timing/cpu.py): a CPU timing with
    # clock_anchor="on" now carries the CPU anchor's pairs (layout "cpu-pairs"), never the
    # GPU clock anchor, and has no NVML warm-up reading; with "off" it carries none.
    budget = TimingBudget(max_time_s=0.05, clock_anchor="on")
    result = time_kernel(lambda: sum(range(100)), device="cpu", budget=budget)
    assert result.warmup_throttled is None
    pairs = result.anchor
    assert pairs is not None
    assert pairs["layout"] == "cpu-pairs"
    assert pairs["name"].startswith("cpu anchor: fp32 matmul")
    assert pairs["pairs"] >= 1
    assert result.to_dict()["anchor"] == pairs
    off = time_kernel(lambda: sum(range(100)), device="cpu", budget=TimingBudget(max_time_s=0.05))
    assert off.anchor is None
    assert off.to_dict()["anchor"] is None


def _gemm(torch: object, n: int) -> object:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)  # type: ignore[attr-defined]
    return lambda: a @ a


@pytest.mark.gpu
def test_a_capped_gpu_kernel_is_timed_in_pairs_with_the_anchor() -> None:
    """An 8192^2 bf16 GEMM runs at the H200's power cap: when its warm-up saw the cap, every
    sample has its anchor time, and the same-size-class ratio is plausible."""
    torch = pytest.importorskip("torch")
    budget = TimingBudget(max_time_s=0.5, clock_anchor="on")
    result = time_kernel(_gemm(torch, 8192), device="cuda", budget=budget)
    if result.warmup_throttled is None:
        pytest.skip("no NVML readings on this machine: the timer cannot see the cap")
    assert (result.anchor is not None) is result.warmup_throttled
    if result.anchor is None:
        pytest.skip("this GPU's warm-up ran without a clock limit: nothing to anchor")
    pairs = result.anchor
    assert pairs["pairs"] == len(result.samples_s) >= ANCHOR_MIN_PAIRS
    assert pairs["layout"] == "per-sample"
    assert pairs["name"].startswith("bf16 matmul 4096x4096x4096 (torch ")
    assert len(pairs["ratios"]) == len(pairs["anchor_s"]) == len(result.samples_s)
    # 8192^3 is 8x the anchor's 4096^3 FLOPs: at the same clock the ratio is near 8.
    assert 5.0 < pairs["ratio_median"] < 11.0
    # 2 * 4096^3 FLOP: slower than 3 PFLOP/s, faster than 20 TFLOP/s on any H100/H200-class GPU.
    assert 2 * 4096**3 / 3e15 < pairs["anchor_median_s"] < 2 * 4096**3 / 20e12
    assert pairs["added_gpu_s"] >= sum(pairs["anchor_s"])
    assert pairs["throttled_pairs"] <= pairs["pairs"]


@pytest.mark.gpu
def test_a_gpu_kernel_is_timed_alone_with_the_mode_off_or_at_a_steady_clock() -> None:
    torch = pytest.importorskip("torch")
    off = time_kernel(_gemm(torch, 8192), device="cuda", budget=TimingBudget(max_time_s=0.3))
    assert off.anchor is None  # off by default
    # A 4 MB copy draws a fraction of the power cap: its warm-up is not clock-limited.
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    steady = time_kernel(
        lambda: y.copy_(x), device="cuda", budget=TimingBudget(max_time_s=0.3, clock_anchor="on")
    )
    # Anchored exactly when its own warm-up saw a clock limit (the decision, not a guess).
    assert (steady.anchor is not None) is bool(steady.warmup_throttled)


class _FakeEvent:
    """A CUDA event on a fake GPU that runs every launch at once: `record` notes the position
    in the launch log and the host clock."""

    def __init__(self, log: list[str], enable_timing: bool = False) -> None:
        self.log = log
        self.t = 0.0
        self.at = -1

    def record(self, stream: object = None) -> None:
        import time

        self.at = len(self.log)
        self.t = time.perf_counter()

    def elapsed_time(self, end: _FakeEvent) -> float:
        return max(end.t - self.t, 1e-9) * 1e3

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _FakeTorch:
    """Just enough of torch for `cuda._time_cuda_on`: a launch log of flushes ("f"), kernel
    calls ("k") and anchor calls ("a")."""

    int32 = "int32"

    def __init__(self) -> None:
        import types

        self.log: list[str] = []
        log = self.log

        class Buffer:
            def numel(self) -> int:
                return 1024

            def element_size(self) -> int:
                return 4

            def zero_(self) -> None:
                log.append("f")

        class Event(_FakeEvent):  # torch._C._CudaEventBase: what the timer records with
            def __init__(self, enable_timing: bool = False) -> None:
                super().__init__(log, enable_timing)

        self.cuda = types.SimpleNamespace(
            Event=lambda enable_timing=False: _FakeEvent(log, enable_timing),
            _sleep=lambda cycles: None,
            synchronize=lambda: None,
            current_stream=lambda device=None: types.SimpleNamespace(stream_id=0),
        )
        self._C = types.SimpleNamespace(_CudaEventBase=Event, _cuda_synchronize=lambda: None)
        self.empty = lambda *a, **k: Buffer()


class _FakeMonitor:
    def __init__(self, reasons: tuple[str, ...]) -> None:
        self.reasons = reasons

    def read(self) -> object:
        import time

        from pytest_kernelpro.measure.clocks import ClockReading

        return ClockReading(time.perf_counter(), 1600, 2619, self.reasons, 60, 690.0, 1980)


def _fake_measurement(
    monkeypatch: pytest.MonkeyPatch, reasons: tuple[str, ...], mode: str
) -> tuple[_FakeTorch, object, object]:
    import types

    from pytest_kernelpro.measure.timing import cuda

    torch = _FakeTorch()
    monkeypatch.setattr(cuda, "anchor_launch", lambda t, idx: lambda: torch.log.append("a"))
    monkeypatch.setattr(cuda, "anchor_name", lambda t: "fake anchor")
    monkeypatch.setattr(cuda, "_FLUSH_BUFFERS", {})
    monkeypatch.setattr(cuda, "_SLEEP_CYCLES_PER_S", {})
    # The stand-ins above rebind names of cuda.py, which the per-sample verification of the
    # kept bindings (measure/bound.py) would refuse as a kernel's patch.
    monkeypatch.setattr(cuda, "verify_bindings", lambda fresh=None, seal=None: None)
    props = types.SimpleNamespace(name="Fake GPU", L2_cache_size=4096)
    budget = TimingBudget(max_time_s=0.05, warmup_ms=1.0, clock_anchor=mode, max_samples=60)
    log, extra = cuda._time_cuda_on(
        torch, lambda: torch.log.append("k"), 0, props, budget, _FakeMonitor(reasons)
    )
    return torch, log, extra


def test_a_capped_warm_up_pairs_every_sample_with_the_anchor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch, log, extra = _fake_measurement(monkeypatch, ("sw_power_cap",), "on")
    pairs = extra["anchor"]  # type: ignore[index]
    assert extra["warmup_throttled"] is True  # type: ignore[index]
    assert pairs is not None
    assert pairs["name"] == "fake anchor"
    assert pairs["pairs"] == len(log.samples) >= ANCHOR_MIN_PAIRS  # type: ignore[attr-defined]
    assert pairs["throttled_pairs"] == pairs["pairs"]
    # After the two loading calls, every anchor call follows flush, kernel, flush; each round
    # is followed by one checked call (flush, kernel: measure/timing/streams.py).
    launches = "".join(torch.log)
    first = launches.index("aa") + 2
    sampled = launches[first:]
    assert sampled.count("a") == pairs["pairs"]
    assert sampled.replace("fkfa", "").replace("fk", "") == ""


@pytest.mark.parametrize(("reasons", "mode"), [((), "on"), (("sw_power_cap",), "off")])
def test_a_steady_warm_up_or_the_mode_off_times_the_kernel_alone(
    monkeypatch: pytest.MonkeyPatch, reasons: tuple[str, ...], mode: str
) -> None:
    torch, log, extra = _fake_measurement(monkeypatch, reasons, mode)
    assert extra["anchor"] is None  # type: ignore[index]
    assert extra["warmup_throttled"] is bool(reasons)  # type: ignore[index]
    assert "a" not in torch.log
    assert len(log.samples) >= 20  # type: ignore[attr-defined]


def test_anchored_rounds_stop_on_the_ratios_ci_not_the_noisier_times() -> None:
    """Times scattered by 5% (the clock moving under the cap) never reach a 0.5% CI in the
    budget; their ratios to the anchor (scattered by 0.2%) do at the first check."""
    import random

    from pytest_kernelpro.measure.timing.budget import adaptive_rounds

    rng = random.Random(3)
    times: list[float] = []
    ratios: list[float] = []
    now = [0.0]

    def run_round(k: int) -> tuple[list[float], bool]:
        now[0] += 0.001 * k
        new = [1e-3 * (1 + 0.05 * rng.gauss(0, 1)) for _ in range(k)]
        times.extend(new)
        ratios.extend(8.0 * (1 + 0.002 * rng.gauss(0, 1)) for _ in range(k))
        return new, True

    budget = TimingBudget(min_samples=40, max_time_s=1.0, target_rel_ci=0.005)
    anchored = adaptive_rounds(run_round, budget, clock=lambda: now[0], converge_on=lambda: ratios)
    assert anchored.stop_reason == "converged"
    assert len(anchored.samples) == 40
    assert anchored.stats is not None
    assert anchored.stats.rel_ci_halfwidth > 0.005  # the times alone had not converged
    times.clear()
    alone = adaptive_rounds(run_round, budget, clock=lambda: now[0])
    assert len(alone.samples) > 40
