"""The CPU timer's time budget, checked against a simulated clock.

The kernel and the cache flush advance a fake clock by fixed amounts, so what is checked is
the plan the budget logic makes (how many samples, warm-up calls and rounds it fits), not
how fast this machine happens to be: load cannot break these tests.
"""

from __future__ import annotations

import random
import re

import pytest

from pytest_kernelpro.measure.timing.budget import (
    BUDGET_TOLERANCE,
    CPU_MIN_SAMPLES_FLOOR,
    TimingBudget,
    TimingResult,
)
from pytest_kernelpro.measure.timing.cpu import time_cpu


class FakeClock:
    """A clock that moves only when the simulated kernel or flush says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def simulate(
    call_s: float,
    flush_s: float,
    budget_s: float,
    *,
    warmup_ms: float = 300.0,
    noisy: bool = True,
    **kw: object,
) -> tuple[TimingResult, float, int]:
    clock = FakeClock()
    calls = [0]
    jitter = random.Random(0)

    def kernel() -> None:
        calls[0] += 1
        # +-5% noise, deterministic: a zero-spread kernel would converge at once
        clock.advance(call_s * (1.0 + jitter.uniform(-0.05, 0.05)) if noisy else call_s)

    budget = TimingBudget(
        max_time_s=budget_s,
        warmup_ms=warmup_ms,
        cpu_flush="on" if flush_s else "off",
        flush_bytes=1024,  # the injected flush stands in for the buffer write
        **kw,
    )
    start = clock()
    result = time_cpu(kernel, budget, clock=clock, flush=lambda: clock.advance(flush_s))
    return result, clock() - start, calls[0]


# The cases of the retired trial bench/trials/cpu_budget.py (20 us, 0.3 ms, 3 ms; flush
# on/off; bench/results/2026-12-01-cpu-budget-cpu.md), with the flush
# priced at what 32.5 MiB took on the loaded 2-core VM (~10 ms) and on a quiet one (~3 ms).
CASES = [
    (call_s, flush_s, budget_s)
    for budget_s in (0.1, 0.5, 1.0, 2.0)
    for call_s in (20e-6, 3e-4, 3e-3)
    for flush_s in (0.0, 3e-3, 10e-3)
]


@pytest.mark.parametrize(("call_s", "flush_s", "budget_s"), CASES)
def test_budget_is_honoured_within_tolerance(
    call_s: float, flush_s: float, budget_s: float
) -> None:
    result, spent, _ = simulate(call_s, flush_s, budget_s, target_rel_ci=0.0)
    assert spent <= (1.0 + BUDGET_TOLERANCE) * budget_s
    assert result.budget_note == ""
    assert result.stats.n >= CPU_MIN_SAMPLES_FLOOR
    # target 0: only the budget or max_samples can stop it
    assert result.stop_reason in ("time-budget", "max-samples")
    if result.stop_reason == "max-samples":
        assert result.stats.n == 5000
        return
    # The budget is used, not wasted: sampling ran to within one sample of the deadline.
    assert spent >= budget_s - 1.05 * (call_s * result.calls_per_sample + flush_s) - 1e-9


def test_the_old_plan_overran_this_budget() -> None:
    """The case behind the 1.54x: 3 ms calls, a 10 ms flush, 0.1 s. The old plan took a
    separate flush, 5 flushed estimate calls, a warm-up sample and 5 samples = 12 flushes
    (0.156 s); now the estimate is warm-up and the warm-up leaves room for the floor."""
    result, spent, calls = simulate(3e-3, 10e-3, 0.1, target_rel_ci=0.0)
    assert spent <= 0.1 * (1.0 + BUDGET_TOLERANCE)
    assert result.stats.n >= CPU_MIN_SAMPLES_FLOOR
    assert calls == 1 + (result.warmup_runs - 1) + result.stats.n


def test_a_budget_too_short_for_the_floor_is_overrun_and_says_so() -> None:
    """An 81 ms flush (a 256 MiB last-level cache) and a 0.1 s budget: the floor of 5
    samples is kept (the gate needs it) and the result says how long a budget it needs."""
    result, spent, _ = simulate(1e-3, 81e-3, 0.1)
    assert result.stats.n == CPU_MIN_SAMPLES_FLOOR
    assert spent > 0.1 * (1.0 + BUDGET_TOLERANCE)
    assert "overrun" in result.budget_note
    assert "--kernelpro-time-budget" in result.budget_note
    # What took the time: the flush is named with its cost, and turning it off is the fix.
    assert "the cache flush (0 MiB) 81 ms" in result.budget_note
    assert re.search(r"the kernel (0\.9\d*|1|1\.0\d*) ms", result.budget_note)
    assert "Use --kernelpro-cpu-flush=off or a larger budget" in result.budget_note
    assert f"{CPU_MIN_SAMPLES_FLOOR} samples" in result.budget_note


def test_a_kernel_too_slow_for_the_floor_in_the_budget_is_no_overrun() -> None:
    """0.3 s calls and a 1 s budget: the floor of 5 samples is the kernel's own need (a slow
    kernel, the normal state of a large problem on a CPU), so no note; the time stays within
    that need."""
    result, spent, _ = simulate(0.3, 0.0, 1.0, noisy=False)
    assert result.stats.n == CPU_MIN_SAMPLES_FLOOR
    assert spent > 1.0 * (1.0 + BUDGET_TOLERANCE)
    assert result.budget_note == ""
    assert spent <= (1.0 + BUDGET_TOLERANCE) * (0.3 + (2 + CPU_MIN_SAMPLES_FLOOR) * 0.3)


def test_a_slow_kernel_with_a_slower_flush_still_says_the_flush_overran() -> None:
    """The attack on that rule: a slow kernel must not hide what the timer added. 0.3 s
    calls and a 0.4 s flush per sample: past the kernel's own need, the flush is named."""
    result, _, _ = simulate(0.3, 0.4, 1.0, noisy=False)
    assert result.stats.n == CPU_MIN_SAMPLES_FLOOR
    assert "overrun" in result.budget_note
    assert "the cache flush (0 MiB) 400 ms" in result.budget_note
    assert "Use --kernelpro-cpu-flush=off or a larger budget" in result.budget_note


def test_an_overrun_by_a_slow_first_call_names_the_first_call() -> None:
    """The attack on the note: a budget overrun by the first call (a compile, a lazy load)
    must not be blamed on the flush or the samples."""
    from pytest_kernelpro.measure.timing.cpu import overrun_note

    note = overrun_note(
        1.0, 4.2, first_call_s=3.5, warmup_s=0.2, warmup_samples=5, sampling_s=0.5,
        samples=20, floor=5, sample_wall_s=0.025, kernel_s=0.02, flush_s=0.0, flush_bytes=0,
    )  # fmt: skip
    assert "the first call took 3.5 s" in note
    assert "flush" not in note
    assert "Use a larger budget" in note
    assert "at least 3.7 s" in note  # 3.5 s first call + 7 samples of 25 ms, +20%


def test_warm_up_never_takes_the_floors_room() -> None:
    """A 20 ms call, a 0.2 s budget, a 1 s warm-up asked for: the warm-up is cut to 20% of
    the budget and to what leaves the floor room, so no warm-up call beyond the estimate."""
    result, spent, _ = simulate(20e-3, 0.0, 0.2, warmup_ms=1000.0, target_rel_ci=0.0)
    assert spent <= 0.2 * (1.0 + BUDGET_TOLERANCE)
    assert result.stats.n >= CPU_MIN_SAMPLES_FLOOR
    assert result.warmup_runs <= 1 + 2


def test_converged_stops_before_the_budget() -> None:
    """A perfectly steady kernel converges in the first round (zero-width CI)."""
    result, spent, _ = simulate(1e-3, 0.0, 2.0, noisy=False)
    assert result.stop_reason == "converged"
    assert spent < 0.5
