"""Statistics the gate needs: the Mann-Whitney U test and a quantile-preserving subsample.

Written with numpy only, because scipy is not a dependency of pytest-kernelpro. The test
suite checks `mann_whitney_u` against `scipy.stats.mannwhitneyu` where scipy is installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

Alternative = Literal["greater", "less", "two-sided"]

# Exact null distribution when there are no ties and both samples are at most this large
# (the counting table is (n_x*n_y+1) long; 60x60 is 3601 floats per row, milliseconds).
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


def _rankdata(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) and the sizes of the tie groups."""
    import numpy as np

    order = np.argsort(values, kind="mergesort")
    sorted_vals = values[order]
    # Boundaries of runs of equal values.
    new_group = np.concatenate(([True], sorted_vals[1:] != sorted_vals[:-1]))
    group_id = np.cumsum(new_group) - 1
    counts = np.bincount(group_id)
    ends = np.cumsum(counts)  # 1-based rank of the last member of each group
    starts = ends - counts + 1
    avg = (starts + ends) / 2.0
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = avg[group_id]
    return ranks, counts


def _exact_sf(u: float, n_x: int, n_y: int) -> float:
    """P(U >= u) under H0 for untied samples, from the exact counting distribution.

    counts[k] = number of arrangements of n_x x-values among n_y y-values with U = k, built
    by adding one element at a time (f(n, m) = f(n-1, m) shifted by m + f(n, m-1)). All terms
    are positive sums, so float64 loses nothing that matters for a p-value.
    """
    import numpy as np

    size = n_x * n_y + 1
    # table[m] = distribution for (i, m) for the current i, m = 0..n_y
    table = [np.zeros(size) for _ in range(n_y + 1)]
    for m in range(n_y + 1):
        table[m][0] = 1.0  # i = 0: U is always 0
    for _i in range(1, n_x + 1):
        new = [np.zeros(size) for _ in range(n_y + 1)]
        new[0][0] = 1.0  # m = 0: U is always 0
        for m in range(1, n_y + 1):
            shifted = np.zeros(size)
            shifted[m:] = table[m][: size - m]  # the new x is above all m y-values
            new[m] = shifted + new[m - 1]
        table = new
    dist = table[n_y]
    total = dist.sum()
    k = int(math.ceil(u - 1e-9))
    if k <= 0:
        return 1.0
    if k >= size:
        return 0.0
    return float(dist[k:].sum() / total)


def mann_whitney_u(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    alternative: Alternative = "greater",
) -> MannWhitneyResult:
    """Mann-Whitney U test of x against y (the test asv uses to call a benchmark changed).

    `alternative="greater"`: H1 is that x tends to be larger than y (for timings: x is
    slower). Exact p-value without ties and with both samples at most `EXACT_MAX_N` long;
    otherwise the normal approximation with tie correction and continuity correction (as
    scipy does). Returns p = 1.0 when either sample is empty.
    """
    import numpy as np

    xs, ys = _as_array(x), _as_array(y)
    n_x, n_y = len(xs), len(ys)
    if n_x == 0 or n_y == 0:
        return MannWhitneyResult(u=float("nan"), p_value=1.0, method="none")
    ranks, tie_counts = _rankdata(np.concatenate([xs, ys]))
    u_x = float(ranks[:n_x].sum() - n_x * (n_x + 1) / 2.0)
    u_y = n_x * n_y - u_x
    has_ties = bool((tie_counts > 1).any())
    if not has_ties and n_x <= EXACT_MAX_N and n_y <= EXACT_MAX_N:
        if alternative == "greater":
            p = _exact_sf(u_x, n_x, n_y)
        elif alternative == "less":
            p = _exact_sf(u_y, n_x, n_y)
        else:
            p = min(1.0, 2.0 * _exact_sf(max(u_x, u_y), n_x, n_y))
        return MannWhitneyResult(u=u_x, p_value=p, method="exact")
    n = n_x + n_y
    mean = n_x * n_y / 2.0
    tie_term = float((tie_counts**3 - tie_counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    var = n_x * n_y / 12.0 * ((n + 1) - tie_term)
    if var <= 0:  # every value identical: no evidence either way
        return MannWhitneyResult(u=u_x, p_value=1.0, method="normal")
    sd = math.sqrt(var)
    if alternative == "greater":
        z = (u_x - mean - 0.5) / sd
        p = 0.5 * math.erfc(z / math.sqrt(2.0))
    elif alternative == "less":
        z = (u_x - mean + 0.5) / sd
        p = 0.5 * math.erfc(-z / math.sqrt(2.0))
    else:
        z = (abs(u_x - mean) - 0.5) / sd
        p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return MannWhitneyResult(u=u_x, p_value=min(1.0, max(0.0, p)), method="normal")


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
