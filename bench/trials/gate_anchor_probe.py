"""What moves a power-capped kernel's time between two measurements, and what cancels it?

On the H200 the compute-bound kernels that run at the power cap (fp16/bf16/TF32 GEMMs,
attention) change their time by 1-6% between two measurements of the same code
(bench/results/2026-12-01-gate-accuracy-h200.md, runs 3-4): the clock the cap allows moves,
and the NVML mean SM clock of a measurement did not follow the kernel. This probe takes, for
each kernel, trials of the gate's pattern (a baseline measurement of A, then A again and the
+3% variant B3, in random order), in two modes on the same kernel in the same trial:

- `pure`: the kernel alone, as the plugin times it today (flush, event, kernel, event);
- `mixed`: every sample is followed, in the same round, by (1) a clock probe, a one-thread
  `torch.cuda._sleep(C)` spin of C SM cycles between two events (its time gives the SM clock
  right after the kernel: C / elapsed), (2) a fixed anchor GEMM (bf16 4096^3, random data,
  flushed), and (3) a second copy of the kernel's own op at its base size (separate buffers,
  flushed): the "reference" anchor, the same work as A.

Every sample of every measurement is kept (probe.json), so the analysis can compare, on the
same measurements, the A/A spread and the B3 change of: the raw time (pure and mixed), the
time relative to each anchor (per-sample ratio or ratio of medians), and the time times the
probe clock (cycles). `--analyze probe.json` prints that table (no GPU needed).

Run (H200):  python bench/trials/gate_anchor_probe.py --out $OUT/probe --seconds 60
CPU dry run: python bench/trials/gate_anchor_probe.py --device cpu --out /tmp/probe --seconds 5
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gate_accuracy_kernels

CAPPED = (
    "gemm_fp16_4096",
    "gemm_bf16_8192_power",
    "gemm_tf32_4096",
    "bmm_bf16_512",
    "conv3x3_fp16_nhwc",
    "conv3x3_fp32_tf32",
    "sdpa_fp16_2048",
)
STEADY = ("softmax_fp32", "layer_norm_bf16")
SAMPLES = 20  # the plugin's min_samples: the capped kernels converged at 20 in runs 3-4
PROBE_S = 40e-6  # the clock probe's spin at the maximum clock
ANCHOR_N = 4096  # anchor GEMM: bf16 ANCHOR_N^3


class Clock:
    """Events on CUDA, perf_counter on the CPU (dry run)."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        self.sleep_hz = 0.0
        if self.cuda:
            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 2**25)
            self.flush_buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
            self.sleep_hz = self._sleep_hz()

    def _sleep_hz(self) -> float:
        torch = self.torch
        torch.cuda._sleep(100_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(2_000_000)
        e.record()
        e.synchronize()
        return 2_000_000 / (s.elapsed_time(e) * 1e-3)

    def flush(self) -> None:
        if self.cuda:
            self.flush_buf.zero_()

    def measure(
        self, fn: Any, anchors: list[tuple[str, Any]], probe_cycles: int, warmup_s: float
    ) -> dict[str, Any]:
        """One measurement: warm-up on fn, then SAMPLES groups (kernel [, probe, anchors])."""
        torch = self.torch
        t_end = time.perf_counter() + warmup_s
        while True:
            self.flush()
            fn()
            if self.cuda:
                torch.cuda.synchronize()
            if time.perf_counter() >= t_end:
                break
        if not self.cuda:
            out: dict[str, list[float]] = {"kernel": []}
            for name, _ in anchors:
                out[name] = []
            for _ in range(SAMPLES):
                t0 = time.perf_counter()
                fn()
                out["kernel"].append(time.perf_counter() - t0)
                for name, a in anchors:
                    t0 = time.perf_counter()
                    a()
                    out[name].append(time.perf_counter() - t0)
            return {"times_s": out, "probe_mhz": [], "nvml": None}
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        marks: list[dict[str, Any]] = []
        torch.cuda._sleep(int(0.004 * self.sleep_hz))  # the GPU busy while the CPU enqueues
        for _ in range(SAMPLES):
            m: dict[str, Any] = {}
            self.flush()
            m["k0"], m["k1"] = ev(), ev()
            m["k0"].record()
            fn()
            m["k1"].record()
            if probe_cycles:
                m["p1"] = ev()
                torch.cuda._sleep(probe_cycles)
                m["p1"].record()
            for name, a in anchors:
                self.flush()
                m[name + "0"], m[name + "1"] = ev(), ev()
                m[name + "0"].record()
                a()
                m[name + "1"].record()
            marks.append(m)
        nvml = read_nvml()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {"kernel": [], **{n: [] for n, _ in anchors}}
        probe = []
        for m in marks:
            times["kernel"].append(m["k0"].elapsed_time(m["k1"]) * 1e-3)
            if probe_cycles:
                probe.append(probe_cycles / (m["k1"].elapsed_time(m["p1"]) * 1e-3) / 1e6)
            for name, _ in anchors:
                times[name].append(m[name + "0"].elapsed_time(m[name + "1"]) * 1e-3)
        return {"times_s": times, "probe_mhz": probe, "nvml": nvml}


_NVML: list[Any] = []


def read_nvml() -> dict[str, Any] | None:
    try:
        import pynvml as nvml

        if not _NVML:
            nvml.nvmlInit()
            _NVML.append(nvml.nvmlDeviceGetHandleByIndex(0))
        h = _NVML[0]
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return {
            "sm_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temp_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "reasons": int(fn(h)),
        }
    except Exception:
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from gate_accuracy_kernels import SUITE, set_device, tf32_mode

    if args.device == "cuda" and not torch.cuda.is_available():
        args.device = "cpu"
    set_device(args.device)
    small = args.device == "cpu"
    clock = Clock(args.device)
    names = args.only.split(",") if args.only else list(CAPPED + STEADY)
    specs = [s for s in SUITE if s.name in names]
    rng = random.Random(args.seed)
    probe_cycles = int(PROBE_S * clock.sleep_hz) if clock.cuda else 0
    an = 256 if small else ANCHOR_N
    ga, gb = (torch.randn(an, an, device=args.device, dtype=torch.bfloat16) for _ in range(2))

    def anchor_gemm() -> Any:
        return torch.matmul(ga, gb)

    deadline = time.monotonic() + args.seconds
    kernels = []
    for index, spec in enumerate(specs):
        share = max(0.0, deadline - time.monotonic()) / (len(specs) - index)
        k_start = time.monotonic()
        n0 = spec.n0_small if small else spec.n0
        n3 = n0 + max(spec.granule, round(0.03 * n0 / spec.granule) * spec.granule)
        info: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "n0": n0, "n3": n3}
        meas: list[dict[str, Any]] = []
        try:
            with tf32_mode(spec.tf32), torch.no_grad():
                launch = {"A": spec.build(n0, small), "B3": spec.build(n3, small)}
                ref = spec.build(n0, small)  # the reference anchor: the same op, own buffers
                anchors = [("gemm", anchor_gemm), ("ref", ref)]
                for fn in (*launch.values(), ref, anchor_gemm):
                    fn()
                trial = 0
                while trial < 2 or (time.monotonic() - k_start < share and trial < args.trials):
                    steps = [("A", "pure", True), ("A", "mixed", True)]
                    later = [(v, mode, False) for v in ("A", "B3") for mode in ("pure", "mixed")]
                    rng.shuffle(later)
                    for i, (variant, mode, is_base) in enumerate(steps + later):
                        first = trial == 0 and i == 0
                        got = clock.measure(
                            launch[variant],
                            anchors if mode == "mixed" else [],
                            probe_cycles if mode == "mixed" else 0,
                            0.3 if first else args.warmup_ms / 1000,
                        )
                        got.update(trial=trial, variant=variant, mode=mode, base=is_base,
                                   t=round(time.monotonic() - k_start, 4))  # fmt: skip
                        meas.append(got)
                    trial += 1
                info["trials"] = trial
                del launch, ref
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"[:400]
        info["measurements"] = meas
        kernels.append(info)
        if clock.cuda:
            torch.cuda.empty_cache()
        print(f"[probe] {spec.name}: {info.get('trials')} trials {info.get('error', '')}",
              file=sys.stderr, flush=True)  # fmt: skip
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if clock.cuda else "cpu",
        "machine": f"{platform.node()} python {platform.python_version()} torch {torch.__version__}",
        "command": " ".join(sys.argv),
        "samples": SAMPLES,
        "probe_cycles": probe_cycles,
        "sleep_hz": clock.sleep_hz,
        "anchor": f"bf16 matmul {an}x{an}x{an}",
        "kernels": kernels,
    }


# --- analysis (CPU) ----------------------------------------------------------------------


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else math.nan


def quantity(m: dict[str, Any], how: str) -> float:
    """One measurement's value under a comparison rule (the median of its samples)."""
    t = m["times_s"]
    k = t["kernel"]
    if how == "time":
        return _med(k)
    if how in ("gemm", "ref"):  # ratio of medians: kernel / anchor
        return _med(k) / _med(t[how])
    if how in ("gemm_paired", "ref_paired"):
        a = t[how.split("_")[0]]
        return _med([x / y for x, y in zip(k, a, strict=False)])
    if how == "cycles":  # time x the probe clock right after each sample
        return (
            _med([x * f for x, f in zip(k, m["probe_mhz"], strict=False)])
            if m["probe_mhz"]
            else math.nan
        )
    raise ValueError(how)


RULES = (
    ("pure", "time"),
    ("mixed", "time"),
    ("mixed", "gemm"),
    ("mixed", "gemm_paired"),
    ("mixed", "ref"),
    ("mixed", "ref_paired"),
    ("mixed", "cycles"),
)


def analyze(result: dict[str, Any]) -> str:
    lines = [
        f"# Anchor probe on {result['device']} ({result['date']})",
        "",
        f"- command: `{result['command']}`; {result['samples']} samples per measurement; "
        f"anchor {result['anchor']}; clock probe {result['probe_cycles']} cycles",
        "",
        "Per kernel and rule: A/A = change between the baseline measurement of A and a later "
        "one in the same trial (standard deviation over trials, max |change|); B3 = median "
        "change of the +3% variant; z = B3 median / A/A sd (how many noise widths a 3% "
        "slowdown is).",
        "",
        "| kernel | trials | A µs | probe MHz (A) | NVML MHz | "
        + " | ".join(f"{m}:{h} A/A sd / max / B3 / z" for m, h in RULES)
        + " |",
        "|:--|--:|--:|--:|--:|" + "--:|" * len(RULES),
    ]
    for k in result["kernels"]:
        ms = k.get("measurements") or []
        if not ms:
            lines.append(f"| {k['name']} | {k.get('error', 'no data')} |")
            continue
        cells = []
        for mode, how in RULES:
            aa, b3 = [], []
            for trial in sorted({m["trial"] for m in ms}):
                sel = [m for m in ms if m["trial"] == trial and m["mode"] == mode]
                base = [m for m in sel if m["base"]]
                if not base:
                    continue
                ref = quantity(base[0], how)
                for m in sel:
                    if m["base"]:
                        continue
                    ch = quantity(m, how) / ref - 1
                    (aa if m["variant"] == "A" else b3).append(ch)
            aa = [x for x in aa if x == x]
            sd = statistics.pstdev(aa) if len(aa) > 1 else math.nan
            mx = max((abs(x) for x in aa), default=math.nan)
            b = _med(b3)
            z = b / sd if sd and sd == sd else math.nan
            cells.append(f"{sd * 100:.2f}% / {mx * 100:.2f}% / {b * 100:+.2f}% / {z:.1f}")
        a_pure = [
            _med(m["times_s"]["kernel"]) for m in ms if m["mode"] == "pure" and m["variant"] == "A"
        ]
        probe = [_med(m["probe_mhz"]) for m in ms if m["probe_mhz"] and m["variant"] == "A"]
        nv = [m["nvml"]["sm_mhz"] for m in ms if m.get("nvml") and m["variant"] == "A"]
        lines.append(
            f"| {k['name']} | {k.get('trials')} | {_med(a_pure) * 1e6:.1f} | "
            f"{_med(probe):.0f} | {_med(nv):.0f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", help="directory for probe.json and probe.md")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="later measurements")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--analyze", help="print the analysis of a probe.json and exit")
    args = parser.parse_args(argv)
    if args.analyze:
        print(analyze(json.loads(Path(args.analyze).read_text())))
        return 0
    if not args.out:
        parser.error("--out is required to run the probe")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "probe.json").write_text(json.dumps(result, default=str))
    text = analyze(result)
    (out / "probe.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
