"""The three-tier reward and its options."""

from __future__ import annotations

import math

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.search.interfaces import Evaluation
from pytest_kernelpro.optimize.search.reward import RewardConfig, compute_reward


@pytest.mark.parametrize("status", ["build_error", "run_error", "timeout"])
def test_failures_get_the_lowest_tier(status: str) -> None:
    assert compute_reward(Evaluation(status=status)) == -3.0


@pytest.mark.parametrize("status", ["wrong", "cheat"])
def test_wrong_and_rejected_get_the_middle_tier(status: str) -> None:
    assert compute_reward(Evaluation(status=status, speedup=50.0)) == -2.0


@pytest.mark.parametrize("speedup", [1.0, 2.0, 0.5, 25.0])
def test_correct_gets_log_speedup(speedup: float) -> None:
    got = compute_reward(Evaluation(status="correct", speedup=speedup))
    assert got == pytest.approx(math.log(speedup))


def test_slow_correct_is_floored_above_wrong() -> None:
    slow = compute_reward(Evaluation(status="correct", speedup=0.01))  # ln = -4.6
    assert slow == -1.9
    assert slow > compute_reward(Evaluation(status="wrong"))


@pytest.mark.parametrize("speedup", [None, 0.0, -1.0, math.nan, math.inf])
def test_correct_without_usable_speedup_gets_the_floor(speedup: float | None) -> None:
    assert compute_reward(Evaluation(status="correct", speedup=speedup)) == -1.9


def test_tiers_are_options() -> None:
    cfg = RewardConfig(failure=-10.0, wrong=-5.0, floor=-4.0)
    assert compute_reward(Evaluation(status="timeout"), cfg) == -10.0
    assert compute_reward(Evaluation(status="wrong"), cfg) == -5.0
    assert compute_reward(Evaluation(status="correct", speedup=0.01), cfg) == -4.0
    assert cfg.to_dict() == {"failure": -10.0, "wrong": -5.0, "floor": -4.0}


@pytest.mark.parametrize(("floor", "wrong"), [(-2.0, -2.0), (-2.5, -2.0)])
def test_floor_at_or_below_wrong_is_rejected_naming_both(floor: float, wrong: float) -> None:
    with pytest.raises(KernelproConfigError) as info:
        RewardConfig(wrong=wrong, floor=floor)
    message = str(info.value)
    assert f"floor={floor}" in message
    assert f"wrong={wrong}" in message


def test_failure_above_wrong_is_rejected() -> None:
    with pytest.raises(KernelproConfigError, match=r"failure=-1.0 must not be above wrong=-2.0"):
        RewardConfig(failure=-1.0)


def test_non_finite_tier_is_rejected() -> None:
    with pytest.raises(KernelproConfigError, match="failure=-inf"):
        RewardConfig(failure=-math.inf)


def test_unknown_status_is_rejected() -> None:
    with pytest.raises(ValueError, match="crashed"):
        Evaluation(status="crashed")  # type: ignore[arg-type]
