"""Hand-written bootstrap CI of the median (measure/timing/budget.py) against scipy.stats.bootstrap.

The adaptive timer computes the 95% percentile-bootstrap interval of the median after every
sampling round (O(log n) times per kernel, up to n=5000 samples), so its cost is paid per
kernel. Same resample count (1000) and method (percentile) on both sides; timings are the
median of `--repeats` calls each, on lognormal "timing-like" samples. Also prints the two
intervals (they differ only by their random resamples).

    python bench/trials/bootstrap_speed.py --out bench/results/raw/2026-12-01-bootstrap-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import scipy  # noqa: E402
from scipy import stats as sps  # noqa: E402

from pytest_kernelpro.measure.timing.budget import bootstrap_median_ci  # noqa: E402


def scipy_ci(x: np.ndarray) -> tuple[float, float]:
    res = sps.bootstrap(
        (x,), np.median, n_resamples=1000, confidence_level=0.95, method="percentile",
        vectorized=True, axis=-1, random_state=np.random.default_rng(0),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for n in (20, 100, 1000, 5000):
        x = np.sort(np.random.default_rng(n).lognormal(np.log(1e-4), 0.05, n))
        ours = best_of(lambda x=x: bootstrap_median_ci(x), args.repeats)
        theirs = best_of(lambda x=x: scipy_ci(x), args.repeats)
        row = {"n": n, "hand_s": ours, "scipy_s": theirs, "ratio": theirs / ours,
               "hand_ci": bootstrap_median_ci(x), "scipy_ci": scipy_ci(x),
               "median": float(np.median(x))}  # fmt: skip
        rows.append(row)
        print(f"n={n:5}  hand {ours * 1e3:8.2f} ms  scipy {theirs * 1e3:8.2f} ms  "
              f"scipy/hand {row['ratio']:5.2f}x  hand CI {row['hand_ci'][0]:.4e}..{row['hand_ci'][1]:.4e}"
              f"  scipy CI {row['scipy_ci'][0]:.4e}..{row['scipy_ci'][1]:.4e}")  # fmt: skip
    # The rounds of one kernel that runs to max_samples: 20, doubling, rounds capped at 1000.
    ns, n = [], 20
    while n < 5000:
        ns.append(n)
        n = min(5000, n + min(n, 1000))
    ns.append(5000)
    xs = [np.sort(np.random.default_rng(k).lognormal(np.log(1e-4), 0.05, k)) for k in ns]
    ours = best_of(lambda: [bootstrap_median_ci(x) for x in xs], 3)
    theirs = best_of(lambda: [scipy_ci(x) for x in xs], 3)
    print(f"one kernel to 5000 samples ({len(ns)} rounds): hand {ours * 1e3:.0f} ms  "
          f"scipy {theirs * 1e3:.0f} ms  scipy/hand {theirs / ours:.2f}x")  # fmt: skip
    rows.append({"n": ns, "hand_s": ours, "scipy_s": theirs, "ratio": theirs / ours})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {os.cpu_count()} CPUs",
            "loadavg": os.getloadavg(), "numpy": np.__version__, "scipy": scipy.__version__,
            "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
