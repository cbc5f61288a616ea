"""The item time limit against a kernel that spins on the GPU (native hang), with and
without `--kernelpro-isolate`.

A temporary project holds two kernels, in this order: `spins`, whose launch enqueues a
Triton kernel that never ends (`--spin triton`, the default; `--spin sleep`: ~500 s of
`torch.cuda._sleep`), so the host then waits in native code, in the correctness check's
synchronisation, where no Python signal handler can run; and `healthy`, an ordinary GPU add.
(On the H200 on 2026-12-01 a `_sleep` spin was failed by SIGALRM, not the watchdog, and the
next item ran on a free GPU: `--sleep-probe-s` records what a host wait behind `_sleep` does.) Two pytest runs, each in its own process:

1. `--kernelpro-item-timeout=5` (and a 0.2 s timing budget, so `healthy` fits well inside): the SIGALRM cannot fire inside the native wait, so the
   watchdog thread must end the process `WATCHDOG_GRACE_S` after the limit, with exit status
   3, the hung item's failed record in the records log and a JSON report of what finished.
2. `--kernelpro-isolate --kernelpro-item-timeout=5`: the parent must kill the spinning
   child's process group at the limit plus `STARTUP_ALLOWANCE_S`, fail `spins` with a
   message saying so, and run `healthy` in a fresh child on the same GPU: it must pass.

To spend seconds, not minutes, of device time the project's conftest shortens two constants
(30 s and 60 s in the plugin): `WATCHDOG_GRACE_S` to 3 s in run 1; in run 2 the parent's
`STARTUP_ALLOWANCE_S` to 10 s and the child's grace to 600 s, so the child cannot end itself
and the parent's kill is what is tested. The mechanisms are the plugin's own.

3. The profiler's children after a large item (`--kernelpro-profile` on a 48 GiB-input row
   sum whose check fills this process's allocator cache to ~96 GiB): the kineto timeline
   child must get the memory to re-create the problem (the parent empties its cache before
   profiling; the record keeps the free memory the children had). ncu is left out
   (`--profile-ncu` lets it run): its replay saves and restores the 48 GiB per pass.

    python bench/trials/item_limits_gpu.py --out $OUT/limits --ceilings CEILINGS.json   (GPU; ~90 s)
    python bench/trials/item_limits_gpu.py --out /tmp/limits --device cpu   (dry run: time.sleep
        stands in for the GPU spin, so run 1 is the SIGALRM path, not the watchdog)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFTEST = """
import os, sys
import pytest_kernelpro.run.context as limits
import pytest_kernelpro.run.isolate as isolate

if "--kernelpro-isolated-child" in sys.argv:
    limits.WATCHDOG_GRACE_S = float(os.environ.get("KP_BENCH_CHILD_GRACE", "30"))
else:
    limits.WATCHDOG_GRACE_S = float(os.environ.get("KP_BENCH_GRACE", "30"))
    isolate.STARTUP_ALLOWANCE_S = float(os.environ.get("KP_BENCH_STARTUP", "60"))
"""

KERNELS = """
import os, time
import pytest, torch

def inp(device):
    return (torch.randn(1 << 20, device=device),)

SPIN = None
if os.environ.get("KP_BENCH_SPIN") == "triton":
    import triton
    import triton.language as tl

    @triton.jit
    def _spin_forever(flag_ptr):
        # The flag is never set; an atomic read each time so the load cannot be hoisted.
        v = tl.atomic_add(flag_ptr, 0)
        while v == 0:
            v = tl.atomic_add(flag_ptr, 0)

    # Compile (and run once, with the flag set, so it returns at once) at import: the
    # compile stays out of the item's time limit, and the item's launch is the spin itself.
    if torch.cuda.is_available():
        _spin_forever[(1,)](torch.ones(1, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()

    def SPIN(x):
        try:
            _spin_forever[(1,)](torch.zeros(1, dtype=torch.int32, device=x.device))
        except Exception as exc:  # say so, and spin with _sleep instead
            with open("spin_fallback.txt", "w") as handle:
                handle.write(repr(exc)[:2000])
            torch.cuda._sleep(1_000_000_000_000)

def spin(x):
    if x.is_cuda and SPIN is not None:
        SPIN(x)  # never ends: the host waits for it in native code
    elif x.is_cuda:
        torch.cuda._sleep(1_000_000_000_000)  # ~500 s of cycles at 2 GHz
    else:
        time.sleep(600)
    return x + 1

@pytest.mark.kernelpro(reference=lambda x: x + 1, inputs=inp)
def spins(x):
    return spin(x)

@pytest.mark.kernelpro(reference=lambda x: x + 1, inputs=inp)
def healthy(x):
    return x + 1
"""


# The profiler's children after a large item: `big` fills this process's caching allocator
# (its check holds the inputs, the kernel's copy and both outputs: ~2x a 48 GiB input for a
# reduction) and is then profiled: ncu and the kineto timeline re-create the problem in
# child processes, which need the 48 GiB input again. Without the parent emptying its cache
# first they would find about 139 - 96 GiB free; with it, 139 - 48.
PROFILE_KERNELS = """
import os
import pytest, torch

ROWS, COLS = 4096, int(os.environ.get("KP_BENCH_BIG_COLS", str(3 << 20)))

def big_inputs(device):
    return (torch.randn(ROWS, COLS, device=device),)

def row_sums(x):
    return x.sum(dim=-1)

@pytest.mark.kernelpro(reference=row_sums, inputs=big_inputs)
def big(x):
    return x.sum(dim=-1)
"""


def plugin_autoloaded() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "pytest_kernelpro.plugin" for ep in entry_points(group="pytest11"))


def run(project: Path, args: list[str], env: dict[str, str], limit_s: float) -> dict:
    load = [] if plugin_autoloaded() else ["-p", "pytest_kernelpro.plugin"]
    cmd = [sys.executable, "-m", "pytest", *load, "-p", "no:cacheprovider", "-q", *args]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True,
                              timeout=limit_s)  # fmt: skip
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
    wall = time.monotonic() - started
    report = project / ".kernelpro" / "kernelpro-report.json"
    records_log = report.with_suffix(".jsonl")
    records = []
    finished = False
    if records_log.exists():
        for line in records_log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if event.get("kind") == "record":
                records.append(event["record"])
            finished = finished or event.get("kind") == "finished"
    return {
        "command": " ".join(cmd[1:]),
        "exit_code": code,
        "wall_s": round(wall, 1),
        "stdout_tail": out[-3000:],
        "stderr_tail": err[-3000:],
        "report_written": report.exists(),
        "records_log_finished": finished,
        "records": [
            {
                "name": r.get("name"),
                "outcome": r.get("outcome"),
                "message": (r.get("message") or "")[:500],
                "wall_s": r.get("wall_s"),
                "isolated": {
                    k: v
                    for k, v in ((r.get("extra") or {}).get("isolated") or {}).items()
                    if k != "command"
                }
                or None,
                "memory": (r.get("extra") or {}).get("memory"),
                "profile_gpu_memory": (r.get("extra") or {}).get("profile_gpu_memory"),
                "profile_not_collected": [
                    f"{n.get('what')}: {n.get('why')}"[:300]
                    for n in ((r.get("profile") or {}).get("not_collected") or [])
                    if isinstance(n, dict)
                ],
                "profile_kernels": len((r.get("profile") or {}).get("kernels") or []),
                "profile_timeline": bool((r.get("profile") or {}).get("timeline")),
            }
            for r in records
            if isinstance(r, dict) and r.get("name")
        ],  # fmt: skip
    }


SLEEP_PROBE = """
import json, signal, time, torch
x = torch.ones(1, device="cuda"); torch.cuda.synchronize()
alarms = []
signal.signal(signal.SIGALRM, lambda *a: alarms.append(time.monotonic()))
signal.setitimer(signal.ITIMER_REAL, 2.0)
t0 = time.monotonic()
torch.cuda._sleep(1_000_000_000_000)
launched = time.monotonic() - t0
try:
    torch.cuda.synchronize(); result = "returned"
except BaseException as exc:
    result = repr(exc)[:300]
print(json.dumps({"launch_s": launched, "sync_s": time.monotonic() - t0, "result": result,
                  "alarm_at_s": [a - t0 for a in alarms]}))
"""


def sleep_probe(limit_s: float) -> dict:
    """Does a host wait behind `torch.cuda._sleep(1e12)` block, and does SIGALRM get in?"""
    try:
        proc = subprocess.run([sys.executable, "-c", SLEEP_PROBE], capture_output=True,
                              text=True, timeout=limit_s)  # fmt: skip
        return {"exit_code": proc.returncode, "stdout": proc.stdout[-1000:],
                "stderr": proc.stderr[-1000:]}  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "stdout": f"still waiting after {limit_s} s (killed)"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ceilings", help="ceilings JSON for this device kind")
    parser.add_argument(
        "--spin",
        choices=("triton", "sleep"),
        default=None,
        help="GPU spin: a Triton kernel that never ends, or torch.cuda._sleep",
    )
    parser.add_argument(
        "--sleep-probe-s",
        type=float,
        default=0.0,
        help="first probe torch.cuda._sleep behind a host wait for this long",
    )
    parser.add_argument("--skip-profile", action="store_true", help="no profiler-memory run")
    parser.add_argument("--profile-ncu", action="store_true", help="let ncu profile the big item")
    parser.add_argument(
        "--limit-s",
        type=float,
        default=0.0,
        help="item time limit (0: 5 s "
        "on cuda, 20 s on cpu, where torch's start-up under load is slow)",
    )
    args = parser.parse_args()
    limit = args.limit_s or (5.0 if args.device == "cuda" else 20.0)
    startup = "10" if args.device == "cuda" else "40"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.spin = args.spin or ("triton" if args.device == "cuda" else "sleep")
    results: dict = {"spin": args.spin, "limit_s": limit}
    if args.sleep_probe_s:
        results["sleep_probe"] = sleep_probe(args.sleep_probe_s)
        print(f"[limits] sleep probe: {results['sleep_probe']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kp-limits-") as tmp:
        for name, extra, env_extra in (
            ("watchdog", [], {"KP_BENCH_GRACE": "3"}),
            ("isolate", ["--kernelpro-isolate"],
             {"KP_BENCH_STARTUP": startup, "KP_BENCH_CHILD_GRACE": "600"}),
        ):  # fmt: skip
            project = Path(tmp) / name
            project.mkdir()
            (project / "conftest.py").write_text(CONFTEST)
            (project / "test_k.py").write_text(KERNELS)
            (project / "pytest.ini").write_text("[pytest]\n")
            env = {**os.environ, **env_extra, "PYTHONUNBUFFERED": "1", "KP_BENCH_SPIN": args.spin}
            env["PYTHONPATH"] = os.pathsep.join(
                [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
            )
            argv = [f"--kernelpro-device={args.device}", f"--kernelpro-item-timeout={limit}",
                    "--kernelpro-time-budget=0.2", *extra]  # fmt: skip
            if args.ceilings:  # measured ceilings: no ceiling probes inside the time limit
                argv.append(f"--kernelpro-ceilings={Path(args.ceilings).resolve()}")
            results[name] = run(project, argv, env, limit_s=150)
            fallback = project / "spin_fallback.txt"
            results[name]["spin_fallback"] = fallback.read_text() if fallback.exists() else None
            r = results[name]
            print(f"[limits] {name}: exit {r['exit_code']} in {r['wall_s']} s; records "
                  f"{[(x['name'], x['outcome']) for x in r['records']]}; "
                  f"report written {r['report_written']}", flush=True)  # fmt: skip
    if not args.skip_profile:
        with tempfile.TemporaryDirectory(prefix="kp-profmem-") as tmp:
            project = Path(tmp)
            (project / "test_big.py").write_text(PROFILE_KERNELS)
            (project / "pytest.ini").write_text("[pytest]\n")
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if not args.profile_ncu:
                # ncu replays a kernel by saving and restoring the device memory it can reach:
                # 48 GiB per pass here, minutes of device time. The kineto timeline child is
                # the one profiler child this run checks; ncu reports itself not found.
                env["KERNELPRO_NCU"] = str(project / "no-ncu-here")
            if args.device != "cuda":
                env["KP_BENCH_BIG_COLS"] = "4096"
            env["PYTHONPATH"] = os.pathsep.join(
                [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
            )
            argv = [f"--kernelpro-device={args.device}", "--kernelpro-profile",
                    "--kernelpro-time-budget=0.5", "--kernelpro-profile-timeout=90"]  # fmt: skip
            if args.ceilings:
                argv.append(f"--kernelpro-ceilings={Path(args.ceilings).resolve()}")
            results["profile_memory"] = run(project, argv, env, limit_s=240)
            r = results["profile_memory"]
            print(f"[limits] profile_memory: exit {r['exit_code']} in {r['wall_s']} s; "
                  f"{json.dumps(r['records'], default=str)[:1500]}", flush=True)  # fmt: skip
    checks = {
        "watchdog: process ended with status 3": results["watchdog"]["exit_code"] == 3,
        "watchdog: the hung item's failed record is in the log": any(
            x["name"] == "spins" and x["outcome"] == "failed"
            for x in results["watchdog"]["records"]
        ),
        "isolate: spins failed": any(
            x["name"] == "spins" and x["outcome"] == "failed" for x in results["isolate"]["records"]
        ),
        "isolate: healthy passed after the kill": any(
            x["name"] == "healthy" and x["outcome"] == "passed"
            for x in results["isolate"]["records"]
        ),
    }
    big = next(
        (x for x in (results.get("profile_memory") or {}).get("records", []) if x["name"] == "big"),
        None,
    )
    if big is not None:
        state = big.get("profile_gpu_memory") or {}
        memory = big.get("memory") or {}
        checks["profile: big passed"] = big["outcome"] == "passed"
        checks["profile: the timeline child ran"] = big["profile_timeline"]
        checks["profile: no profiler child ran out of memory"] = not any(
            "out of memory" in text.lower() for text in big["profile_not_collected"]
        )
        if state and memory.get("inputs_bytes"):
            # What the children had, against what the parent's check had reserved at its peak.
            checks["profile: children had more free than the input needs"] = (
                state["free_bytes"] > memory["inputs_bytes"]
            )
    results["checks"] = checks
    (out / "item_limits.json").write_text(json.dumps(results, indent=1))
    for k, v in checks.items():
        print(f"[limits] {'PASS' if v else 'FAIL'} {k}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
