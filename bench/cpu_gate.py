"""The CPU gate on this machine: false alarms of unchanged kernels and a 2x slowdown, quiet
and beside a CPU hog, through real `pytest --kernelpro-check` sessions.

For each condition ("quiet": the machine as it is, no hog of ours; "busy": `--hogs` processes
running `while True: pass`, started and killed here), a fresh project of 20 unchanged CPU
kernels plus `doubled` (a 256^3 matmul whose `KP_WORK=2` does the product twice) and
`doubled_softmax` (a 1024x1024 softmax whose `KP_WORK=2` does its pass twice) saves a
baseline in session 0, then runs `--sessions` sessions of `--kernelpro-check` with
`KP_WORK=2`: both doubled kernels must fail every session, the 20 others never. Each verdict is read
from the session's JSON report; the same records are also compared offline with the old rule
(times, no CPU anchor: `decide_verdict` on the records and entries without their CPU-anchored
samples, before its confirmation) for the "before" column.

    python bench/cpu_gate.py --out /tmp/cpu_gate            # both conditions, 5 sessions
    python bench/cpu_gate.py --conditions busy --sessions 1  # a quick look

Prints a markdown summary last; writes every session's verdicts to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

KERNELS = textwrap.dedent(
    """
    import os
    import pytest
    import torch
    import torch.nn.functional as F

    def g():
        return torch.Generator().manual_seed(0)

    def vec(n):
        return lambda device: (torch.randn(n, generator=g()),)

    def two(n):
        return lambda device: (torch.randn(n, generator=g()), torch.randn(n, generator=g()))

    def mat(*shape):
        return lambda device: (torch.randn(*shape, generator=g()),)

    def mats(a, b):
        return lambda device: (torch.randn(*a, generator=g()), torch.randn(*b, generator=g()))

    @pytest.mark.kernelpro(reference=torch.add, inputs=two(1_000_000))
    def add_1m(a, b):
        return a + b

    @pytest.mark.kernelpro(reference=torch.mul, inputs=two(1_000_000))
    def mul_1m(a, b):
        return a * b

    @pytest.mark.kernelpro(reference=F.relu, inputs=vec(1_000_000))
    def relu_1m(x):
        return torch.relu(x)

    @pytest.mark.kernelpro(reference=F.gelu, inputs=mat(256, 1024))
    def gelu(x):
        return F.gelu(x)

    @pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, -1), inputs=mat(256, 1024))
    def softmax(x):
        return torch.softmax(x, -1)

    @pytest.mark.kernelpro(reference=lambda x: F.layer_norm(x, (1024,)), inputs=mat(256, 1024))
    def layer_norm(x):
        return F.layer_norm(x, (1024,))

    @pytest.mark.kernelpro(reference=torch.sum, inputs=vec(4_000_000))
    def sum_4m(x):
        return x.sum()

    @pytest.mark.kernelpro(reference=lambda x: torch.cumsum(x, 0), inputs=vec(1_000_000))
    def cumsum_1m(x):
        return torch.cumsum(x, 0)

    @pytest.mark.kernelpro(reference=torch.exp, inputs=vec(1_000_000))
    def exp_1m(x):
        return x.exp()

    @pytest.mark.kernelpro(reference=torch.mm, inputs=mats((128, 128), (128, 128)))
    def mm_128(a, b):
        return a @ b

    @pytest.mark.kernelpro(reference=torch.mm, inputs=mats((256, 256), (256, 256)))
    def mm_256(a, b):
        return a @ b

    @pytest.mark.kernelpro(reference=torch.bmm, inputs=mats((8, 64, 64), (8, 64, 64)))
    def bmm_8x64(a, b):
        return a @ b

    @pytest.mark.kernelpro(reference=lambda x, w: F.conv2d(x, w, padding=1),
                           inputs=mats((1, 8, 64, 64), (16, 8, 3, 3)))
    def conv3x3(x, w):
        return F.conv2d(x, w, padding=1)

    @pytest.mark.kernelpro(reference=lambda x: x.t().contiguous(), inputs=mat(1024, 1024))
    def transpose_1k(x):
        return x.t().contiguous()

    @pytest.mark.kernelpro(reference=lambda x: x.amax(1), inputs=mat(1024, 1024))
    def rowmax_1k(x):
        return x.amax(1)

    @pytest.mark.kernelpro(reference=lambda x: x.clamp(-1, 1), inputs=vec(1_000_000))
    def clamp_1m(x):
        return torch.clamp(x, -1, 1)

    @pytest.mark.kernelpro(reference=torch.sigmoid, inputs=vec(1_000_000))
    def sigmoid_1m(x):
        return x.sigmoid()

    @pytest.mark.kernelpro(reference=lambda x: x.mean(1), inputs=mat(2048, 512))
    def rowmean(x):
        return x.mean(1)

    @pytest.mark.kernelpro(reference=torch.mv, inputs=mats((2048, 2048), (2048,)))
    def matvec_2k(a, x):
        return a @ x

    @pytest.mark.kernelpro(reference=lambda a, b: torch.tanh(a) * b, inputs=two(500_000))
    def tanh_mul(a, b):
        return torch.tanh(a) * b

    @pytest.mark.kernelpro(reference=torch.mm, inputs=mats((256, 256), (256, 256)))
    def doubled(a, b):
        out = torch.mm(a, b)
        for _ in range(int(os.environ.get("KP_WORK", "1")) - 1):
            out = torch.mm(a, b)  # the same product again: twice the work
        return out

    @pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, -1), inputs=mat(1024, 1024))
    def doubled_softmax(x):
        out = torch.softmax(x, -1)
        for _ in range(int(os.environ.get("KP_WORK", "1")) - 1):
            out = torch.softmax(x, -1)  # a memory-bound kernel doing its pass twice
        return out
    """
)
SLOWED = ("doubled", "doubled_softmax")
# Ceilings far above this CPU: the roofline is not what this bench measures, and a fixed file
# spares every fresh project the ceilings' measurement.
CEILINGS = {
    "device": "bench-no-roofline",
    "bandwidth_Bps": 1e15,
    "flops": {"fp32": 1e18, "fp64": 1e18, "bf16": 1e18},
    "source": "measured",
    "measured_at": "2026-12-02T00:00:00",
    "torch_version": "bench",
    "details": {},
}


def make_project(root: Path, budget: float) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "test_bench.py").write_text(KERNELS)
    (root / "ceilings.json").write_text(json.dumps(CEILINGS))
    (root / "pytest.ini").write_text(
        "[pytest]\n"
        f"kernelpro_ceilings = {root / 'ceilings.json'}\n"
        f"kernelpro_time_budget = {budget}\n"
        "kernelpro_history = off\n"
    )


def run_session(root: Path, args: list[str], work: int) -> dict[str, Any]:
    env = {**os.environ, "KP_WORK": str(work)}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
        cwd=root, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - started
    report_path = root / ".kernelpro" / "kernelpro-report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {"records": []}
    return {
        "rc": proc.returncode,
        "wall_s": wall,
        "loadavg_1m": os.getloadavg()[0],
        "records": report.get("records", []),
        "tail": proc.stdout[-3000:] + proc.stderr[-2000:],
    }


def old_rule(records: list[dict[str, Any]], baseline: Path) -> dict[str, str]:
    """Each record compared with the old rule: times, no CPU anchor, before confirmation (the
    gate's own rule for a record and an entry without CPU-anchored samples)."""
    import dataclasses

    import msgspec

    from pytest_kernelpro.gate.baseline import load_baseline
    from pytest_kernelpro.gate.verdict import decide_verdict
    from pytest_kernelpro.record import record_from_builtins

    base = load_baseline(baseline)
    out = {}
    for raw in records:
        record = record_from_builtins(raw, source="a record of the check's report")
        entry = base.entry_for(record)
        if record.timing is None or entry is None:
            continue
        timing = msgspec.structs.replace(record.timing, anchor=None)
        bare = dataclasses.replace(
            entry, anchor=None, cpu_kernel_s=None, cpu_anchor_s=None, cpu_memory_s=None
        )
        old = decide_verdict(msgspec.structs.replace(record, timing=timing), bare)
        out[record.name] = old.change_status
    return out


def gemm_anchor_only(records: list[dict[str, Any]], baseline: Path) -> dict[str, str]:
    """Each record compared by the rule before the memory anchor (the GEMM anchor alone),
    before confirmation: the record and the entry without the memory anchor's samples."""
    import dataclasses

    import msgspec

    from pytest_kernelpro.gate.baseline import load_baseline
    from pytest_kernelpro.gate.verdict import decide_verdict
    from pytest_kernelpro.record import record_from_builtins

    base = load_baseline(baseline)
    out = {}
    for raw in records:
        record = record_from_builtins(raw, source="a record of the check's report")
        entry = base.entry_for(record)
        if record.timing is None or entry is None or not isinstance(record.timing.anchor, dict):
            continue
        anchor = {**record.timing.anchor, "memory_s": []}
        timing = msgspec.structs.replace(record.timing, anchor=anchor)
        verdict = decide_verdict(
            msgspec.structs.replace(record, timing=timing),
            dataclasses.replace(entry, cpu_memory_s=None),
        )
        out[record.name] = f"{verdict.change_status} {100 * (verdict.change or 0):+.0f}%"
    return out


MEMORY_HOG = (
    "import numpy as np\n"
    "a = np.ones(128 << 20, dtype=np.float32); b = np.empty_like(a)\n"
    "while True:\n    np.copyto(b, a); a += 1\n"
)


def run_condition(name: str, root: Path, sessions: int, budget: float, hogs: int) -> dict[str, Any]:
    """ "busy": the baseline and the checks beside `hogs` busy loops; "memory": the baseline
    on the machine as it is, the checks beside one process copying 512 MiB over and over
    (another process's memory traffic arriving between the baseline and the head)."""
    make_project(root, budget)
    procs = []
    try:
        for _ in range(hogs):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(1.0 if hogs else 0.0)
        base = run_session(root, ["--kernelpro-save-baseline"], work=1)
        if name == "memory":
            procs.append(subprocess.Popen([sys.executable, "-c", MEMORY_HOG]))
            time.sleep(2.0)
        print(
            f"[{name}] baseline: rc {base['rc']}, {base['wall_s']:.0f} s, load {base['loadavg_1m']:.1f}",
            flush=True,
        )
        runs = []
        for i in range(sessions):
            run = run_session(root, ["--kernelpro-check"], work=2)
            run["old_rule"] = old_rule(run["records"], root / "kernelpro-baseline.yaml")
            run["gemm_only"] = gemm_anchor_only(run["records"], root / "kernelpro-baseline.yaml")
            runs.append(run)
            gates = {r["name"]: (r.get("gate") or {}) for r in run["records"]}
            failed = sorted(n for n, g in gates.items() if g.get("failed"))
            print(
                f"[{name}] session {i + 1}: rc {run['rc']}, {run['wall_s']:.0f} s, load {run['loadavg_1m']:.1f}, failed {failed}",
                flush=True,
            )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return {"condition": name, "hogs": hogs, "baseline": base, "sessions": runs}


def summarize(result: dict[str, Any]) -> list[str]:
    new_unchanged: Counter[str] = Counter()
    old_unchanged: Counter[str] = Counter()
    slowed_new: dict[str, list[str]] = {name: [] for name in SLOWED}
    slowed_old: dict[str, list[str]] = {name: [] for name in SLOWED}
    slowed_gemm: dict[str, list[str]] = {name: [] for name in SLOWED}
    gemm_unchanged: Counter[str] = Counter()
    failures = 0
    changes: list[float] = []
    tolerances: list[float] = []
    loads = [run["loadavg_1m"] for run in result["sessions"]]
    for run in result["sessions"]:
        for raw in run["records"]:
            gate = raw.get("gate") or {}
            status = str(gate.get("status") or raw.get("outcome"))
            if raw["name"] in SLOWED:
                name = raw["name"]
                slowed_new[name].append(f"{status} {100 * (gate.get('change') or 0):+.0f}%")
                slowed_old[name].append(run["old_rule"].get(name, "-"))
                slowed_gemm[name].append(run.get("gemm_only", {}).get(name, "-"))
                continue
            new_unchanged[status] += 1
            failures += bool(gate.get("failed"))
            if gate.get("change") is not None:
                changes.append(abs(float(gate["change"])))
            if gate.get("tolerance") is not None:
                tolerances.append(float(gate["tolerance"]))
        for kernel, status in run["old_rule"].items():
            if kernel not in SLOWED:
                old_unchanged[status] += 1
        for kernel, status in run.get("gemm_only", {}).items():
            if kernel not in SLOWED:
                gemm_unchanged[status.split()[0]] += 1
    n = sum(new_unchanged.values())
    lines = [
        f"### {result['condition']} ({result['hogs']} hog process(es); load average "
        f"{min(loads):.1f}-{max(loads):.1f} during the checks)",
        "",
        "| | this gate (CPU anchor, confirmed) | old rule (times, unconfirmed) |",
        "|:--|:--|:--|",
        f"| 20 unchanged kernels x {len(result['sessions'])} sessions: failures | {failures} of {n} | "
        f"{old_unchanged.get('regressed', 0)} 'regressed' (before confirmation) |",
        f"| unchanged: verdicts | {dict(new_unchanged)} | {dict(old_unchanged)} |",
    ]
    for name in SLOWED:
        lines.append(
            f"| `{name}` (2x work) per session | {', '.join(slowed_new[name])} | "
            f"{', '.join(slowed_old[name])} |"
        )
    lines.append(
        f"| before the memory anchor (the GEMM anchor alone, unconfirmed): unchanged | "
        f"{dict(gemm_unchanged)} | |"
    )
    for name in SLOWED:
        lines.append(f"| before the memory anchor: `{name}` | {', '.join(slowed_gemm[name])} | |")
    if changes:
        import numpy as np

        lines.append(
            f"| unchanged: compared change, median / max abs | {np.median(changes):.1%} / "
            f"{max(changes):.1%} | |"
        )
        lines.append(
            f"| unchanged: tolerance, median / max | {np.median(tolerances):.0%} / {max(tolerances):.0%} | |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/kernelpro-cpu-gate"))
    parser.add_argument("--conditions", default="quiet,busy,memory")
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--budget", type=float, default=1.0, help="--kernelpro-time-budget (s)")
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes in 'busy'")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    for name in args.conditions.split(","):
        root = args.out / f"project-{name}"
        results.append(
            run_condition(
                name, root, args.sessions, args.budget, args.hogs if name == "busy" else 0
            )
        )
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(
        f"\ntotal {time.perf_counter() - started:.0f} s, {os.cpu_count()} CPUs, budget {args.budget} s\n"
    )
    for result in results:
        print("\n".join(summarize(result)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
