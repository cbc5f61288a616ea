"""Statistics the gate needs: the Mann-Whitney U test (`scipy.stats.mannwhitneyu`) and a
quantile-preserving subsample."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

Alternative = Literal["greater", "less", "two-sided"]

# Exact null distribution when there are no ties and both samples are at most this large
# (scipy's exact method stays in milliseconds at 60x60; beyond, the normal approximation is
# within 1e-3 of it).
EXACT_MAX_N = 60


@dataclass(frozen=True)
class MannWhitneyResult:
    """U statistic of the first sample, its p-value, and how the p-value was computed."""

    u: float
    p_value: float
    method: str  # "exact" | "normal"


def _as_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    import numpy as np

    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def mann_whitney_u(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    alternative: Alternative = "greater",
) -> MannWhitneyResult:
    """Mann-Whitney U test of x against y (the test asv uses to call a benchmark changed).

    `alternative="greater"`: H1 is that x tends to be larger than y (for timings: x is
    slower). `scipy.stats.mannwhitneyu` computes it: the exact p-value without ties and with
    both samples at most `EXACT_MAX_N` long, otherwise the normal approximation with tie and
    continuity correction. Returns p = 1.0 when either sample is empty or every value is
    the same (no evidence either way).
    """
    import numpy as np
    from scipy import stats

    xs, ys = _as_array(x), _as_array(y)
    n_x, n_y = len(xs), len(ys)
    if n_x == 0 or n_y == 0:
        return MannWhitneyResult(u=float("nan"), p_value=1.0, method="none")
    both = np.concatenate([xs, ys])
    has_ties = len(np.unique(both)) < len(both)
    exact = not has_ties and n_x <= EXACT_MAX_N and n_y <= EXACT_MAX_N
    if not exact and both.min() == both.max():
        return MannWhitneyResult(u=n_x * n_y / 2.0, p_value=1.0, method="normal")
    result = stats.mannwhitneyu(
        xs, ys, alternative=alternative, method="exact" if exact else "asymptotic"
    )
    p = float(result.pvalue)
    return MannWhitneyResult(
        u=float(result.statistic),
        p_value=min(1.0, max(0.0, p)) if math.isfinite(p) else 1.0,
        method="exact" if exact else "normal",
    )


def quantile_subsample(samples: Sequence[float] | np.ndarray, k: int) -> list[float]:
    """At most `k` values that keep the shape of the sample: its order statistics at the
    mid-ranks (i + 0.5) / k, i = 0..k-1.

    Deterministic (a baseline saved twice from the same samples is the same file) and less
    noisy than a random subsample: the kept values are the sample's own quantiles, so the
    baseline's median, quartiles and tails survive. Because such a sample is more regular
    than an i.i.d. draw, the Mann-Whitney null variance slightly overstates its spread,
    which errs toward "not significant" (a false alarm is the costlier error for a gate).
    """
    import numpy as np

    arr = np.sort(_as_array(samples))
    if len(arr) <= k:
        return [float(v) for v in arr]
    idx = np.floor((np.arange(k) + 0.5) * len(arr) / k).astype(int)
    return [float(v) for v in arr[idx]]


def median(values: Sequence[float] | np.ndarray) -> float:
    """Median of the finite values (NaN when there are none)."""
    import numpy as np

    arr = _as_array(values)
    return float(np.median(arr)) if len(arr) else float("nan")
