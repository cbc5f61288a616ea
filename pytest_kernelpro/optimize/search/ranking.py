"""The result of a search a user can trust: candidates re-measured against the current kernel.

A search measures each candidate once, against the reference, at its own node; one
`torch.softmax` candidate measured 1.42x, 1.14x, 0.84x and 0.47x at four nodes, so a single
sample is not a result and the fastest single sample is mostly the luckiest one. At the end
of a search the top candidates (`pick_contenders`: at least `MIN_CONTENDERS`, or every one
faster than the current kernel in the search) are therefore timed again, interleaved with the
user's current kernel on the same device (round r times the current kernel and every
contender, in an order rotated per round, so a clock or thermal drift reaches all of them
alike), and `rank` decides with the gate's rule (`gate/verdict.py`):

1. effect: the contender's median is at least `threshold` below the current kernel's;
2. the whole distribution moved: the lower decile (fastest 10% of calls) is too;
3. statistical clarity: a one-sided Mann-Whitney U test (contender faster) gives p below
   alpha / k, Bonferroni-corrected for the k contenders compared against one current kernel.

The winner is the fastest contender that passes all three; when none does, the result says
"no improvement found" rather than naming the luckiest measurement.

On a GPU, a candidate the search measured at under `FAR_SLOWER` (half) the current kernel's speed is
not re-measured (`drop_far_slower`): it could win only if the search's measurement were off
by more than 2x, where the largest spread of one kernel's time between processes measured on
the H200 was 14% (`optimize/sandbox/confirm.py`), and its worker would cost the re-measurement a
process start, a build and a share of the timing budget. It stays in the ranking, "not
re-measured", with the reason. The re-measurement's own cost (seconds, rounds, samples per
contender and round, its budget) is in `cost`.

The speedup shown first is against the user's current kernel (what they would replace), the
speedup against the reference second. `SearchRanking` is plain frozen data (JSON through
`to_dict` / `from_dict`) so reports, patches and PR tables render from it without the search.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from pytest_kernelpro.errors import KernelproError

RankingStatus = Literal["improved", "no improvement found", "no correct candidate", "not run"]
Verdict = Literal["faster", "no clear difference", "slower", "not re-measured", "failed"]
RANKING_STATUSES: tuple[str, ...] = (
    "improved",
    "no improvement found",
    "no correct candidate",
    "not run",
)

MIN_CONTENDERS = 3  # re-measured at least this many (or every one faster in the search)
MAX_CONTENDERS = 8  # and at most this many: each costs a share of the final timing
DEFAULT_THRESHOLD = 0.05  # the gate's default regression threshold, mirrored for improvements
DEFAULT_ALPHA = 0.01  # the gate's default significance level
LOW_QUANTILE = 0.10  # the fastest calls must move too (gate/verdict.py, rule 3)
TEST_SAMPLES = 200  # both sides reduced to this many quantiles before the U test (as the gate)
FAR_SLOWER = 0.5  # not re-measured below this fraction of the current kernel's speed
RANKING_BUDGET_S = (
    6.0  # timing seconds of the whole final re-measurement (optimize/sandbox/remeasure.py)
)


@dataclass(frozen=True)
class Timing:
    """One contender's re-measured per-call times (seconds), pooled over the rounds."""

    median_s: float
    low_s: float  # the LOW_QUANTILE quantile
    n: int
    rounds: int

    @classmethod
    def of(cls, samples_s: Sequence[float], rounds: int) -> Timing:
        """Summary of pooled samples; no finite positive sample is a `KernelproError`."""
        import numpy as np

        x = np.asarray([float(s) for s in samples_s], dtype=float)
        x = x[np.isfinite(x) & (x > 0)]
        if x.size == 0:
            raise KernelproError(
                "re-measurement produced no finite positive timing sample; the kernel did not "
                "run or the timer failed"
            )
        return cls(
            median_s=float(np.median(x)),
            low_s=float(np.quantile(x, LOW_QUANTILE)),
            n=int(x.size),
            rounds=rounds,
        )


@dataclass(frozen=True)
class RankedCandidate:
    """One candidate of the search, as the ranking sees it.

    `speedup_vs_current` = current kernel's median / this median, and `speedup_vs_reference`
    = reference median / this median, both from the final interleaved re-measurement (None
    when it was not re-measured); `search_speedup` is the single measurement of the search
    (against the reference). `guidance` holds, root first, the profiler guidance each prompt
    on the way to this candidate carried (its ancestors' feedback), `lineage` the node ids.
    """

    node_id: int
    code: str
    strategy: str = ""
    mode: str = ""
    depth: int = 0
    lineage: tuple[int, ...] = ()
    search_speedup: float | None = None
    rank: int | None = None  # 1 = fastest re-measured; None: not re-measured
    verdict: str = "not re-measured"
    reason: str = ""
    median_s: float | None = None
    low_s: float | None = None
    samples: int = 0
    speedup_vs_current: float | None = None
    speedup_vs_reference: float | None = None
    change: float | None = None  # median / current median - 1 (negative: faster)
    change_low: float | None = None  # the same for the lower decile
    p_value: float | None = None  # one-sided: this faster than the current kernel
    guidance: tuple[str, ...] = ()
    profile_s: float | None = None  # profiling this candidate cost (wall seconds)

    @property
    def clear(self) -> bool:
        """True when its improvement over the current kernel is statistically clear."""
        return self.verdict == "faster"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        data = asdict(self)
        data["lineage"] = list(self.lineage)
        data["guidance"] = list(self.guidance)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankedCandidate:
        """Inverse of `to_dict`; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["lineage"] = tuple(int(i) for i in values.get("lineage") or ())
        values["guidance"] = tuple(str(g) for g in values.get("guidance") or ())
        return cls(**values)


@dataclass(frozen=True)
class SearchRanking:
    """The ranked outcome of one search (see the module doc).

    `candidates` lists the re-measured contenders in rank order, then the other correct
    candidates by their search speedup. `winner` is the first candidate when its improvement
    is clear, else None (status "no improvement found").
    """

    kernel: str
    status: str  # one of RANKING_STATUSES
    reason: str
    candidates: tuple[RankedCandidate, ...] = ()
    current_median_s: float | None = None
    reference_median_s: float | None = None
    current_samples: int = 0
    baseline: str = "current kernel"  # what speedup_vs_current is relative to
    device: str = ""
    threshold: float = DEFAULT_THRESHOLD
    alpha: float = DEFAULT_ALPHA
    rounds: int = 0
    evaluations: int = 0
    stop_reason: str = ""
    usd: float = 0.0
    wall_s: Mapping[str, float] = field(default_factory=dict)  # generate/build/check/time/profile
    # The final re-measurement's cost: wall, start and rounds seconds, rounds, samples per
    # contender (pooled and per round), the round plan and its budget, why rounds stopped.
    cost: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RANKING_STATUSES:
            raise KernelproError(
                f"SearchRanking status {self.status!r} is not one of {RANKING_STATUSES}"
            )

    @classmethod
    def not_run(cls, kernel: str, reason: str, **search: Any) -> SearchRanking:
        """A search that did not run (no budget, a broken reference, no model)."""
        return cls(kernel=kernel, status="not run", reason=reason, **search)

    @property
    def winner(self) -> RankedCandidate | None:
        """The statistically clear fastest candidate, or None."""
        if self.status != "improved" or not self.candidates:
            return None
        return self.candidates[0]

    @property
    def remeasured(self) -> tuple[RankedCandidate, ...]:
        """The contenders of the final re-measurement, in rank order."""
        return tuple(c for c in self.candidates if c.rank is not None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the `optimize` part of a kernel's record)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["candidates"] = [c.to_dict() for c in self.candidates]
        data["wall_s"] = dict(self.wall_s)
        data["cost"] = dict(self.cost)
        winner = self.winner
        data["winner"] = None if winner is None else winner.node_id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchRanking:
        """Inverse of `to_dict`; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["candidates"] = tuple(
            RankedCandidate.from_dict(c) for c in values.get("candidates") or ()
        )
        values["wall_s"] = {str(k): float(v) for k, v in (values.get("wall_s") or {}).items()}
        values["cost"] = dict(values.get("cost") or {})
        return cls(**values)


def drop_far_slower(
    contenders: Sequence[RankedCandidate],
    *,
    current_speedup: float | None = None,
    ratio: float = FAR_SLOWER,
    baseline: str = "current kernel",
) -> tuple[list[RankedCandidate], list[RankedCandidate]]:
    """(kept, dropped): the contenders the search measured at under `ratio` times the
    current kernel's speed (`current_speedup` over the reference; 1.0 when unknown, so the
    reference is the bar) are dropped, each with the reason (module doc). `ratio` 0 keeps
    every one."""
    if not (math.isfinite(ratio) and 0 <= ratio < 1):
        raise KernelproError(f"ranking far-slower ratio={ratio!r} must be >= 0 and < 1")
    bar = current_speedup if current_speedup and current_speedup > 0 else 1.0
    kept: list[RankedCandidate] = []
    dropped: list[RankedCandidate] = []
    for cand in contenders:
        relative = (cand.search_speedup or 0.0) / bar
        if ratio > 0 and relative < ratio:
            dropped.append(
                _replace(
                    cand,
                    verdict="not re-measured",
                    reason=(
                        f"far slower: the search measured it at {relative:.2f}x the {baseline} "
                        f"(under {ratio:g}x), not re-measured"
                    ),
                )
            )
        else:
            kept.append(cand)
    return kept, dropped


def pick_contenders(
    candidates: Sequence[RankedCandidate],
    *,
    current_speedup: float | None = None,
    minimum: int = MIN_CONTENDERS,
    maximum: int = MAX_CONTENDERS,
) -> list[RankedCandidate]:
    """The candidates to re-measure: by search speedup, at least `minimum`, plus every one
    the search found faster than the current kernel (`current_speedup` = the current kernel's
    speedup over the reference in the same sandbox; 1.0 when unknown), at most `maximum`.
    Identical code is measured once (the first node that produced it)."""
    bar = current_speedup if current_speedup and current_speedup > 0 else 1.0
    seen: set[str] = set()
    ordered = []
    for cand in sorted(
        (c for c in candidates if c.search_speedup is not None),
        key=lambda c: (-(c.search_speedup or 0.0), c.node_id),
    ):
        if cand.code in seen:
            continue
        seen.add(cand.code)
        ordered.append(cand)
    faster = sum(1 for c in ordered if (c.search_speedup or 0.0) > bar)
    return ordered[: max(minimum, min(faster, maximum))][:maximum]


def _test(contender: Sequence[float], current: Sequence[float]) -> float:
    from pytest_kernelpro.gate.baseline import quantile_subsample
    from pytest_kernelpro.gate.verdict import mann_whitney_u

    x = quantile_subsample(contender, TEST_SAMPLES)
    y = quantile_subsample(current, TEST_SAMPLES)
    return mann_whitney_u(x, y, alternative="less").p_value


def rank(
    kernel: str,
    contenders: Sequence[tuple[RankedCandidate, Sequence[float]]],
    current_samples: Sequence[float],
    *,
    rounds: int,
    reference_samples: Sequence[float] = (),
    others: Sequence[RankedCandidate] = (),
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    device: str = "",
    baseline: str = "current kernel",
    errors: Mapping[int, str] | None = None,
    **search: Any,
) -> SearchRanking:
    """Rank re-measured contenders against the current kernel (rules in the module doc).

    `contenders` pairs each candidate with its pooled re-measured samples (an empty sequence:
    it failed when re-measured; `errors` says why, by node id). `others` are correct candidates that were not re-measured.
    `current_samples` are the user's current kernel's; where it could not be measured in the
    sandbox, pass the reference's and `baseline="reference"` (the result says so).
    `search` fills the search totals (evaluations, stop_reason, usd, wall_s).
    """
    if not (0 < alpha < 1):
        raise KernelproError(f"ranking alpha={alpha!r} must be between 0 and 1")
    if not (math.isfinite(threshold) and threshold >= 0):
        raise KernelproError(f"ranking threshold={threshold!r} must be a fraction >= 0")
    current = Timing.of(current_samples, rounds)
    reference = Timing.of(reference_samples, rounds) if reference_samples else None
    k = max(1, len(contenders))
    level = alpha / k
    ranked: list[RankedCandidate] = []
    failed: list[RankedCandidate] = []
    for cand, samples in contenders:
        if not samples:
            why = (errors or {}).get(cand.node_id)
            reason = f"failed when re-measured: {why}" if why else "failed when re-measured"
            failed.append(_replace(cand, verdict="failed", reason=reason))
            continue
        mine = Timing.of(samples, rounds)
        change = mine.median_s / current.median_s - 1.0
        change_low = mine.low_s / current.low_s - 1.0
        p = _test(samples, current_samples)
        if change <= -threshold and change_low <= -threshold and p < level:
            verdict, why = (
                "faster",
                (
                    f"{-change:.1%} faster than the {baseline} (lower decile {-change_low:.1%}), "
                    f"p={p:.2g} < {level:.2g}"
                ),
            )
        elif (
            change >= threshold
            and change_low >= threshold
            and _test(current_samples, samples) < level
        ):
            verdict, why = "slower", f"{change:.1%} slower than the {baseline}"
        else:
            verdict, why = (
                "no clear difference",
                _unclear(change, change_low, p, level, threshold, baseline),
            )
        ranked.append(
            _replace(
                cand,
                verdict=verdict,
                reason=why,
                median_s=mine.median_s,
                low_s=mine.low_s,
                samples=mine.n,
                speedup_vs_current=current.median_s / mine.median_s,
                speedup_vs_reference=None
                if reference is None
                else reference.median_s / mine.median_s,
                change=change,
                change_low=change_low,
                p_value=p,
            )
        )
    # Clear winners first (fastest first), then everything else by re-measured median.
    ranked.sort(key=lambda c: (not c.clear, c.median_s or math.inf, c.node_id))
    ranked = [_replace(c, rank=i) for i, c in enumerate(ranked, 1)]
    rest = sorted(others, key=lambda c: (-(c.search_speedup or 0.0), c.node_id))
    everything = tuple(ranked + failed + list(rest))
    if not ranked and not failed and not rest:
        status, reason = "no correct candidate", "the search produced no correct candidate"
    elif ranked and ranked[0].clear:
        best = ranked[0]
        status = "improved"
        reason = (
            f"candidate {best.node_id} is {best.speedup_vs_current:.3g}x the {baseline} "
            f"({best.reason}; {len(ranked)} contender(s), {rounds} interleaved round(s))"
        )
    else:
        status = "no improvement found"
        reason = (
            f"none of {len(contenders)} re-measured candidate(s) is clearly faster than the "
            f"{baseline} (needs {threshold:.0%} on the median and the lower decile, "
            f"p < {level:.2g}); the current kernel stays"
        )
    return SearchRanking(
        kernel=kernel,
        status=status,
        reason=reason,
        candidates=everything,
        current_median_s=current.median_s,
        reference_median_s=None if reference is None else reference.median_s,
        current_samples=current.n,
        baseline=baseline,
        device=device,
        threshold=threshold,
        alpha=alpha,
        rounds=rounds,
        **search,
    )


def _unclear(
    change: float, change_low: float, p: float, level: float, threshold: float, baseline: str
) -> str:
    if abs(change) < threshold:
        return f"median within {threshold:.0%} of the {baseline} ({change:+.1%})"
    if change < 0 and change_low > -threshold:
        return (
            f"median {-change:.1%} faster but the fastest calls are not ({change_low:+.1%}): "
            "interference, not a faster kernel"
        )
    return f"{change:+.1%} on the median, p={p:.2g} (needs < {level:.2g})"


def _replace(cand: RankedCandidate, **changes: Any) -> RankedCandidate:
    from dataclasses import replace

    return replace(cand, **changes)
