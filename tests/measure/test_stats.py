"""Statistics of timing samples: exact quartiles, bootstrap CI of the median, JSON."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.timing.budget import bootstrap_median_ci, summarize


def test_odd_set_exact_quartiles() -> None:
    st = summarize([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0])
    assert (st.n, st.median_s, st.mean_s, st.min_s, st.max_s) == (9, 5.0, 5.0, 1.0, 9.0)
    # numpy "linear" quartiles of 1..9: positions 2 and 6 (0-based) exactly.
    assert (st.q1_s, st.q3_s, st.iqr_s) == (3.0, 7.0, 4.0)
    assert st.stdev_s == pytest.approx(math.sqrt(7.5))


def test_even_set_interpolated_quartiles() -> None:
    st = summarize([4.0, 1.0, 3.0, 2.0])
    assert st.median_s == 2.5
    assert (st.q1_s, st.q3_s) == (1.75, 3.25)
    assert st.iqr_s == pytest.approx(1.5)


def test_single_sample_has_zero_width_ci() -> None:
    st = summarize([0.003])
    assert st.ci_low_s == st.ci_high_s == st.median_s == 0.003
    assert st.rel_ci_halfwidth == 0.0
    assert st.stdev_s == 0.0


def test_ci_contains_median_and_shrinks_with_n() -> None:
    rng = np.random.default_rng(1)
    small = summarize(rng.lognormal(-7, 0.05, 50).tolist())
    large = summarize(rng.lognormal(-7, 0.05, 5000).tolist())
    for st in (small, large):
        assert st.ci_low_s <= st.median_s <= st.ci_high_s
        assert st.ci_low_s < st.ci_high_s
    # The median's standard error goes as 1/sqrt(n): 100x the samples, ~10x narrower.
    assert large.rel_ci_halfwidth < 0.3 * small.rel_ci_halfwidth
    assert small.rel_ci_halfwidth == pytest.approx(
        (small.ci_high_s - small.ci_low_s) / 2 / small.median_s
    )


def test_same_seed_same_ci_and_identical_samples_zero_width() -> None:
    data = np.random.default_rng(2).normal(1.0, 0.01, 200).tolist()
    assert summarize(data, seed=3) == summarize(data, seed=3)
    flat = summarize([3.648e-6] * 200)  # what event timing of a tiny kernel looks like
    assert flat.rel_ci_halfwidth == 0.0


def test_index_partition_bootstrap_equals_naive_bootstrap() -> None:
    """The sorted-index shortcut must give exactly the textbook bootstrap medians."""
    x = np.sort(np.random.default_rng(4).exponential(1.0, 101))
    low, high = bootstrap_median_ci(x, seed=9, n_boot=500)
    idx = np.random.default_rng(9).integers(0, x.size, size=(500, x.size), dtype=np.int32)
    naive = np.median(x[idx], axis=1)
    assert (low, high) == tuple(np.quantile(naive, [0.025, 0.975]))


@pytest.mark.parametrize("n", [20, 101, 5000])
def test_bootstrap_equals_scipy_stats_bootstrap(n: int) -> None:
    """The hand-written interval is scipy.stats.bootstrap's percentile interval, computed
    faster (1.3-2.8x, bench/results/2026-12-01-bootstrap-speed-cpu.md): same generator, same
    resamples, same quantiles."""
    from scipy import stats as sps

    x = np.sort(np.random.default_rng(n).lognormal(0.0, 0.1, n))
    ours = bootstrap_median_ci(x, seed=3, n_boot=1000)
    res = sps.bootstrap(
        (x,), np.median, n_resamples=1000, confidence_level=0.95, method="percentile",
        vectorized=True, axis=-1, random_state=np.random.default_rng(3),
    )  # fmt: skip
    theirs = (res.confidence_interval.low, res.confidence_interval.high)
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_ci_covers_true_median_about_95_percent() -> None:
    rng = np.random.default_rng(5)
    true_median = math.log(2.0)  # of Exponential(1)
    hits = 0
    for i in range(200):
        st = summarize(rng.exponential(1.0, 101).tolist(), seed=i, n_boot=400)
        hits += st.ci_low_s <= true_median <= st.ci_high_s
    assert 0.88 <= hits / 200 <= 0.995


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, -2.0], [float("inf")]])
def test_invalid_samples_raise(bad: list[float]) -> None:
    with pytest.raises(KernelproError, match="summarize"):
        summarize(bad)


def test_stats_to_dict_is_json_with_every_field() -> None:
    st = summarize([1e-3, 1.1e-3, 0.9e-3, 1.05e-3])
    data = json.loads(json.dumps(st.to_dict(), allow_nan=False))
    assert data == {f.name: getattr(st, f.name) for f in dataclasses.fields(st)}
