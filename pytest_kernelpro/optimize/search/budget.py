"""The search budget: candidate evaluations, wall time, API spend; whichever ends first.

`parse_budget` is the `type=` of `--kernelpro-optimize=BUDGET`; it raises `BudgetError`,
which is both a `KernelproConfigError` and an `argparse.ArgumentTypeError`, so argparse (and
pytest's option parser) print its message as a usage error.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError

OPTION = "--kernelpro-optimize"
EXAMPLES = "20, 30m, 1h30m, 90s, 5usd, $5 or 20,30m,5usd"

_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_EVALS = re.compile(r"^(\d+)(?:evals?|evaluations?|candidates?)?$")
_USD = re.compile(rf"^(?:\${_NUMBER}|{_NUMBER}\$|{_NUMBER}usd)$")
_DURATION = re.compile(
    rf"^(?:{_NUMBER}h)?(?:{_NUMBER}(?:m|min))?(?:{_NUMBER}s)?$",
)


_KIND_NAMES = {
    "max_evaluations": "evaluation count",
    "max_seconds": "wall time",
    "max_usd": "API spend",
}


class BudgetError(KernelproConfigError, argparse.ArgumentTypeError):
    """A budget string that cannot be parsed; usable as an argparse `type=` error."""


@dataclass(frozen=True)
class Budget:
    """Limits of one search. None means "no limit of this kind"; at least one is set."""

    max_evaluations: int | None = None
    max_seconds: float | None = None
    max_usd: float | None = None

    def __str__(self) -> str:
        parts = []
        if self.max_evaluations is not None:
            parts.append(f"{self.max_evaluations} evaluations")
        if self.max_seconds is not None:
            parts.append(_format_seconds(self.max_seconds))
        if self.max_usd is not None:
            parts.append(f"${self.max_usd:.2f}")
        return ", ".join(parts) or "unlimited"

    def to_dict(self) -> dict[str, Any]:
        """The limits as a dict (the trajectory header)."""
        return {
            "max_evaluations": self.max_evaluations,
            "max_seconds": self.max_seconds,
            "max_usd": self.max_usd,
        }


def _format_seconds(seconds: float) -> str:
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(
        f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if value
    )


def _fail(text: str, where: str, detail: str) -> BudgetError:
    return BudgetError(
        f"Invalid budget {text!r} from {where}: {detail}. Give a number of candidate "
        f"evaluations, a wall time or an API spend, alone or comma-separated, e.g. {EXAMPLES}."
    )


def _parse_part(part: str, text: str, where: str) -> tuple[str, float]:
    token = part.replace(" ", "").lower()
    if not token:
        raise _fail(text, where, "an empty item")
    match = _EVALS.match(token)
    if match:
        return "max_evaluations", float(match.group(1))
    match = _USD.match(token)
    if match:
        value = next(g for g in match.groups() if g is not None)
        return "max_usd", float(value)
    match = _DURATION.match(token)
    if match and any(g is not None for g in match.groups()):
        hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
        return "max_seconds", hours * 3600.0 + minutes * 60.0 + seconds
    raise _fail(text, where, f"{part.strip()!r} is not a count, a duration or an amount")


def parse_budget(text: str, *, where: str = OPTION) -> Budget:
    """Parse `"20"`, `"30m"`, `"1h30m"`, `"90s"`, `"5usd"`, `"$5"` or a comma-separated mix.

    A plain integer is a number of candidate evaluations; `h`/`m`/`min`/`s` make a wall time;
    `usd` or `$` an API spend. Each kind may appear once; every value must be positive.
    """
    if not isinstance(text, str) or not text.strip():
        raise _fail(str(text), where, "the budget is empty")
    values: dict[str, float] = {}
    for part in text.split(","):
        kind, value = _parse_part(part, text, where)
        if kind in values:
            raise _fail(text, where, f"the {_KIND_NAMES[kind]} is given twice")
        if not math.isfinite(value) or value <= 0:
            raise _fail(text, where, f"{part.strip()!r} must be greater than zero")
        values[kind] = value
    evals = values.get("max_evaluations")
    return Budget(
        max_evaluations=None if evals is None else int(evals),
        max_seconds=values.get("max_seconds"),
        max_usd=values.get("max_usd"),
    )


class BudgetTracker:
    """Counts what a search has spent against a `Budget`.

    `clock` returns seconds (monotonic); tests inject a fake one. `spent_*` start a resumed
    search where its trajectory left off.
    """

    def __init__(
        self,
        budget: Budget,
        *,
        clock: Callable[[], float] = time.monotonic,
        spent_evaluations: int = 0,
        spent_seconds: float = 0.0,
        spent_usd: float = 0.0,
    ) -> None:
        self.budget = budget
        self._clock = clock
        self.evaluations = spent_evaluations
        self.usd = spent_usd
        self._seconds_before = spent_seconds  # spent by earlier sessions of a resumed search
        self._started: float | None = None

    def start(self) -> None:
        """Start the wall clock (idempotent)."""
        if self._started is None:
            self._started = self._clock()

    @property
    def seconds(self) -> float:
        """Wall time spent so far, including earlier sessions of a resumed search."""
        if self._started is None:
            return self._seconds_before
        return self._seconds_before + (self._clock() - self._started)

    def record_evaluation(self) -> None:
        """Count one evaluated candidate."""
        self.evaluations += 1

    def add_cost(self, usd: float) -> None:
        """Add API spend (of generating candidates)."""
        self.usd += max(0.0, float(usd))

    def one_evaluation_left(self) -> bool:
        """Whether the evaluation budget has room for exactly one more evaluation."""
        limit = self.budget.max_evaluations
        return limit is not None and self.evaluations + 1 >= limit

    def exhausted(self, kinds: tuple[str, ...] = ("evaluations", "seconds", "usd")) -> str | None:
        """Why the budget is spent (for the kinds checked), or None while some is left."""
        b = self.budget
        if "evaluations" in kinds and b.max_evaluations is not None:
            if self.evaluations >= b.max_evaluations:
                return f"evaluation budget spent ({self.evaluations}/{b.max_evaluations})"
        if "seconds" in kinds and b.max_seconds is not None:
            if self.seconds >= b.max_seconds:
                return f"time budget spent ({self.seconds:.1f}s/{b.max_seconds:g}s)"
        if "usd" in kinds and b.max_usd is not None:
            if self.usd >= b.max_usd:
                return f"API budget spent (${self.usd:.2f}/${b.max_usd:.2f})"
        return None
