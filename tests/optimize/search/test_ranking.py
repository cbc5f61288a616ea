"""The end-of-search ranking: re-measured contenders against the current kernel."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.search.ranking import (
    RankedCandidate,
    SearchRanking,
    pick_contenders,
    rank,
)


def _samples(median: float, n: int = 300, spread: float = 0.02, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    # Timing noise only ever adds time: a floor plus a right-skewed tail.
    return list(median * (1 - spread) + rng.gamma(2.0, median * spread / 2, size=n))


def _cand(node_id: int, speedup: float | None, code: str | None = None) -> RankedCandidate:
    return RankedCandidate(node_id=node_id, code=code or f"code {node_id}", search_speedup=speedup)


def test_clear_winner_is_ranked_first_and_speedup_is_against_the_current_kernel():
    current = _samples(100e-6, seed=1)
    fast = (_cand(3, 1.4), _samples(70e-6, seed=2))
    same = (_cand(5, 1.5), _samples(100e-6, seed=3))  # luckiest in the search, not faster
    result = rank("k", [same, fast], current, rounds=5, reference_samples=_samples(140e-6))
    assert result.status == "improved"
    assert result.winner is not None
    assert result.winner.node_id == 3
    assert result.winner.speedup_vs_current == pytest.approx(100 / 70, rel=0.03)
    assert result.winner.speedup_vs_reference == pytest.approx(140 / 70, rel=0.03)
    assert [c.node_id for c in result.remeasured] == [3, 5]
    assert result.candidates[1].verdict == "no clear difference"


def test_noise_alone_gives_no_improvement_found():
    current = _samples(100e-6, seed=1)
    contenders = [(_cand(i, 1.2 + i / 10), _samples(99e-6, seed=10 + i)) for i in range(4)]
    result = rank("k", contenders, current, rounds=4)
    assert result.status == "no improvement found"
    assert result.winner is None
    assert "current kernel stays" in result.reason


def test_median_moved_by_interference_but_not_the_fastest_calls_is_not_a_win():
    rng = np.random.default_rng(7)
    # Same floor; the current kernel's run was disturbed (half its calls 20-60% longer).
    floor = list(100e-6 + rng.uniform(0, 1e-6, 300))
    current = floor[:150] + list(100e-6 * rng.uniform(1.2, 1.6, 150))
    contender = list(100e-6 + rng.uniform(0, 1e-6, 300))
    result = rank("k", [(_cand(1, 2.0), contender)], current, rounds=3, threshold=0.05)
    only = result.candidates[0]
    assert only.change is not None
    assert only.change < -0.05
    assert result.status == "no improvement found"
    assert "fastest calls are not" in only.reason


def test_failed_remeasurement_is_kept_and_labelled():
    result = rank("k", [(_cand(1, 2.0), [])], _samples(1e-3), rounds=2)
    assert result.status == "no improvement found"
    assert result.candidates[0].verdict == "failed"


def test_no_candidates_and_bad_input():
    assert rank("k", [], _samples(1e-3), rounds=1).status == "no correct candidate"
    with pytest.raises(KernelproError, match="no finite positive timing sample"):
        rank("k", [], [], rounds=1)
    with pytest.raises(KernelproError, match="alpha"):
        rank("k", [], _samples(1e-3), rounds=1, alpha=1.5)


def test_pick_contenders_takes_at_least_three_and_every_faster_one():
    cands = [_cand(i, s) for i, s in enumerate([0.5, 1.3, 0.9, 1.1, 1.2, 0.7, 1.05], 1)]
    picked = pick_contenders(cands, current_speedup=1.0)
    assert [c.node_id for c in picked] == [2, 5, 4, 7]  # all four faster than 1.0
    picked = pick_contenders(cands, current_speedup=1.25)
    assert [c.node_id for c in picked] == [2, 5, 4]  # one faster, at least three
    dupes = [_cand(1, 1.5, "same"), _cand(2, 1.4, "same"), _cand(3, 1.2)]
    assert [c.node_id for c in pick_contenders(dupes)] == [1, 3]


def test_round_trip_through_json():
    current = _samples(100e-6, seed=1)
    result = rank(
        "k",
        [(_cand(3, 1.4), _samples(70e-6, seed=2))],
        current,
        rounds=5,
        evaluations=9,
        stop_reason="evaluations",
        wall_s={"generate": 1.0, "profile": 2.5},
    )
    data = result.to_dict()
    assert data["winner"] == 3
    again = SearchRanking.from_dict(data)
    assert again == result
    assert SearchRanking.not_run("k", "no budget").status == "not run"
    with pytest.raises(KernelproError, match="status"):
        SearchRanking(kernel="k", status="best", reason="")
