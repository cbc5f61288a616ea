"""How often does the gate cry wolf, and how often does it catch a real slowdown?

A memory-bound kernel (c = a + b over N fp32 elements) is timed with the plugin's own
`time_kernel`; its "slow" variants do the same work over N * (1 + s) elements, s = 3%, 5%,
10% (extra work, so the slowdown is real and on the GPU nearly proportional). Each trial:

1. measure A once and keep it as the baseline entry (exactly what --kernelpro-save-baseline
   keeps: quantile-subsampled samples, median of all samples);
2. measure A again (A/A) and, in the first --ab-trials trials, the slow variants (A/B), in a
   random order so slow drifts of the machine hit every variant alike;
3. run `compare` at each threshold; when a verdict asks for it, re-measure that variant
   once and `confirm` (the plugin's flow).

Reported per threshold: the false-alarm rate over the A/A comparisons (a kernel that did not
change but failed the gate), and the detection rate of each slowdown (failed the gate, i.e.
regressed and confirmed), with 95% Wilson intervals, plus how large the slowdowns really
were (the median of the measured change, which on the CPU need not equal the nominal one).

Run:  python bench/gate_accuracy.py --device cuda --out $OUT     (H200, < 8 minutes)
      python bench/gate_accuracy.py --device cpu --out /tmp/ga   (small kernel, ~10 minutes)
Writes gate_accuracy.json (every comparison) and gate_accuracy.md (the tables) under --out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from pytest_kernelpro.gate.baseline import BaselineEntry
from pytest_kernelpro.gate.verdict import compare, confirm, needs_confirmation
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.results import KernelRecord

SLOWDOWNS = (0.03, 0.05, 0.10)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, center - half), min(1.0, center + half))


def make_kernels(device: str, numel: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Variant name -> zero-argument launch; and facts about the buffers."""
    import torch

    dev = "cuda" if device == "cuda" else "cpu"
    n_max = int(numel * (1 + max(SLOWDOWNS))) + 1
    a = torch.randn(n_max, device=dev)
    b = torch.randn(n_max, device=dev)
    c = torch.empty(n_max, device=dev)
    kernels: dict[str, Any] = {}
    for label, s in [("A", 0.0), *((f"B{round(s * 100)}", s) for s in SLOWDOWNS)]:
        n = int(numel * (1 + s))
        a_n, b_n, c_n = a[:n], b[:n], c[:n]

        def launch(a_n: Any = a_n, b_n: Any = b_n, c_n: Any = c_n) -> None:
            torch.add(a_n, b_n, out=c_n)

        kernels[label] = launch
    facts = {"numel": numel, "bytes_per_call_A": 12 * numel, "dtype": "float32"}
    return kernels, facts


def measure(fn: Any, device: str, budget: TimingBudget, name: str) -> KernelRecord:
    timing = time_kernel(fn, device=device, budget=budget)
    return KernelRecord(
        nodeid=f"gate_accuracy::{name}",
        name=name,
        kernel="add",
        device=timing.device,
        device_kind=device,
        outcome="passed",
        timing=timing.to_dict(),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: falling back to --device cpu", file=sys.stderr)
        args.device = "cpu"
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core: less scheduler noise, as a CI job would pin
    numel = args.numel or (20_000_000 if args.device == "cuda" else 400_000)
    kernels, facts = make_kernels(args.device, numel)
    budget = TimingBudget(
        max_time_s=args.budget_s, warmup_ms=args.warmup_ms, flush_l2=args.flush == "on"
    )
    thresholds = [float(t) for t in args.thresholds.split(",")]
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.max_minutes * 60
    comparisons: list[dict[str, Any]] = []
    medians: dict[str, list[float]] = {k: [] for k in kernels}
    rel_ci: list[float] = []
    measurements = 0
    trials_done = 0
    for trial in range(args.trials):
        if time.monotonic() > deadline:
            print(f"time limit reached after {trial} trials", file=sys.stderr)
            break
        base = measure(kernels["A"], args.device, budget, "A")
        measurements += 1
        entry = BaselineEntry.from_record(base)
        assert entry is not None
        variants = ["A"] + (
            [f"B{round(s * 100)}" for s in SLOWDOWNS] if trial < args.ab_trials else []
        )
        rng.shuffle(variants)
        for variant in variants:
            rec = measure(kernels[variant], args.device, budget, variant)
            measurements += 1
            medians[variant].append(rec.median_s or math.nan)
            rel_ci.append(float(rec.timing["stats"].get("rel_ci_halfwidth") or math.nan))
            firsts = {t: compare(rec, entry, threshold=t, alpha=args.alpha) for t in thresholds}
            again = None
            if any(needs_confirmation(v) for v in firsts.values()):
                again = measure(kernels[variant], args.device, budget, variant)
                measurements += 1
            for t, first in firsts.items():
                final = confirm(first, again, entry) if needs_confirmation(first) else first
                comparisons.append(
                    {
                        "trial": trial,
                        "variant": variant,
                        "threshold": t,
                        "change": first.change,
                        "p_value": first.p_value,
                        "first": first.change_status,
                        "final": final.change_status,
                        "failed": final.failed,
                        "confirm_change": (final.confirmation or {}).get("change"),
                    }
                )
        trials_done = trial + 1
        if (trial + 1) % 20 == 0:
            print(f"trial {trial + 1}/{args.trials}, {measurements} measurements", file=sys.stderr)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": base.device if trials_done else args.device,
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()} "
        f"torch {torch.__version__}",
        "command": " ".join(sys.argv),
        "settings": {
            "trials": trials_done,
            "ab_trials": min(trials_done, args.ab_trials),
            "budget": budget.to_dict(),
            "alpha": args.alpha,
            "thresholds": thresholds,
            **facts,
        },
        "measurements": measurements,
        "median_of_medians_s": {k: _median(v) for k, v in medians.items()},
        "median_rel_ci_halfwidth": _median(rel_ci),
        "comparisons": comparisons,
    }


def _median(values: list[float]) -> float:
    vals = sorted(v for v in values if v == v)
    if not vals:
        return math.nan
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x * 100:.1f}%"


def summarize(result: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    rows = []
    comps = result["comparisons"]
    for t in result["settings"]["thresholds"]:
        for variant in ["A"] + [f"B{round(s * 100)}" for s in SLOWDOWNS]:
            sel = [c for c in comps if c["threshold"] == t and c["variant"] == variant]
            if not sel:
                continue
            n = len(sel)
            failed = sum(c["failed"] for c in sel)
            first = sum(c["first"] == "regressed" for c in sel)
            suspect = sum(c["final"] == "suspect" for c in sel)
            improved = sum(c["final"] == "improved" for c in sel)
            lo, hi = wilson(failed, n)
            changes = [c["change"] for c in sel if c["change"] is not None]
            nominal = 0.0 if variant == "A" else int(variant[1:]) / 100
            rows.append(
                {
                    "threshold": t,
                    "variant": "A/A" if variant == "A" else f"A/B +{round(nominal * 100)}%",
                    "n": n,
                    "failed": failed,
                    "rate": failed / n,
                    "ci95": (lo, hi),
                    "first_stage": first,
                    "suspect": suspect,
                    "improved": improved,
                    "median_change": _median(changes),
                }
            )
    lines = [
        "| threshold | comparison | n | failed the gate | rate (95% CI) | flagged before "
        "confirmation | suspect | 'improved' | median measured change (paired) |",
        "|--:|:--|--:|--:|:--|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threshold']:.0%} | {r['variant']} | {r['n']} | {r['failed']} | "
            f"{_pct(r['rate'])} ({_pct(r['ci95'][0])}–{_pct(r['ci95'][1])}) | "
            f"{r['first_stage']} | {r['suspect']} | {r['improved']} | "
            f"{r['median_change'] * 100:+.2f}% |"
        )
    aa = [abs(c["change"]) for c in comps if c["variant"] == "A" and c["change"] is not None]
    aa = sorted(aa[:: max(1, len(result["settings"]["thresholds"]))])  # one per comparison
    if aa:
        q = lambda p: aa[min(len(aa) - 1, int(p * len(aa)))]  # noqa: E731
        lines += [
            "",
            f"A/A |change of the median| between two measurements: p50 {q(0.5) * 100:.2f}%, "
            f"p95 {q(0.95) * 100:.2f}%, p99 {q(0.99) * 100:.2f}%, max {aa[-1] * 100:.2f}% "
            f"(n = {len(aa)}); median 95% CI half-width of one measurement's median: "
            f"{result['median_rel_ci_halfwidth'] * 100:.2f}%",
        ]
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", required=True, help="directory for the results")
    parser.add_argument("--trials", type=int, default=200, help="A/A comparisons (>= 200)")
    parser.add_argument("--ab-trials", type=int, default=100, help="A/B comparisons per slowdown")
    parser.add_argument("--thresholds", default="0.02,0.05", help="comma-separated fractions")
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--numel", type=int, default=0, help="elements of A (0: by device)")
    parser.add_argument("--budget-s", type=float, default=0.0, help="timing budget (0: by device)")
    parser.add_argument("--warmup-ms", type=float, default=10.0)
    parser.add_argument("--max-minutes", type=float, default=0.0, help="0: 7 on cuda, 10 on cpu")
    parser.add_argument(
        "--flush",
        choices=("on", "off", "auto"),
        default="auto",
        help="cache flush before each sample (auto: on for cuda, as the plugin does; off on "
        "cpu, where writing twice the last-level cache per sample leaves only a few samples "
        "per budget)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.budget_s = args.budget_s or (0.2 if args.device == "cuda" else 0.12)
    args.max_minutes = args.max_minutes or (7.0 if args.device == "cuda" else 10.0)
    if args.flush == "auto":
        args.flush = "on" if args.device == "cuda" else "off"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = run(args)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    rows, table = summarize(result)
    result["summary"] = rows
    (out / "gate_accuracy.json").write_text(json.dumps(result, indent=1, default=str))
    s = result["settings"]
    header = [
        f"# Gate accuracy on {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- machine: {result['machine']}",
        f"- command: `{result['command']}`",
        f"- kernel: c = a + b, {s['numel']:,} fp32 elements ({s['bytes_per_call_A'] / 1e6:.1f} MB "
        f"moved); median time of A {result['median_of_medians_s'].get('A', math.nan) * 1e6:.1f} µs",
        f"- trials: {s['trials']} A/A, {s['ab_trials']} A/B per slowdown; {result['measurements']} "
        f"measurements in {result['wall_s']:.0f} s; timing budget {s['budget']['max_time_s']} s, "
        f"target rel. CI {s['budget']['target_rel_ci']}, cache flush per sample "
        f"{'on' if s['budget']['flush_l2'] else 'off'}; alpha {s['alpha']}",
        "",
    ]
    (out / "gate_accuracy.md").write_text("\n".join(header) + table + "\n")
    print("\n".join(header) + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
