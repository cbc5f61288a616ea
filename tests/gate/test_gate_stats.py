"""The gate's statistics: Mann-Whitney U against known values and scipy, the subsample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_kernelpro.gate.baseline import quantile_subsample
from pytest_kernelpro.gate.verdict import mann_whitney_u
from pytest_kernelpro.gate.verdict_basis import median


def test_exact_p_value_of_complete_separation() -> None:
    # 5 vs 5 with every x above every y: one arrangement in C(10, 5) = 252.
    res = mann_whitney_u([6, 7, 8, 9, 10], [1, 2, 3, 4, 5], "greater")
    assert res.method == "exact"
    assert res.u == 25
    assert res.p_value == pytest.approx(1 / 252)
    assert mann_whitney_u([6, 7, 8, 9, 10], [1, 2, 3, 4, 5], "less").p_value == pytest.approx(1.0)
    two = mann_whitney_u([6, 7, 8, 9, 10], [1, 2, 3, 4, 5], "two-sided").p_value
    assert two == pytest.approx(2 / 252)


def test_exact_small_table_by_enumeration() -> None:
    # n_x = 2, n_y = 3: U takes 0..6 with counts 1,1,2,2,2,1,1 (10 arrangements).
    x, y = [2.5, 4.5], [1.0, 2.0, 3.0]  # x beats 2 + 3 = 5 of the y's
    res = mann_whitney_u(x, y, "greater")
    assert res.u == 5
    assert res.p_value == pytest.approx(2 / 10)


def test_ties_use_the_normal_approximation_and_equal_samples_give_no_evidence() -> None:
    same = [1.0] * 30
    res = mann_whitney_u(same, same, "greater")
    assert res.method == "normal"
    assert res.p_value == 1.0
    tied = mann_whitney_u([1, 1, 2, 2, 3], [1, 2, 2, 3, 3], "greater")
    assert tied.method == "normal"
    assert 0.5 < tied.p_value <= 1.0


def test_empty_sample_is_not_evidence() -> None:
    assert mann_whitney_u([], [1.0, 2.0]).p_value == 1.0
    assert mann_whitney_u([1.0, float("nan")], []).p_value == 1.0


def test_large_samples_use_the_normal_approximation() -> None:
    # 200 vs 200 untied: U of complete separation is n_x * n_y, and p is tiny but positive.
    x, y = np.arange(200.0) + 1000, np.arange(200.0)
    res = mann_whitney_u(x, y, "greater")
    assert res.method == "normal"
    assert res.u == 200 * 200
    assert 0 < res.p_value < 1e-50
    assert mann_whitney_u(x, y, "less").p_value == pytest.approx(1.0)


def test_p_values_are_uniform_under_the_null() -> None:
    # 400 A/A tests of untied samples: about alpha of them below alpha, not many more.
    rng = np.random.default_rng(7)
    ps = [mann_whitney_u(rng.normal(size=80), rng.normal(size=80)).p_value for _ in range(400)]
    assert sum(p < 0.05 for p in ps) <= 0.05 * 400 * 1.6
    assert sum(p < 0.5 for p in ps) == pytest.approx(200, abs=40)


def test_quantile_subsample_keeps_the_shape() -> None:
    rng = np.random.default_rng(3)
    data = rng.lognormal(0, 0.3, 5000)
    sub = quantile_subsample(data, 200)
    assert len(sub) == 200
    assert sub == sorted(sub)
    assert median(sub) == pytest.approx(float(np.median(data)), rel=0.01)
    assert np.quantile(sub, 0.9) == pytest.approx(float(np.quantile(data, 0.9)), rel=0.02)
    assert quantile_subsample(data, 200) == sub  # deterministic
    assert quantile_subsample([3.0, 1.0, 2.0], 200) == [1.0, 2.0, 3.0]  # short: all kept


def test_median_ignores_non_finite() -> None:
    assert median([1.0, 2.0, float("nan"), 3.0]) == 2.0
    assert math.isnan(median([]))
