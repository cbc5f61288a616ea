"""Foundation benchmark (issue 2) for the H200, dry-runnable on a CPU.

In one call:
  1. two independent `pytest` runs of the plugin over the kernels of foundation_kernels.py
     (each a separate process, JSON report each): medians, wall time per kernel item;
  2. triton.testing.do_bench(return_mode="median") on the same kernels, in this process;
  3. ncu per kernel (only the kernel's own launches, inside an NVTX range): DRAM bytes and
     executed FLOPs, against the roofline's minimal bytes and FLOPs;
and writes foundation.json plus a Markdown table to --out.

    python bench/foundation_h200.py --out $OUT [--skip-ncu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

NCU_METRICS = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "gpu__time_duration.sum",
]


def run_pytest(workdir: Path, json_path: Path, device: str, budget: float) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(workdir / "test_foundation.py"),
        f"--kernelpro-json={json_path}",
        f"--kernelpro-device={device}",
        f"--kernelpro-time-budget={budget}",
        f"--rootdir={workdir}",
    ]
    started = time.perf_counter()
    env = dict(os.environ, KP_REPO_ROOT=str(HERE.parent))
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    tail = (proc.stdout + proc.stderr)[-6000:]
    report = json.loads(json_path.read_text()) if json_path.exists() else {"records": []}
    return {"wall_s": wall, "rc": proc.returncode, "tail": tail, "report": report}


def do_bench_medians(device: str) -> dict[str, float | None]:
    import torch
    from foundation_kernels import KERNELS

    out: dict[str, float | None] = {}
    try:
        from triton.testing import do_bench
    except ImportError:
        return {name: None for name in KERNELS}
    if not device.startswith("cuda"):
        return {name: None for name in KERNELS}
    for name, (kernel, _ref, inputs, _kind, _extra) in KERNELS.items():
        torch.manual_seed(1_000_003)
        args = inputs(device)
        out[name] = (
            do_bench(lambda k=kernel, a=args: k(*a), warmup=25, rep=100, return_mode="median")
            * 1e-3
        )
        del args
        torch.cuda.empty_cache()
    return out


def ncu_target(name: str) -> None:
    """Run one kernel once inside NVTX range kp/<name> (the profiled process)."""
    import torch
    from foundation_kernels import KERNELS

    kernel, _ref, inputs, _kind, _extra = KERNELS[name]
    torch.manual_seed(1_000_003)
    args = inputs("cuda")
    kernel(*args)  # warm-up: compile, autotune, handle creation
    torch.cuda.synchronize()
    # ncu runs with --profile-from-start off: only launches between start and stop count.
    torch.cuda.profiler.start()
    kernel(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def run_ncu(name: str, out_dir: Path) -> dict:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [
        ncu,
        "--csv",
        "--page",
        "raw",
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--metrics",
        ",".join(NCU_METRICS),
        sys.executable,
        str(HERE / "foundation_h200.py"),
        "--ncu-target",
        name,
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (out_dir / f"ncu_{name}.csv").write_text(proc.stdout)
    from pytest_kernelpro.profile.ncu_csv import parse_ncu_raw_csv

    kernels = parse_ncu_raw_csv(proc.stdout)
    totals = {m: sum((k.get(m) or 0.0) for k in kernels) for m in NCU_METRICS}
    return {
        "kernels": [k.kernel_name for k in kernels],
        "totals": totals,
        "wall_s": time.perf_counter() - started,
        "rc": proc.returncode,
        "stderr_tail": proc.stderr[-1500:],
        "stdout_head": proc.stdout[:1500],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--skip-ncu", action="store_true")
    parser.add_argument("--ncu-target")
    parser.add_argument("--budget", type=float, default=2.0)
    args = parser.parse_args()
    if args.ncu_target:
        ncu_target(args.ncu_target)
        return 0
    import torch
    from foundation_kernels import KERNELS, test_module_source

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kp-foundation-"))
    shutil.copy(HERE / "foundation_kernels.py", work / "foundation_kernels.py")
    (work / "test_foundation.py").write_text(test_module_source())
    env_note = {"device": device, "torch": torch.__version__, "python": sys.version.split()[0]}
    if device == "cuda":
        env_note["gpu"] = torch.cuda.get_device_name()

    runs = [run_pytest(work, work / f"run{i}.json", device, args.budget) for i in (1, 2)]
    bench = do_bench_medians(device)
    ncu = {}
    if device == "cuda" and not args.skip_ncu:
        for name in KERNELS:
            try:
                ncu[name] = run_ncu(name, work)
            except Exception as exc:  # one kernel's profiler failure is recorded, not fatal
                ncu[name] = {"error": repr(exc)}
    rows = []
    recs = [{r["kernel"]: r for r in run["report"].get("records", [])} for run in runs]
    for name, (_k, _r, _i, kind, _e) in KERNELS.items():
        r1, r2 = recs[0].get(name, {}), recs[1].get(name, {})
        m1 = ((r1.get("timing") or {}).get("stats") or {}).get("median_s")
        m2 = ((r2.get("timing") or {}).get("stats") or {}).get("median_s")
        roof = r1.get("roofline") or {}
        row = {
            "kernel": name,
            "kind": kind,
            "outcome": r1.get("outcome"),
            "message": r1.get("message"),
            "median1_s": m1,
            "median2_s": m2,
            "rel_diff_two_runs": abs(m1 - m2) / min(m1, m2) if m1 and m2 else None,
            "do_bench_median_s": bench.get(name),
            "ratio_plugin_over_do_bench": m1 / bench[name] if m1 and bench.get(name) else None,
            "plugin_wall_s": r1.get("wall_s"),
            "samples": ((r1.get("timing") or {}).get("stats") or {}).get("n"),
            "stop_reason": (r1.get("timing") or {}).get("stop_reason"),
            "roofline_flops": roof.get("flops"),
            "roofline_min_bytes": roof.get("min_bytes"),
            "bound": roof.get("bound"),
            "efficiency": r1.get("efficiency"),
            "peak_name": roof.get("peak_name"),
        }
        n = ncu.get(name, {}).get("totals")
        if n:
            dram = n["dram__bytes_read.sum"] + n["dram__bytes_write.sum"]
            ffma = n["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
            fp32_flops = (
                n["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"]
                + n["smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"]
                + 2 * ffma
            )
            row.update(
                {
                    "ncu_dram_bytes": dram,
                    "ncu_fp32_flops": fp32_flops,
                    "ncu_tensor_ops_bf16": n["sm__ops_path_tensor_src_bf16_dst_fp32.sum"],
                    "bytes_ratio_ncu_over_roofline": dram / roof["min_bytes"]
                    if roof.get("min_bytes")
                    else None,
                    "fp32_flops_ratio_ncu_over_roofline": fp32_flops / roof["flops"]
                    if roof.get("flops")
                    else None,
                    "ncu_kernels": ncu[name].get("kernels"),
                    "ncu_wall_s": ncu[name].get("wall_s"),
                }
            )
        if name in ncu and not (n and ncu[name].get("kernels")):
            row["ncu_error"] = {k: v for k, v in ncu[name].items() if k != "totals"}
        rows.append(row)
    result = {
        "env": env_note,
        "rows": rows,
        "pytest_wall_s": [r["wall_s"] for r in runs],
        "pytest_rc": [r["rc"] for r in runs],
        "pytest_tail": runs[0]["tail"][-3000:],
    }
    (out / "foundation.json").write_text(json.dumps(result, indent=1, default=str))

    def f(v, scale=1.0, fmt="{:.4g}"):
        return "-" if v is None else fmt.format(v * scale)

    lines = [
        "| kernel | kind | plugin median 1 (us) | median 2 (us) | diff | do_bench (us) | plugin/do_bench | wall s | n | ncu DRAM / roofline bytes | ncu fp32 FLOP / roofline | eff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['kind']} | {f(r['median1_s'], 1e6)} | {f(r['median2_s'], 1e6)} | "
            f"{f(r['rel_diff_two_runs'], 100, '{:.2f}%')} | {f(r['do_bench_median_s'], 1e6)} | "
            f"{f(r['ratio_plugin_over_do_bench'], 1, '{:.3f}')} | {f(r['plugin_wall_s'], 1, '{:.2f}')} | {r['samples']} | "
            f"{f(r.get('bytes_ratio_ncu_over_roofline'), 1, '{:.3f}')} | {f(r.get('fp32_flops_ratio_ncu_over_roofline'), 1, '{:.3f}')} | "
            f"{f(r['efficiency'], 100, '{:.1f}%')} |"
        )
    table = "\n".join(lines)
    (out / "foundation.md").write_text(table + "\n")
    print(
        json.dumps(env_note),
        "pytest wall",
        [round(r["wall_s"], 1) for r in runs],
        "rc",
        [r["rc"] for r in runs],
    )
    print(table)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
