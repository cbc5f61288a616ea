"""The three-tier reward that ranks every node of the search tree.

Tiers (seed, "Backpropagation requires a scalar reward signal..."): a candidate that does not
build or does not run gets `failure` (-3.0), one that runs but is wrong (or is rejected as a
cheat) gets `wrong` (-2.0), a correct one gets ln(speedup) floored at `floor` (-1.9). The
seed fixes -2.0 and the logarithm; -3.0 and -1.9 are this project's choices, so that a
failure ranks below a wrong answer and any correct solution, however slow, ranks above any
wrong one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.search.interfaces import FAILURE_STATUSES, WRONG_STATUSES

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.interfaces import Evaluation


@dataclass(frozen=True)
class RewardConfig:
    """The three reward tiers; validated on construction."""

    failure: float = -3.0  # build error, run error (crash, illegal address, OOM), timeout
    wrong: float = -2.0  # wrong result or rejected cheat
    floor: float = -1.9  # lowest reward of a correct candidate (ln of a 0.15x speedup)

    def __post_init__(self) -> None:
        for name in ("failure", "wrong", "floor"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise KernelproConfigError(
                    f"Invalid reward {name}={value!r}: every reward tier must be a finite number."
                )
        if not self.floor > self.wrong:
            raise KernelproConfigError(
                f"Invalid reward tiers: floor={self.floor} must be above wrong={self.wrong}, "
                "otherwise a slow correct candidate could rank at or below a wrong one; "
                f"use e.g. floor={self.wrong + 0.1:g}."
            )
        if self.failure > self.wrong:
            raise KernelproConfigError(
                f"Invalid reward tiers: failure={self.failure} must not be above "
                f"wrong={self.wrong} (a crash must not outrank a wrong answer); "
                f"use e.g. failure={self.wrong - 1.0:g}."
            )

    def to_dict(self) -> dict[str, Any]:
        """The tiers as a dict (the trajectory header)."""
        return asdict(self)


def compute_reward(evaluation: Evaluation, config: RewardConfig | None = None) -> float:
    """The reward of one evaluated candidate under `config` (default tiers when None).

    A correct candidate without a usable speedup (missing, zero, negative or not finite)
    gets the floor: it is correct, but nothing says it is fast.
    """
    cfg = config or RewardConfig()
    if evaluation.status in FAILURE_STATUSES:
        return cfg.failure
    if evaluation.status in WRONG_STATUSES:
        return cfg.wrong
    speedup = evaluation.speedup
    if speedup is None or not math.isfinite(speedup) or speedup <= 0.0:
        return cfg.floor
    return max(cfg.floor, math.log(speedup))
