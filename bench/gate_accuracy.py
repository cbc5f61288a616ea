"""How often does the gate cry wolf, and how often does it catch a real slowdown?

A memory-bound kernel (c = a + b over N fp32 elements) is timed with the plugin's own
`time_kernel`; its "slow" variants do the same work over more elements (extra work, so the
slowdown is real), for nominal slowdowns s = 3%, 5%, 7%, 10% (--slowdowns).

Calibrated injection (the default, --injection calibrated): a call costs a fixed part plus a
part proportional to the elements, t(n) = t0 + k * n (launch, ramp-up and tail on the GPU;
call overhead on the CPU). Doing s * N more elements therefore slows the call by only
s * (1 - t0 / t(N)): on the H200 on 2026-11-30 (N = 20M, t0 = 6.4 us of 61.5 us) the
"3/5/10%" variants measured +2.68/+4.38/+8.93%, so the 5% row tested a 4.4% slowdown. So
before the trials, t(N) and t(N * (1 + CAL_SPAN)) are measured CAL_REPS times, interleaved;
k is the slope between their medians, and variant s gets n_s = N + s * t(N) / k elements:
extra work that costs s * t(N), the nominal slowdown. The fit is recorded (settings.
injection) and the report prints the expected and measured change of each variant.
--injection elements keeps the old N * (1 + s) for comparison.

Each trial:

1. measure A once and keep it as the baseline entry (exactly what --kernelpro-save-baseline
   keeps: quantile-subsampled samples, median of all samples);
2. measure A again (A/A) and, in the first --ab-trials trials, the slow variants (A/B), in a
   random order so slow drifts of the machine hit every variant alike;
3. run `decide_verdict` at each threshold; when a verdict asks for it, re-measure that variant
   once and `confirm` (the plugin's flow).

Reported per threshold: the false-alarm rate over the A/A comparisons (a kernel that did not
change but failed the gate), and the detection rate of each slowdown (failed the gate, i.e.
regressed and confirmed), with 95% Wilson intervals, plus how large the slowdowns really
were (the median of the measured change, which need not equal the nominal one where the
machine is noisy or the calibration is off).

A nominal slowdown equal to a threshold sits on the decision boundary: a gate that fails a
kernel only for a change beyond its threshold must let about half of such changes pass, so
read the detection rate of slowdown s at thresholds below s (e.g. 5% at a 2% threshold).

Run:  python bench/gate_accuracy.py --suite add --device cuda --out $OUT  (H200, < 8 minutes)
      python bench/gate_accuracy.py --suite add --device cpu --out /tmp/ga (~10 minutes)
Writes gate_accuracy.json (every comparison) and gate_accuracy.md (the tables) under --out.

`--suite kernels` (the default): the same trials over the 23 kernels of
`bench/gate_accuracy_kernels.py` (elementwise, reductions, softmax, norms, transpose, fp16 /
bf16 / TF32 / fp32 GEMMs including a power-limited bf16 GEMM, batched GEMM, convolutions,
attention; small and >= 50 us), with the plugin's DEFAULT settings: the threshold
`default_threshold(device)`, alpha 0.01, the confirmation re-measurement, and the timing
defaults of the Setting table (2 s budget on a GPU, target CI 0.5%, flush before every
sample, 300 ms warm-up). One exception, to fit ~20 kernels x many trials in a few minutes:
the 300 ms warm-up runs before the first measurement of each kernel only; the measurements
after it, back to back on the same kernel with no pause, warm up for
`--later-warmup-ms` (25). Each kernel gets a share of `--max-minutes` and runs trials until
its share is spent (at least `--min-trials`). The slowdown is extra work of the kernel's own
kind (more elements, rows, K or batch; calibrated as above, per kernel), and the report
gives each variant's measured change beside its nominal one.

      python bench/gate_accuracy.py --device cuda --out $OUT --max-minutes 1.8    (H200)
      python bench/gate_accuracy.py --device cpu --out /tmp/ga --max-minutes 1    (dry run)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.confirmation import confirm, needs_confirmation
from pytest_kernelpro.gate.verdict import decide_verdict, default_threshold
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.record import KernelRecord, RooflinePart, TimingPart, part_of

sys.path.insert(0, str(Path(__file__).resolve().parent))

SLOWDOWNS = (0.03, 0.05, 0.07, 0.10)
SUITE_SLOWDOWNS = (0.03, 0.05, 0.10)
SUITE_CAL_REPS = 3  # suite: interleaved calibration measurements of each size
HARD_STOP_S = 15.0  # suite: past the deadline by this much, the remaining kernels are skipped
LONG_KERNEL_S = 50e-6  # the target's scope: kernels of 50 us or more
CAL_SPAN = 0.25  # calibration: t(N) against t(N * (1 + CAL_SPAN))
CAL_REPS = 5  # interleaved measurements of each calibration size


def variant_name(slowdown: float) -> str:
    """'B5' for 0.05, 'B7.5' for 0.075: the variant's label in the JSON and tables."""
    return f"B{slowdown * 100:g}"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, center - half), min(1.0, center + half))


def _buffers(device: str, n_max: int) -> tuple[Any, Any, Any]:
    import torch

    dev = "cuda" if device == "cuda" else "cpu"
    return (
        torch.randn(n_max, device=dev),
        torch.randn(n_max, device=dev),
        torch.empty(n_max, device=dev),
    )


def _launcher(bufs: tuple[Any, Any, Any], n: int) -> Any:
    """A zero-argument launch of c[:n] = a[:n] + b[:n]."""
    import torch

    a_n, b_n, c_n = (t[:n] for t in bufs)

    def launch() -> None:
        torch.add(a_n, b_n, out=c_n)

    return launch


def calibrate(device: str, numel: int, budget: TimingBudget) -> dict[str, Any]:
    """Fit t(n) = t0 + k * n from interleaved measurements at N and N * (1 + CAL_SPAN)."""
    n_hi = int(numel * (1 + CAL_SPAN))
    bufs = _buffers(device, n_hi)
    sizes = {"lo": numel, "hi": n_hi}
    medians: dict[str, list[float]] = {"lo": [], "hi": []}
    for _ in range(CAL_REPS):
        for key, n in sizes.items():  # interleaved: a drift of the machine hits both sizes
            timing = time_kernel(_launcher(bufs, n), device=device, budget=budget)
            medians[key].append(float(timing.to_dict()["stats"]["median_s"]))
    t_lo, t_hi = _median(medians["lo"]), _median(medians["hi"])
    k = (t_hi - t_lo) / (n_hi - numel)
    return {
        "method": "calibrated",
        "sizes": sizes,
        "medians_s": medians,
        "t_N_s": t_lo,
        "per_element_s": k,
        "fixed_s": t_lo - k * numel,
        "fixed_fraction": (t_lo - k * numel) / t_lo if t_lo > 0 else math.nan,
    }


def variant_sizes(numel: int, slowdowns: list[float], injection: dict[str, Any]) -> dict[str, int]:
    """Elements per variant: the extra work that costs s * t(N) (calibrated), else s * N."""
    sizes = {"A": numel}
    k, t_n = injection.get("per_element_s", 0.0), injection.get("t_N_s", 0.0)
    calibrated = injection.get("method") == "calibrated" and k > 0 and t_n > 0
    for s in slowdowns:
        extra = s * t_n / k if calibrated else s * numel
        sizes[variant_name(s)] = numel + round(extra)
    return sizes


def make_kernels(device: str, sizes: dict[str, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Variant name -> zero-argument launch over its elements; and facts about the buffers."""
    bufs = _buffers(device, max(sizes.values()) + 1)
    kernels = {label: _launcher(bufs, n) for label, n in sizes.items()}
    facts = {
        "numel": sizes["A"],
        "variant_numel": dict(sizes),
        "bytes_per_call_A": 12 * sizes["A"],
        "dtype": "float32",
    }
    return kernels, facts


def measure(
    fn: Any, device: str, budget: TimingBudget, name: str, bound: str | None = None
) -> KernelRecord:
    timing = time_kernel(fn, device=device, budget=budget)
    return KernelRecord(
        roofline=None if bound is None else RooflinePart(bound=bound),
        nodeid=f"gate_accuracy::{name}",
        name=name,
        kernel="add",
        device=timing.device,
        device_kind=device,
        outcome="passed",
        timing=part_of(TimingPart, timing),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: falling back to --device cpu", file=sys.stderr)
        args.device = "cpu"
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core: less scheduler noise, as a CI job would pin
    numel = args.numel or (20_000_000 if args.device == "cuda" else 400_000)
    budget = TimingBudget(
        max_time_s=args.budget_s, warmup_ms=args.warmup_ms, flush_l2=args.flush == "on"
    )
    slowdowns = [float(x) for x in args.slowdowns.split(",")]
    injection: dict[str, Any] = {"method": "elements"}
    if args.injection == "calibrated":
        injection = calibrate(args.device, numel, budget)
        if not injection["per_element_s"] > 0:
            # Noise swamped the slope (a loaded CPU): fall back, and say so in the results.
            print("calibration gave no positive slope: using N * (1 + s)", file=sys.stderr)
            injection["method"] = "elements (calibration failed)"
    sizes = variant_sizes(numel, slowdowns, injection)
    injection["expected_change"] = {
        v: (injection["per_element_s"] * (n - numel) / injection["t_N_s"])
        if injection["method"] == "calibrated"
        else None
        for v, n in sizes.items()
        if v != "A"
    }
    kernels, facts = make_kernels(args.device, sizes)
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
        entry = entry_from_record(base)
        assert entry is not None
        variants = ["A"] + ([variant_name(s) for s in slowdowns] if trial < args.ab_trials else [])
        rng.shuffle(variants)
        for variant in variants:
            rec = measure(kernels[variant], args.device, budget, variant)
            measurements += 1
            medians[variant].append(rec.median_s or math.nan)
            rel_ci.append(float(rec.timing.stats.rel_ci_halfwidth or math.nan))
            firsts = {
                t: decide_verdict(rec, entry, threshold=t, alpha=args.alpha) for t in thresholds
            }
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
            "slowdowns": slowdowns,
            "injection": injection,
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
    settings = result["settings"]
    slowdowns = settings.get("slowdowns", [0.03, 0.05, 0.10])  # older results: the old three
    nominal_of = {variant_name(s): s for s in slowdowns}
    for t in settings["thresholds"]:
        for variant in ["A", *nominal_of]:
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
            nominal = nominal_of.get(variant, 0.0)
            rows.append(
                {
                    "threshold": t,
                    "variant": "A/A" if variant == "A" else f"A/B +{nominal * 100:g}%",
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


def injection_lines(result: dict[str, Any]) -> list[str]:
    """The injection (calibration fit) and, per variant, expected vs measured change."""
    s = result["settings"]
    inj = s.get("injection") or {"method": "elements (N x (1 + s); before calibration existed)"}
    lines = [f"- injection: {inj['method']}"]
    if inj.get("method") == "calibrated":
        lines[0] += (
            f"; fit t(n) = t0 + k n from {CAL_REPS} x 2 interleaved measurements: "
            f"t(N) = {inj['t_N_s'] * 1e6:.2f} µs, t0 = {inj['fixed_s'] * 1e6:.2f} µs "
            f"({inj['fixed_fraction']:.1%} of t(N))"
        )
    sizes = s.get("variant_numel") or {}
    medians = result.get("median_of_medians_s") or {}
    expected = inj.get("expected_change") or {}
    a = medians.get("A")
    lines += [
        "",
        "| variant | nominal | elements vs A | expected change | median of medians vs A |",
        "|:--|--:|--:|--:|--:|",
    ]
    for s_nom in s.get("slowdowns", [0.03, 0.05, 0.10]):
        v = variant_name(s_nom)
        n = sizes.get(v, round(s["numel"] * (1 + s_nom)))
        exp = expected.get(v)
        got = medians.get(v)
        lines.append(
            f"| {v} | +{s_nom * 100:g}% | {(n / s['numel'] - 1) * 100:+.2f}% | "
            f"{'–' if exp is None else f'{exp * 100:+.2f}%'} | "
            f"{'–' if not (a and got) else f'{(got / a - 1) * 100:+.2f}%'} |"
        )
    return lines


def plugin_budgets(
    device: str, later_warmup_ms: float, clock_anchor: str = "off"
) -> tuple[TimingBudget, TimingBudget]:
    """(first, later) budgets: the plugin's defaults from the Setting table; `later` differs
    only in its warm-up (see the module docstring). `clock_anchor="on"` when a rule needs the
    anchored samples: a kernel whose warm-up ran capped is then timed in pairs with the anchor,
    and the rules without the anchor judge the same (paired) samples' times."""
    from pytest_kernelpro.config import SETTINGS_BY_NAME

    first = TimingBudget(
        warmup_ms=float(SETTINGS_BY_NAME["warmup_ms"].default),
        max_time_s=2.0 if device == "cuda" else 1.0,  # Settings.budget_for's defaults
        target_rel_ci=float(SETTINGS_BY_NAME["target_rel_ci"].default),
        cpu_flush=str(SETTINGS_BY_NAME["cpu_flush"].default),
        clock_anchor=clock_anchor,
    )
    from dataclasses import replace

    return first, replace(first, warmup_ms=later_warmup_ms)


def _round_to(x: float, granule: int) -> int:
    """`x` to the nearest multiple of `granule`, at least one granule."""
    return max(granule, round(x / granule) * granule)


# The gate's rules, each applied to the same measurements: `anchor` (--kernelpro-clock-anchor=on,
# the default: a comparison where either side's samples ran mostly under a clock limit, by the
# per-round NVML reasons, compares the per-pair kernel / anchor ratios at 0.75x the threshold
# where both sides were timed in pairs with the anchor, gate/clock_basis.py) and `clock3x`
# (--kernelpro-clock-anchor=off: the same measurements without their anchored pairs, so 3x the
# threshold for a comparison whose NVML mean SM clock was held below 95% of the maximum,
# gate/clock_basis.py); `default` is whichever of the two the plugin's default (the Setting
# table) selects. Each rule is what it hands `decide_verdict`: the record and entry as
# measured, or without their anchored pairs. The rules of earlier results files that the gate
# no longer has (`anchor20`, `anchor15`, `anchor125`, `fixed`, `cycles`, `clock`, `plain`) keep
# their labels for rendering those files.


def _as_measured(record: KernelRecord, entry: Any) -> tuple[KernelRecord, Any]:
    return record, entry


def _without_anchor(record: KernelRecord, entry: Any) -> tuple[KernelRecord, Any]:
    """The same measurements with no anchored pairs on either side, as
    --kernelpro-clock-anchor=off times them."""
    from dataclasses import replace

    timing = msgspec.structs.replace(record.timing, anchor=None) if record.timing else None
    bare = replace(entry, anchor=None, anchor_median_s=None, anchor_ratios=None)
    return msgspec.structs.replace(record, timing=timing), bare


RULES = {"anchor": _as_measured, "clock3x": _without_anchor}
# Rules that judge times without the anchor (earlier files' names included).
ANCHOR_BLIND = {"clock3x", "fixed", "cycles", "clock", "plain"}


def _default_rule() -> str:
    from pytest_kernelpro.config import SETTINGS_BY_NAME

    return "anchor" if SETTINGS_BY_NAME["clock_anchor"].default == "on" else "clock3x"


RULES["default"] = RULES[_default_rule()]
RULE_LABELS = {
    "default": f"default (= {_default_rule()}, the plugin's default)",
    "anchor": "anchor (--kernelpro-clock-anchor=on: comparisons with either side's samples "
    "mostly under a clock limit compare kernel / anchor per pair, the anchor GEMM timed after "
    "every sample, at 0.75x the threshold, gate/clock_basis.py)",
    "anchor20": "anchor20 (the anchor rule at 2% for the anchored ratio; earlier files only)",
    "anchor15": "anchor15 (the anchor rule at 1.5% for the anchored ratio; earlier files only)",
    "anchor125": "anchor125 (the anchor rule at 1.25% for the anchored ratio; earlier files only)",
    "clock3x": "clock3x (--kernelpro-clock-anchor=off: 3x the threshold when the NVML mean SM "
    "clock was held below 95% of its maximum by a limit, gate/clock_basis.py)",
    "fixed": "fixed (the threshold for every kernel; earlier files only)",
    "cycles": "cycles (capped compute-bound kernels' times scaled by the mean SM clock; earlier "
    "files only)",
    "clock": "clock (= cycles; earlier files only)",
    "plain": "plain (= fixed; earlier files only)",
}


def _bound_of(launch: Any, spec: Any, ceilings: Any) -> tuple[str, str]:
    """The kernel's roofline bound as the plugin finds it (its FLOPs and bytes on the
    measured ceilings), else the suite's label for it."""
    if ceilings is not None:
        from pytest_kernelpro.measure.roofline import analyze_reference

        try:
            return analyze_reference(launch, (), ceilings=ceilings).bound, "roofline"
        except Exception as exc:  # counted nothing, or a kernel the recorder upsets
            return spec.kind, f"suite kind (roofline failed: {type(exc).__name__})"
    return spec.kind, "suite kind (no --ceilings)"


def _load_ceilings(path: str | None) -> Any:
    if not path:
        return None
    from pytest_kernelpro.measure.ceilings import Ceilings

    data = json.loads(Path(path).read_text())
    return Ceilings.from_dict(data.get("ceilings", data))


def _measure_info(rec: KernelRecord) -> dict[str, Any]:
    timing = msgspec.to_builtins(rec.timing) if rec.timing else {}
    clocks = timing.get("clocks") or {}
    n = len(timing.get("samples_s") or [])
    return {
        "median_s": rec.median_s,
        "n": n,
        "throttled_share": (timing.get("throttled_samples") or 0) / n if n else None,
        "sm_mhz_mean": clocks.get("sm_mhz_mean"),
        "power_w_mean": clocks.get("power_w_mean"),
        "reasons": clocks.get("reasons_seen") or [],
        "wall_s": timing.get("wall_s"),
        "anchored": bool((timing.get("anchor") or {}).get("ratios")),
        "anchor_median_s": (timing.get("anchor") or {}).get("anchor_median_s"),
        "anchor_pairs": (timing.get("anchor") or {}).get("pairs"),
        "anchor_added_gpu_s": (timing.get("anchor") or {}).get("added_gpu_s"),
        "ratio_rel_sd": _rel_sd((timing.get("anchor") or {}).get("ratios") or []),
        "warmup_throttled": timing.get("warmup_throttled"),
    }


def _rel_sd(values: list[float]) -> float | None:
    """Standard deviation / median of a measurement's per-pair ratios (None under 2)."""
    if len(values) < 2:
        return None
    return statistics.pstdev(values) / statistics.median(values)


def cost_probe(launch: Any, device: str, budget: TimingBudget, reps: int) -> dict[str, Any]:
    """The timing cost of the anchor: `reps` interleaved measurements of the same kernel with
    --kernelpro-clock-anchor off and on, the time each took (warm-up and statistics
    included), its sample count, and the GPU time the anchor added."""
    from dataclasses import replace

    out: dict[str, list[Any]] = {"off_wall_s": [], "on_wall_s": [], "off_n": [], "on_n": [],
                                 "on_pairs": [], "on_added_gpu_s": []}  # fmt: skip
    for _ in range(reps):
        for mode in ("off", "on"):
            timing = time_kernel(launch, device=device, budget=replace(budget, clock_anchor=mode))
            out[f"{mode}_wall_s"].append(timing.wall_s)
            out[f"{mode}_n"].append(len(timing.samples_s))
            if mode == "on":
                out["on_pairs"].append((timing.anchor or {}).get("pairs", 0))
                out["on_added_gpu_s"].append((timing.anchor or {}).get("added_gpu_s", 0.0))
    return out


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    import torch
    from gate_accuracy_kernels import SUITE, set_device, tf32_mode

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: falling back to --device cpu", file=sys.stderr)
        args.device = "cpu"
    if args.device == "cpu":
        torch.set_num_threads(1)
    set_device(args.device)
    small = args.device == "cpu"
    rules = args.rules.split(",")
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise SystemExit(f"--rules: unknown {unknown}; known: {', '.join(RULES)}")
    needs_anchor = any(RULES[r] is _as_measured for r in rules)
    first_budget, later_budget = plugin_budgets(
        args.device, args.later_warmup_ms, "on" if needs_anchor else "off"
    )
    threshold = default_threshold(args.device)
    slowdowns = [float(x) for x in args.slowdowns.split(",")]
    specs = [s for s in SUITE if not args.only or s.name in args.only.split(",")]
    ceilings = _load_ceilings(args.ceilings)
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    deadline = t_start + args.max_minutes * 60
    comparisons: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    measurements = 0
    device_name = args.device
    for index, spec in enumerate(specs):
        if time.monotonic() > deadline + HARD_STOP_S:
            kernels.append({"name": spec.name, "kind": spec.kind, "what": spec.what,
                            "error": "not run: the run's time was spent"})  # fmt: skip
            continue
        left_weight = sum(s.weight for s in specs[index:])
        share_s = max(0.0, deadline - time.monotonic()) * spec.weight / left_weight
        k_start = time.monotonic()
        n0 = spec.n0_small if small else spec.n0
        info: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "what": spec.what,
                                "n0": n0, "share_s": round(share_s, 1)}  # fmt: skip
        try:
            with tf32_mode(spec.tf32), torch.no_grad():
                launch_a = spec.build(n0, small)
                n_hi = n0 + _round_to(CAL_SPAN * n0, spec.granule)
                launch_hi = spec.build(n_hi, small)

                bound, bound_source = _bound_of(launch_a, spec, ceilings)
                info.update(bound=bound, bound_source=bound_source)

                def timed(
                    fn: Any,
                    name: str,
                    first: bool = False,
                    kernel: str = spec.name,
                    kernel_bound: str = bound,
                ) -> KernelRecord:
                    nonlocal measurements
                    measurements += 1
                    budget = first_budget if first else later_budget
                    return measure(fn, args.device, budget, f"{kernel}:{name}", kernel_bound)

                warm = timed(launch_a, "A", first=True)  # the default 300 ms warm-up
                device_name = warm.device
                if args.long_only and (warm.median_s or 0.0) < LONG_KERNEL_S:
                    raise _Skipped(f"{(warm.median_s or 0) * 1e6:.1f} us < 50 us (--long-only)")
                cal: dict[str, list[float]] = {"lo": [], "hi": []}
                for _ in range(SUITE_CAL_REPS):
                    for key, fn in (("lo", launch_a), ("hi", launch_hi)):
                        cal[key].append(timed(fn, key).median_s or math.nan)
                t_lo, t_hi = _median(cal["lo"]), _median(cal["hi"])
                k = (t_hi - t_lo) / (n_hi - n0)
                del launch_hi
                sizes: dict[str, int] = {"A": n0}
                expected: dict[str, float | None] = {}
                for s in slowdowns:
                    extra = s * t_lo / k if k > 0 else s * n0
                    sizes[variant_name(s)] = n0 + _round_to(extra, spec.granule)
                    expected[variant_name(s)] = (
                        k * (sizes[variant_name(s)] - n0) / t_lo if k > 0 else None
                    )
                if args.cost_reps and needs_anchor:
                    info["cost"] = cost_probe(launch_a, args.device, later_budget, args.cost_reps)
                    measurements += 2 * args.cost_reps
                launches = {"A": launch_a}
                launches.update({v: spec.build(n, small) for v, n in sizes.items() if v != "A"})
                info.update({
                    "calibration": {"n_hi": n_hi, "medians_s": cal, "per_unit_s": k,
                                    "fixed_fraction": (t_lo - k * n0) / t_lo if t_lo else None},
                    "sizes": sizes, "expected_change": expected,
                    "first_measurement": _measure_info(warm),
                })  # fmt: skip
                medians: dict[str, list[float]] = {v: [] for v in launches}
                a_infos: list[dict[str, Any]] = []
                trial = 0
                # Past the whole run's deadline, one trial per kernel still left.
                min_trials = args.min_trials if time.monotonic() < deadline else 1
                while trial < args.trials and (
                    trial < min_trials or time.monotonic() - k_start < share_s
                ):
                    base = timed(launches["A"], "A")
                    entry = entry_from_record(base)
                    assert entry is not None
                    base_info = _measure_info(base)
                    # Every trial: A/A and the smallest slowdown; the larger ones in the
                    # first --wide-trials trials only (caught every time before).
                    order = [v for v in launches
                             if v in ("A", variant_name(min(slowdowns))) or trial < args.wide_trials]  # fmt: skip
                    rng.shuffle(order)
                    for variant in order:
                        rec = timed(launches[variant], variant)
                        medians[variant].append(rec.median_s or math.nan)
                        rec_info = _measure_info(rec)
                        if variant == "A":
                            a_infos.append(rec_info)
                        firsts = {
                            rule: decide_verdict(*RULES[rule](rec, entry), threshold=threshold,
                                                 alpha=args.alpha)
                            for rule in rules
                        }  # fmt: skip
                        again = None
                        if any(needs_confirmation(v) for v in firsts.values()):
                            again = timed(launches[variant], variant)
                        for rule, first in firsts.items():
                            final = first
                            if needs_confirmation(first):
                                assert again is not None
                                final = confirm(first, *RULES[rule](again, entry))
                            comparisons.append({
                                "kernel": spec.name, "trial": trial, "variant": variant,
                                "rule": rule, "threshold": threshold, "change": first.change,
                                "raw_change": first.raw_change if first.raw_change is not None else first.change,
                                "clock_limited": first.clock_limited,
                                "anchor": first.anchor,
                                "anchor_change": first.anchor_change,
                                "basis": first.basis,
                                "tolerance": first.tolerance,
                                "p_value": first.p_value, "first": first.change_status,
                                "final": final.change_status, "failed": final.failed,
                                "confirm_change": (final.confirmation or {}).get("change"),
                                "sm_mhz": rec_info["sm_mhz_mean"],
                                "base_sm_mhz": base_info["sm_mhz_mean"],
                                "capped_share": rec_info["throttled_share"],
                                "base_capped_share": base_info["throttled_share"],
                                "anchored": rec_info["anchored"],
                                "base_anchored": base_info["anchored"],
                                "ratio_rel_sd": rec_info["ratio_rel_sd"],
                                "wall_s": rec_info["wall_s"],
                                "anchor_pairs": rec_info["anchor_pairs"],
                            })  # fmt: skip
                    trial += 1
                a = _median(medians["A"])
                info.update({
                    "trials": trial,
                    "median_of_medians_s": {v: _median(m) for v, m in medians.items()},
                    "measured_change": {v: _median(m) / a - 1 for v, m in medians.items()
                                        if v != "A" and a == a},
                    "throttled_share_A": _median([x["throttled_share"] for x in a_infos
                                                  if x["throttled_share"] is not None]),
                    "sm_mhz_mean_A": _median([x["sm_mhz_mean"] for x in a_infos
                                              if x["sm_mhz_mean"] is not None]),
                    "power_w_mean_A": _median([x["power_w_mean"] for x in a_infos
                                               if x["power_w_mean"] is not None]),
                    "reasons_A": sorted({r for x in a_infos for r in x["reasons"]}),
                    "anchored_share_A": (sum(x["anchored"] for x in a_infos) / len(a_infos)
                                         if a_infos else None),
                    "ratio_rel_sd_A": _median([x["ratio_rel_sd"] for x in a_infos
                                               if x["ratio_rel_sd"] is not None]) if any(
                        x["ratio_rel_sd"] is not None for x in a_infos) else None,
                    "wall_s": round(time.monotonic() - k_start, 1),
                })  # fmt: skip
                del launches, launch_a
        except _Skipped as exc:
            info["error"] = f"skipped: {exc}"
        except Exception as exc:  # one kernel's failure is its row, not the run's end
            info["error"] = f"{type(exc).__name__}: {exc}"[:400]
        kernels.append(info)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        print(f"[gate] {spec.name}: {info.get('trials', 0)} trials in "
              f"{info.get('wall_s', '?')} s, A {(_median_of(info) or math.nan) * 1e6:.1f} us, "
              f"measured {info.get('measured_change')} {info.get('error') or ''}",
              file=sys.stderr, flush=True)  # fmt: skip
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name,
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()} "
        f"torch {torch.__version__}",
        "command": " ".join(sys.argv),
        "settings": {
            "suite": "kernels",
            "threshold": threshold,
            "alpha": args.alpha,
            "slowdowns": slowdowns,
            "first_budget": first_budget.to_dict(),
            "later_budget": later_budget.to_dict(),
            "min_trials": args.min_trials,
            "wide_trials": args.wide_trials,
            "rules": rules,
            "ceilings": args.ceilings,
        },
        "measurements": measurements,
        "wall_s": round(time.monotonic() - t_start, 1),
        "kernels": kernels,
        "comparisons": comparisons,
    }


class _Skipped(Exception):  # noqa: N818 - a kernel the options leave out
    pass


def _median_of(info: dict[str, Any]) -> float | None:
    return (info.get("median_of_medians_s") or {}).get("A")


def _rate(sel: list[dict[str, Any]]) -> str:
    if not sel:
        return "–"
    k = sum(c["failed"] for c in sel)
    lo, hi = wilson(k, len(sel))
    return f"{k}/{len(sel)} = {_pct(k / len(sel))} ({_pct(lo)}–{_pct(hi)})"


def _rule(c: dict[str, Any]) -> str:
    return str(c.get("rule") or "plain")  # results from before the clock rule: plain times


def _capped_kernels(result: dict[str, Any]) -> set[str]:
    """Kernels whose A measurements ran with the clock set by a limit (half the samples)."""
    return {
        i["name"]
        for i in result["kernels"]
        if (i.get("throttled_share_A") or 0) >= 0.5 and "error" not in i
    }


def _variant_change(comps: list[dict[str, Any]], kernel: str, variant: str) -> float:
    """The median change of a kernel's variant over its trials (under the comps' rule)."""
    return _median(
        [c["change"] for c in comps if c["kernel"] == kernel and c["variant"] == variant
         and c["change"] is not None]
    )  # fmt: skip


def render_suite(result: dict[str, Any]) -> str:
    s = result["settings"]
    all_comps = result["comparisons"]
    rules = s.get("rules") or ["plain"]
    default_rule = rules[0]
    slow = [variant_name(x) for x in s["slowdowns"]]
    fb, lb = s["first_budget"], s["later_budget"]
    lines = [
        f"# Gate accuracy over {len(result['kernels'])} kernels on {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- machine: {result['machine']}",
        f"- command: `{result['command']}`",
        f"- gate: threshold {s['threshold']:.0%} (the plugin's default), alpha {s['alpha']}, "
        "confirmation re-measurement of every flagged change; rules: "
        + ", ".join(RULE_LABELS.get(r, r) for r in rules)
        + " — both on the same measurements",
        f"- timing: budget {fb['max_time_s']} s, target CI {fb['target_rel_ci']}, flush "
        f"{'on' if fb['flush_l2'] else 'off'}; warm-up {fb['warmup_ms']:g} ms before each "
        f"kernel's first measurement, {lb['warmup_ms']:g} ms before the later ones",
        f"- {result['measurements']} measurements in {result['wall_s']:.0f} s",
        "",
        "Failed the gate = regressed and confirmed. A/A: a re-measurement of the unchanged "
        f"kernel against its baseline (false alarm if it failed). Cells: {' / '.join(rules)}. "
        f"Measured: the median over trials of the variant's change ({default_rule}).",
        "",
        "| kernel | bound | A median | trials | A/A false alarms | "
        + " | ".join(f"{v} measured / caught" for v in slow)
        + " | A/A max abs change | capped / SM MHz / W |",
        "|:--|:--|--:|--:|--:|" + "--:|" * len(slow) + "--:|:--|",
    ]

    def by_rule(rule: str) -> list[dict[str, Any]]:
        return [c for c in all_comps if _rule(c) == rule]

    def caught(sel: list[dict[str, Any]]) -> str:
        return f"{sum(c['failed'] for c in sel)}/{len(sel)}"

    for info in result["kernels"]:
        name = info["name"]
        if "error" in info:
            lines.append(f"| {name} | {info['kind']} | {info['error'][:120]} |")
            continue
        a = _median_of(info) or math.nan
        per_rule = {r: [c for c in by_rule(r) if c["kernel"] == name] for r in rules}
        main = per_rule[default_rule]

        def cell(
            variant: str,
            main: list[dict[str, Any]] = main,
            per_rule: dict[str, list[dict[str, Any]]] = per_rule,
            name: str = name,
        ) -> str:
            parts = [caught([c for c in per_rule[r] if c["variant"] == variant]) for r in rules]
            got = _variant_change(main, name, variant)
            shown = "–" if got != got else f"{got * 100:+.2f}%"
            return f"{shown} / {' / '.join(parts)}"

        thr = info.get("throttled_share_A")
        clocks = (
            f"{'–' if thr is None or thr != thr else f'{thr:.0%}'} / "
            f"{info.get('sm_mhz_mean_A') or math.nan:.0f} / {info.get('power_w_mean_A') or math.nan:.0f}"
        )
        aa_main = [c for c in main if c["variant"] == "A"]
        lines.append(
            f"| {name} | {info.get('bound', info['kind'])} | {a * 1e6:.1f} µs | {info['trials']} | "
            f"{' / '.join(caught([c for c in per_rule[r] if c['variant'] == 'A']) for r in rules)} | "
            + " | ".join(cell(v) for v in slow)
            + f" | {max((abs(c['change']) for c in aa_main), default=math.nan) * 100:.2f}% | {clocks} |"
        )
    long_names = {i["name"] for i in result["kernels"] if (_median_of(i) or 0) >= LONG_KERNEL_S}
    capped = _capped_kernels(result)
    groups = [
        ("all kernels", lambda c: True),
        (f">= {LONG_KERNEL_S * 1e6:.0f} µs kernels ({len(long_names)})",
         lambda c: c["kernel"] in long_names),
        (f">= {LONG_KERNEL_S * 1e6:.0f} µs, clock capped ({len(long_names & capped)})",
         lambda c: c["kernel"] in long_names & capped),
        (f">= {LONG_KERNEL_S * 1e6:.0f} µs, not capped ({len(long_names - capped)})",
         lambda c: c["kernel"] in long_names - capped),
        (f"< {LONG_KERNEL_S * 1e6:.0f} µs kernels", lambda c: c["kernel"] not in long_names),
    ]  # fmt: skip
    lines += [
        "",
        "Pooled (95% Wilson intervals):",
        "",
        "| rule | kernels | A/A false alarms | " + " | ".join(f"{v} caught" for v in slow) + " |",
        "|:--|:--|--:|" + "--:|" * len(slow),
    ]
    for rule in rules:
        comps = by_rule(rule)
        for label, keep in groups:
            sel = [c for c in comps if keep(c)]
            if not sel:
                continue
            lines.append(
                f"| {rule} | {label} | {_rate([c for c in sel if c['variant'] == 'A'])} | "
                + " | ".join(_rate([c for c in sel if c["variant"] == v]) for v in slow)
                + " |"
            )
    # The noise each rule sees: the A/A change between two measurements of the same code
    # (standard deviation and max over the trials), and how the default rule decided.
    lines += [
        "",
        "A/A spread per rule (standard deviation / max |change| of the compared quantity), "
        "and how often the anchor rule compared relative to the anchor:",
        "",
        "| kernel | " + " | ".join(f"{r} A/A sd / max" for r in rules)
        + " | anchored measurements of A | comparisons relative to the anchor |",
        "|:--|" + "--:|" * len(rules) + "--:|--:|",
    ]  # fmt: skip
    for info in result["kernels"]:
        if "error" in info:
            continue
        name = info["name"]
        cells = []
        for r in rules:
            aa = [c["change"] for c in by_rule(r) if c["kernel"] == name and c["variant"] == "A"
                  and c["change"] is not None]  # fmt: skip
            sd = statistics.pstdev(aa) if len(aa) > 1 else math.nan
            mx = max((abs(x) for x in aa), default=math.nan)
            cells.append(f"{sd * 100:.2f}% / {mx * 100:.2f}%")
        anchor_rule = next((r for r in rules if r not in ANCHOR_BLIND), default_rule)
        mine = [c for c in by_rule(anchor_rule) if c["kernel"] == name]
        anchored = sum(1 for c in mine if c.get("anchor"))
        share = info.get("anchored_share_A")
        lines.append(
            f"| {name} | " + " | ".join(cells)
            + f" | {'–' if share is None else f'{share:.0%}'} | {anchored}/{len(mine)} |"
        )  # fmt: skip
    # Detection by the size of the change each variant really had (its median over trials
    # under that rule): nominal 3% variants came out anywhere from +1.8% to +31%.
    bins = [(0.025, 0.035), (0.035, 0.05), (0.05, 0.08), (0.08, math.inf)]
    lines += [
        "",
        "Detection by the variant's measured change (median over its trials, under that rule), "
        f">= {LONG_KERNEL_S * 1e6:.0f} µs kernels:",
        "",
        "| rule | kernels | " + " | ".join(
            f"+{lo * 100:g}% to +{hi * 100:g}%" if hi != math.inf else f">= +{lo * 100:g}%"
            for lo, hi in bins
        ) + " |",
        "|:--|:--|" + "--:|" * len(bins),
    ]  # fmt: skip
    for rule in rules:
        comps = [c for c in by_rule(rule) if c["kernel"] in long_names and c["variant"] != "A"]
        size = {
            (k, v): _variant_change(comps, k, v)
            for k, v in {(c["kernel"], c["variant"]) for c in comps}
        }
        for label, names in (("capped", long_names & capped), ("not capped", long_names - capped)):
            cells = []
            for lo, hi in bins:
                sel = [c for c in comps if c["kernel"] in names
                       and lo <= size[(c["kernel"], c["variant"])] < hi]  # fmt: skip
                cells.append(_rate(sel))
            lines.append(f"| {rule} | {label} | " + " | ".join(cells) + " |")
    lines += cost_lines(result)
    return "\n".join(lines) + "\n"


def cost_lines(result: dict[str, Any]) -> list[str]:
    """The anchor's timing cost per kernel (--cost-reps) and the per-pair ratio's spread
    within one measurement."""
    rows = [i for i in result["kernels"] if i.get("cost")]
    if not rows:
        return []
    lines = [
        "",
        "Timing cost of the anchor (interleaved measurements of A with the anchor off and on, "
        "later warm-up, statistics included; medians):",
        "",
        "| kernel | off: wall / samples | on: wall / samples / pairs | on / off wall | "
        "anchor GPU time added | ratio sd within a measurement (A) |",
        "|:--|--:|--:|--:|--:|--:|",
    ]
    for info in rows:
        c = info["cost"]
        off, on = _median(c["off_wall_s"]), _median(c["on_wall_s"])
        sd = info.get("ratio_rel_sd_A")
        shown_sd = "–" if sd is None else f"{sd * 100:.2f}%"
        lines.append(
            f"| {info['name']} | {off * 1e3:.1f} ms / {_median(c['off_n']):.0f} | "
            f"{on * 1e3:.1f} ms / {_median(c['on_n']):.0f} / {_median(c['on_pairs']):.0f} | "
            f"{on / off if off else math.nan:.2f} | "
            f"{_median(c['on_added_gpu_s']) * 1e3:.1f} ms | {shown_sd} |"
        )
    return lines


PLUGIN_PROJECT = Path(__file__).resolve().parent / "gate_accuracy_project"


def _pytest_session(
    work: Path, out: Path, name: str, slowdown: float, *args: str
) -> dict[str, Any]:
    """One `pytest` session on the project copy in `work`; its report JSON kept as out/NAME.json."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, KP_SLOWDOWN=str(slowdown), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = f"{repo}:{env.get('PYTHONPATH', '')}"
    report, status = out / f"{name}.json", out / f"{name}.exit"
    if status.is_file():  # done in an earlier device call: resumed, not re-run
        done = json.loads(status.read_text())
        records = json.loads(report.read_text())["records"] if report.is_file() else []
        return {**done, "records": records}
    cmd = [sys.executable, "-m", "pytest", f"--kernelpro-json={report}", *args]
    started = time.monotonic()
    with open(out / f"{name}.log", "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode  # fmt: skip
    records = json.loads(report.read_text())["records"] if report.is_file() else []
    done = {"exit": code, "wall_s": round(time.monotonic() - started, 1)}
    status.write_text(json.dumps(done))
    return {**done, "records": records}


def run_plugin_suite(out: Path, device: str, slowdown: float) -> int:
    """The 20 kernels of gate_accuracy_project/ through `pytest` with the plugin's defaults:
    a baseline saved, then `--kernelpro-check` unchanged and with `slowdown` injected.
    A false alarm is an unchanged kernel that failed the gate; a catch is a slowed kernel
    whose verdict is regressed (confirmed, as the gate fails it)."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    work = out / "project"  # the baseline file stays with the results, for a resumed call
    if not work.is_dir():
        shutil.copytree(PLUGIN_PROJECT, work)
    common = (f"--kernelpro-device={device}", "test_gate_accuracy_kernels.py")
    sessions = {
        "baseline": _pytest_session(work, out, "baseline", 0.0, "--kernelpro-save-baseline=base.yaml", *common),
        "unchanged": _pytest_session(work, out, "unchanged", 0.0, "--kernelpro-check", "--kernelpro-baseline=base.yaml", *common),
        "slowed": _pytest_session(work, out, "slowed", slowdown, "--kernelpro-check", "--kernelpro-baseline=base.yaml", *common),
    }  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    for session, result in sessions.items():
        for record in result["records"]:
            verdict = record.get("gate") or {}
            stats = (record.get("timing") or {}).get("stats") or {}
            rows.setdefault(record["name"], {})[session] = {
                "outcome": record.get("outcome"),
                "status": verdict.get("status"),
                "change": verdict.get("change"),
                "basis": verdict.get("basis") or verdict.get("gated_label"),
                "confirmed": verdict.get("confirmed"),
                "median_us": None if stats.get("median_s") is None else stats["median_s"] * 1e6,
                "message": (record.get("message") or "")[:300],
            }
    false_alarms = [
        n for n, r in rows.items() if (r.get("unchanged") or {}).get("outcome") == "failed"
    ]
    caught = [n for n, r in rows.items() if (r.get("slowed") or {}).get("status") == "regressed"]
    compared = [n for n, r in rows.items() if (r.get("slowed") or {}).get("status") is not None]

    def cell(entry: dict[str, Any] | None) -> str:
        if not entry:
            return "-"
        change = entry.get("change")
        shown = "?" if change is None else f"{change * 100:+.2f}%"
        return f"{entry.get('status') or entry.get('outcome')} {shown}"

    lines = [
        f"# Gate accuracy through pytest ({device}, injected slowdown {slowdown:.0%})",
        "",
        "| kernel | baseline median | unchanged | slowed |",
        "|:--|--:|:--|:--|",
    ]
    for name, r in rows.items():
        median = (r.get("baseline") or {}).get("median_us")
        lines.append(f"| {name} | {'-' if median is None else f'{median:.1f} µs'} | {cell(r.get('unchanged'))} | {cell(r.get('slowed'))} |")  # fmt: skip
    lines += [
        "",
        f"false alarms: {len(false_alarms)} of {sum(1 for r in rows.values() if 'unchanged' in r)} unchanged {false_alarms}",
        f"caught: {len(caught)} of {len(compared)} slowed; missed: {sorted(set(compared) - set(caught))}",
        "sessions: " + ", ".join(f"{k} exit {v['exit']} in {v['wall_s']} s" for k, v in sessions.items()),
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "gate_accuracy_plugin.md").write_text(text)
    (out / "gate_accuracy_plugin.json").write_text(json.dumps({"rows": rows, "sessions": {k: {"exit": v["exit"], "wall_s": v["wall_s"]} for k, v in sessions.items()}}, indent=1))  # fmt: skip
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument(
        "--suite",
        choices=("kernels", "add", "plugin"),
        default="kernels",
        help="kernels: 23 kernels with the plugin's defaults; add: the one add kernel; "
        "plugin: the 20 kernels of gate_accuracy_project/ through pytest itself",
    )
    parser.add_argument(
        "--plugin-slowdown",
        type=float,
        default=0.03,
        help="plugin: the slowdown injected in the second check (KP_SLOWDOWN)",
    )
    parser.add_argument("--later-warmup-ms", type=float, default=25.0)
    parser.add_argument("--min-trials", type=int, default=3)
    parser.add_argument(
        "--wide-trials", type=int, default=2,
        help="suite: trials per kernel that also measure the larger slowdowns",
    )  # fmt: skip
    parser.add_argument("--long-only", action="store_true", help="suite: only kernels >= 50 us")
    parser.add_argument(
        "--cost-reps", type=int, default=0,
        help="suite: interleaved measurements per kernel with the anchor off and on (cost)",
    )  # fmt: skip
    parser.add_argument(
        "--rules", default="default,anchor,clock3x",
        help=f"suite: gate rules applied to the same measurements ({', '.join(RULES)})",
    )  # fmt: skip
    parser.add_argument(
        "--ceilings", default=None,
        help="suite: ceilings JSON; each kernel's roofline bound from its FLOPs and bytes",
    )  # fmt: skip
    parser.add_argument("--only", default="", help="suite: comma-separated kernel names")
    parser.add_argument("--out", required=True, help="directory for the results")
    parser.add_argument("--trials", type=int, default=200, help="A/A comparisons (>= 200)")
    parser.add_argument("--ab-trials", type=int, default=100, help="A/B comparisons per slowdown")
    parser.add_argument(
        "--thresholds",
        default=None,
        help="comma-separated fractions (default: the plugin's default threshold for the "
        "device, gate.verdict.default_threshold, and 0.05)",
    )
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
    parser.add_argument(
        "--slowdowns",
        default=",".join(f"{x:g}" for x in SLOWDOWNS),
        help="comma-separated nominal slowdowns of the A/B variants",
    )
    parser.add_argument(
        "--injection",
        choices=("calibrated", "elements"),
        default="calibrated",
        help="calibrated: extra elements that cost s x t(N) (fitted t = t0 + k n); elements: "
        "N x (1 + s) elements, which slows a call by less than s when it has a fixed cost",
    )
    args = parser.parse_args(argv)
    if args.suite == "plugin":
        return run_plugin_suite(Path(args.out), args.device, args.plugin_slowdown)
    if args.suite == "kernels":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.slowdowns == ",".join(f"{x:g}" for x in SLOWDOWNS):
            args.slowdowns = ",".join(f"{x:g}" for x in SUITE_SLOWDOWNS)
        args.max_minutes = args.max_minutes or 2.0
        result = run_suite(args)
        (out / "gate_accuracy.json").write_text(json.dumps(result, indent=1, default=str))
        text = render_suite(result)
        (out / "gate_accuracy.md").write_text(text)
        print(text)
        return 0
    if args.thresholds is None:
        default = default_threshold(args.device)
        args.thresholds = ",".join(f"{t:g}" for t in sorted({default, 0.05}))
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
        *injection_lines(result),
        "",
        "",  # a blank line: a table right after a list would not start a new block
    ]
    (out / "gate_accuracy.md").write_text("\n".join(header) + table + "\n")
    print("\n".join(header) + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
