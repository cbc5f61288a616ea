"""Budget parsing (`--kernelpro-optimize=BUDGET`) and tracking."""

from __future__ import annotations

import argparse

import pytest

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.search.budget import Budget, BudgetError, BudgetTracker, parse_budget


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20", Budget(max_evaluations=20)),
        ("20evals", Budget(max_evaluations=20)),
        ("30m", Budget(max_seconds=1800.0)),
        ("30min", Budget(max_seconds=1800.0)),
        ("90s", Budget(max_seconds=90.0)),
        ("1h30m", Budget(max_seconds=5400.0)),
        ("1h 30m", Budget(max_seconds=5400.0)),
        ("1.5h", Budget(max_seconds=5400.0)),
        ("2h", Budget(max_seconds=7200.0)),
        ("5usd", Budget(max_usd=5.0)),
        ("$5", Budget(max_usd=5.0)),
        ("$0.50", Budget(max_usd=0.5)),
        ("5USD", Budget(max_usd=5.0)),
        ("20,30m,5usd", Budget(20, 1800.0, 5.0)),
        (" 5usd , 20 ", Budget(max_evaluations=20, max_usd=5.0)),
    ],
)
def test_good_budgets(text: str, expected: Budget) -> None:
    assert parse_budget(text) == expected


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("abc", "'abc' is not a count, a duration or an amount"),
        ("0", "greater than zero"),
        ("0m", "greater than zero"),
        ("-5", "is not a count"),
        ("2.5", "is not a count"),
        ("1h30", "is not a count"),
        ("20,30", "evaluation count is given twice"),
        ("5usd,$3", "API spend is given twice"),
        ("30m,1h", "wall time is given twice"),
        ("20,", "an empty item"),
        ("5 euros", "is not a count"),
    ],
)
def test_bad_budgets_name_the_text_the_option_and_examples(text: str, detail: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_budget(text)
    message = str(info.value)
    assert repr(text) in message
    assert "--kernelpro-optimize" in message
    assert detail in message
    assert "e.g. 20, 30m, 1h30m, 90s, 5usd, $5 or 20,30m,5usd" in message


def test_budget_error_is_an_argparse_type_error_and_a_config_error() -> None:
    with pytest.raises(BudgetError) as info:
        parse_budget("soon", where="KERNELPRO_OPTIMIZE")
    assert isinstance(info.value, argparse.ArgumentTypeError)
    assert isinstance(info.value, KernelproConfigError)
    assert "from KERNELPRO_OPTIMIZE" in str(info.value)


def test_argparse_reports_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="pytest")
    parser.add_argument("--kernelpro-optimize", type=parse_budget)
    assert parser.parse_args(["--kernelpro-optimize=20,5usd"]).kernelpro_optimize == Budget(
        max_evaluations=20, max_usd=5.0
    )
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--kernelpro-optimize=lots"])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())  # however the usage text is wrapped
    assert "Invalid budget 'lots' from --kernelpro-optimize" in err, err


def test_budget_str_round_trips() -> None:
    budget = parse_budget("20,1h30m,$5")
    assert str(budget) == "20 evaluations, 1h30m, $5.00"
    assert parse_budget(str(budget).replace(" evaluations", "").replace(" ", "")) == budget


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tracker_stops_on_whichever_ends_first() -> None:
    clock = FakeClock()
    tracker = BudgetTracker(parse_budget("3,60s,$1"), clock=clock)
    tracker.start()
    assert tracker.exhausted() is None
    tracker.record_evaluation()
    tracker.add_cost(0.4)
    clock.now += 30
    assert tracker.exhausted() is None
    assert (tracker.evaluations, tracker.seconds, tracker.usd) == (1, 30.0, 0.4)
    tracker.add_cost(0.6)
    assert tracker.exhausted() == "API budget spent ($1.00/$1.00)"
    # Only the kinds asked for are checked (paid candidates still get evaluated).
    assert tracker.exhausted(("evaluations", "seconds")) is None
    clock.now += 31
    assert tracker.exhausted(("evaluations", "seconds")) == "time budget spent (61.0s/60s)"


def test_tracker_counts_evaluations() -> None:
    tracker = BudgetTracker(Budget(max_evaluations=2), clock=FakeClock())
    tracker.start()
    tracker.record_evaluation()
    assert tracker.exhausted() is None
    tracker.record_evaluation()
    assert tracker.exhausted() == "evaluation budget spent (2/2)"


def test_tracker_resumes_from_spent_amounts() -> None:
    clock = FakeClock()
    tracker = BudgetTracker(
        parse_budget("10,100s"),
        clock=clock,
        spent_evaluations=4,
        spent_seconds=90.0,
        spent_usd=1.5,
    )
    assert tracker.seconds == 90.0  # before start: only what earlier sessions spent
    tracker.start()
    clock.now += 5
    assert tracker.seconds == 95.0
    assert tracker.evaluations == 4
    assert tracker.usd == 1.5
    clock.now += 5
    assert tracker.exhausted() == "time budget spent (100.0s/100s)"


def test_negative_cost_is_ignored() -> None:
    tracker = BudgetTracker(Budget(max_usd=1.0))
    tracker.add_cost(-3.0)
    assert tracker.usd == 0.0
