"""One optimizer evaluation's wall split on the CPU, small and large softmax, through the real
optimize path (`pytest --kernelpro-problems --kernelpro-optimize=N --kernelpro-llm=replay:DIR`).

    python bench/optimizer_handles.py --label before --out /tmp/oh            # both sizes
    python bench/optimizer_handles.py --label after --sizes small --out /tmp/oh

For each size:
1. the gate on the same problem (`pytest --kernelpro-problems`, no optimizer): its wall time,
   the budget the optimizer's first five evaluations are held to (at most 5x);
2. the optimizer with `--evals` replayed candidates (correct PyTorch forms and one wrong
   one): each evaluation's wall from the model's reply to its reward (`elapsed_s`) and its
   split (sandbox start, build, checks, timing, judge) from the summary's `per_candidate`;
3. the machine's used host memory sampled every 50 ms during the optimizer run (peak over
   the run minus the idle level before it: every process of the run, other agents' changes
   included), and the load average before and after;
4. the CPU seconds (user + system) and minor page faults of each run's processes, the
   sandbox's included (`getrusage(RUSAGE_CHILDREN)` around it: every descendant that was
   waited for): counts that a busy machine moves far less than it moves wall times.

Sizes: small 64x512 fp32; large ROWSxCOLS fp32 (default 16384x32768: 2 GiB of input and
2 GiB of output). One JSON line per size goes to OUT/handles.jsonl and a table is printed.

At 16384x32768 on a 24 GiB machine two defaults stop the run before any evaluation:
`--item-timeout S` passes `--kernelpro-item-timeout=S` to both runs (the gate's item passed
the default 300 s there), and `--sandbox-memory-mb N` gives the optimize run's sandbox that
memory limit instead of half the machine's (`SandboxLimits.memory_limit_mb`: its footprint
check refuses the problem before the first evaluation), through a `conftest.py` in the
throwaway project that wraps `sandbox.evaluator.SandboxLimits`. Both go into the JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# A VM's free page reporting hands pages free for about 2 s back to its host; touching them
# again costs a host fault each (on this VM 1.1-1.6 s a GiB instead of 0.36). The run's
# processes take turns and wait on each other, so their memory goes cold between turns more
# than one gate process's does. The order is the smallest block reported (above the largest
# order, 10, nothing is): recorded with every run.
PAGE_REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")


def page_reporting_order() -> int | None:
    try:
        return int(PAGE_REPORTING_ORDER.read_text().strip())
    except (OSError, ValueError):
        return None


PROBLEM = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = {rows}
dim = {cols}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""

REPLIES = [
    ("the functional softmax", "return torch.nn.functional.softmax(x, dim=-1)"),
    (
        "exp over the row sum after the row max",
        "m = x.amax(dim=1, keepdim=True)\n        e = (x - m).exp_()\n"
        "        return e.div_(e.sum(dim=1, keepdim=True))",
    ),
    ("softmax with an explicit float32 cast", "return torch.softmax(x.float(), dim=1)"),
    ("wrong: exp without normalising", "return x.exp()"),
    ("log-softmax exponentiated", "return torch.log_softmax(x, dim=1).exp()"),
]

SPLIT_KEYS = (
    "elapsed_s", "sandbox_start_s", "build_s", "checks_s", "timing_s", "judge_s", "peak_mb",
)  # fmt: skip


def used_mb() -> float:
    info: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            name, value = line.split(":", 1)
            info[name] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


class MemorySampler:
    """Peak of the machine's used host memory while running (50 ms samples)."""

    def __init__(self) -> None:
        self.idle = used_mb()
        self.peak = self.idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, used_mb())

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# The throwaway project's conftest for `--sandbox-memory-mb`: every SandboxLimits the
# optimize path makes gets the memory limit given, unless it names one.
MEMORY_CONFTEST = """from pytest_kernelpro.optimize.sandbox import evaluator

_limits = evaluator.SandboxLimits


def _with_memory(*args, **kwargs):
    kwargs.setdefault("memory_limit_mb", {mb})
    return _limits(*args, **kwargs)


evaluator.SandboxLimits = _with_memory
"""


def make_project(rows: int, cols: int, evals: int, sandbox_memory_mb: int | None = None) -> Path:
    from pytest_kernelpro.optimize.loop.replay import recording_record

    project = Path(tempfile.mkdtemp(prefix="kernelpro-handles-"))
    (project / "problems").mkdir()
    (project / "problems" / "softmax.py").write_text(PROBLEM.format(rows=rows, cols=cols))
    (project / "replays").mkdir()
    with open(project / "replays" / "softmax.jsonl", "w", encoding="utf-8") as handle:
        for k in range(evals):
            strategy, body = REPLIES[k % len(REPLIES)]
            text = (
                f"### Strategy: {strategy}\n```python\nimport torch\nfrom torch import nn\n\n\n"
                f"class ModelNew(nn.Module):\n    def forward(self, x):\n        {body}\n```\n"
            )
            handle.write(json.dumps(recording_record(text)) + "\n")
    (project / "pytest.ini").write_text("[pytest]\nkernelpro_time_budget = 0.5\n")
    if sandbox_memory_mb is not None:
        (project / "conftest.py").write_text(MEMORY_CONFTEST.format(mb=int(sandbox_memory_mb)))
    return project


def optimizer_plugin_args() -> list[str]:
    """`-p` for the optimizer plugin where the environment's installed metadata does not
    register its entry point (`kernelpro_optimize`), else nothing (registering it twice fails)."""
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="pytest11")}
    return [] if "kernelpro_optimize" in names else ["-p", "pytest_kernelpro.optimize.plugin"]


def children_usage() -> tuple[float, int]:
    """CPU seconds (user + system) and minor page faults of this process's waited-for
    descendants so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime, used.ru_minflt


def run_pytest(
    project: Path, extra: list[str], timeout: float, log: Path | None = None
) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "--kernelpro-problems=problems", "--kernelpro-device=cpu", *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    cpu_before, faults_before = children_usage()
    try:
        proc = subprocess.run(
            cmd, cwd=project, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        code: Any = proc.returncode
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = "timeout", str(exc.stdout or "")
    tail = text[-2500:]
    if log is not None:  # the whole output: each evaluation's progress line is in it
        log.write_text(text, encoding="utf-8")
    cpu_after, faults_after = children_usage()
    return {
        "exit": code,
        "wall_s": round(time.monotonic() - started, 2),
        "cpu_s": round(cpu_after - cpu_before, 2),
        "minor_faults": faults_after - faults_before,
        "tail": tail,
    }


def optimize_summary(project: Path) -> dict[str, Any]:
    report = project / ".kernelpro" / "kernelpro-report.json"
    summary: dict[str, Any] = {}
    if report.is_file():
        for record in json.loads(report.read_text()).get("records", []):
            summary = (record.get("extra") or {}).get("optimize") or summary
    return summary


def split_of(row: dict[str, Any]) -> dict[str, Any]:
    """The wall split of one evaluation: the summary's `wall_split` where the evaluator
    gives one, else derived from the older fields (phases and the clock's buckets)."""
    split = dict(row.get("wall_split") or {})
    if not split:
        phases = row.get("phases") or {}
        split = {
            "sandbox_start_s": sum(phases.get(k, 0.0) for k in ("launch", "start", "import")),
            "build_s": row.get("build_s"),
            "checks_s": sum(
                phases.get(k, 0.0)
                for k in ("reference", "built", "correctness", "checks", "shapes", "timed")
            ),
            "timing_s": phases.get("timing", row.get("time_s")),
            "judge_s": row.get("judge_s"),
        }
    split["elapsed_s"] = row.get("elapsed_s")
    for key in ("peak_mb", "worker_peak_mb", "judge_peak_mb", "both_peak_mb", "both_peak_at"):
        split[key] = row.get(key)
    return {
        "strategy": row.get("strategy"),
        "status": row.get("status"),
        **{k: (round(v, 2) if isinstance(v, (int, float)) else v) for k, v in split.items()},
        "phases": row.get("phases"),
    }


def measure(
    out: Path,
    label: str,
    size: str,
    rows: int,
    cols: int,
    evals: int,
    timeout: float,
    item_timeout: float | None = None,
    sandbox_memory_mb: int | None = None,
) -> dict[str, Any]:
    project = make_project(rows, cols, evals, sandbox_memory_mb)
    common = [] if item_timeout is None else [f"--kernelpro-item-timeout={item_timeout:g}"]
    load_before = os.getloadavg()
    try:
        with MemorySampler() as gate_memory:
            gate = run_pytest(project, common, timeout)
        with MemorySampler() as memory:
            optimize = run_pytest(
                project,
                [
                    *common,
                    *optimizer_plugin_args(),
                    f"--kernelpro-optimize={evals}",
                    "--kernelpro-llm=replay:replays",
                    "--kernelpro-feedback=none",
                    "--kernelpro-candidates=1",
                ],
                timeout,
                log=out / f"{label}-{size}-optimize.log",
            )
        summary = optimize_summary(project)
        report = project / ".kernelpro" / "kernelpro-report.json"
        if report.is_file():  # kept: the project goes below
            shutil.copy(report, out / f"{label}-{size}-report.json")
    finally:
        shutil.rmtree(project, ignore_errors=True)
    per = [split_of(c) for c in summary.get("per_candidate") or []]
    footprint_mb = 2 * rows * cols * 4 / 2**20  # one call: input + output, fp32
    return {
        "size": size,
        "shape": [rows, cols],
        "footprint_mb": round(footprint_mb, 1),
        "gate": {k: gate[k] for k in ("exit", "wall_s", "cpu_s", "minor_faults")}
        | ({"tail": gate["tail"]} if gate["exit"] != 0 else {}),
        "gate_peak_used_mb": round(gate_memory.peak - gate_memory.idle),
        "optimize": {k: optimize[k] for k in ("exit", "wall_s", "cpu_s", "minor_faults")}
        | ({"tail": optimize["tail"]} if optimize["exit"] != 0 else {}),
        "optimize_peak_used_mb": round(memory.peak - memory.idle),
        "status": summary.get("status"),
        "outcomes": summary.get("outcomes"),
        "wall": summary.get("wall_s"),
        "evaluations": per,
        "item_timeout_s": item_timeout,
        "sandbox_memory_mb": sandbox_memory_mb,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "page_reporting_order": page_reporting_order(),
    }


def table(rows: list[dict[str, Any]]) -> None:
    for data in rows:
        print(
            f"\n== {data['label']} {data['size']} {data['shape'][0]}x{data['shape'][1]} "
            f"(footprint {data['footprint_mb']} MB; load {data['load_before']} -> "
            f"{data['load_after']}) =="
        )
        print(
            f"gate: exit {data['gate']['exit']}, {data['gate']['wall_s']} s; optimize: exit "
            f"{data['optimize']['exit']}, {data['optimize']['wall_s']} s, peak used "
            f"{data['optimize_peak_used_mb']} MB ({data['optimize_peak_used_mb'] / max(data['footprint_mb'], 1e-9):.1f}x footprint)"
        )
        print(
            f"cpu s (faults): gate {data['gate'].get('cpu_s')} ({data['gate'].get('minor_faults')}), "
            f"optimize {data['optimize'].get('cpu_s')} ({data['optimize'].get('minor_faults')})"
        )
        print(
            "  strategy                                 status     "
            + " ".join(f"{k:>15}" for k in SPLIT_KEYS)
        )
        for e in data["evaluations"]:
            print(f"  {str(e['strategy'])[:40]:40} {str(e['status']):10} " + " ".join(f"{e.get(k)!s:>15}" for k in SPLIT_KEYS))  # fmt: skip
        first = [e.get("elapsed_s") or 0.0 for e in data["evaluations"][:5]]
        if first:
            print(f"  first {len(first)} evaluations: {sum(first):.1f} s = "
                  f"{sum(first) / max(data['gate']['wall_s'], 1e-9):.1f}x the gate's {data['gate']['wall_s']} s")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--label", required=True)
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=32768)
    parser.add_argument("--evals", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1500.0)
    parser.add_argument("--item-timeout", type=float, default=None)
    parser.add_argument("--sandbox-memory-mb", type=int, default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = {"small": (64, 512), "large": (args.rows, args.cols)}
    done = []
    for size in args.sizes.split(","):
        rows, cols = shapes[size]
        measured = measure(
            args.out,
            args.label,
            size,
            rows,
            cols,
            args.evals,
            args.timeout,
            args.item_timeout,
            args.sandbox_memory_mb,
        )
        data = {"label": args.label, **measured}
        with open(args.out / "handles.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(data) + "\n")
        done.append(data)
    table(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
