"""Profiling-layer capture on the H200 (issue 3), dry-runnable on a CPU.

In one call (< 8 minutes):
  1. builds a load_inline module of 12 deliberately different kernels under
     `capture_extensions` (ptxas report recorded), plus a Triton softmax, a torch bf16 matmul
     (cuBLAS) and torch.softmax;
  2. dumps the module's symbols (`cuobjdump -symbols`, `nm -D`) and SASS;
  3. records kineto timelines (a launch-bound loop of a tiny kernel, torch.softmax);
  4. runs ncu ONCE over all cases with the curated metrics (`--nvtx-include kernelpro/`, raw
     page, base units), through `pytest_kernelpro.profile.ncu.run_ncu`;
  5. runs ncu once per selected kernel (mangled-name and function-name selection) and times
     each invocation, and once with a bogus metric to check the drop-and-retry path;
  6. joins ncu + SASS + ptxas per kernel and renders the report section.

The kernels are in bench/profile_capture_kernels.cu (no torch headers, so nvcc is quick) and
their torch wrappers in bench/profile_capture_wrappers.cpp. Writes to --out: ncu_raw.csv, sass.txt,
symbols.txt, ptxas.txt, report.txt, summary.json.

    python bench/profile_capture.py --out $OUT
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODULE_NAME = "kp_profile_bench"
BASE_CUDA_FLAGS = ["-O3", "-gencode=arch=compute_90a,code=sm_90a"]
DEADLINE_S = float(os.environ.get("KP_PROFILE_DEADLINE_S", "400"))  # start no new step after this
HARD_LIMIT_S = DEADLINE_S + 60.0  # every ncu timeout is cut so the run ends before this

CUDA_SRC = (Path(__file__).resolve().parent / "profile_capture_kernels.cu").read_text()

FUNCTIONS = [
    "naive_matmul",
    "tiled_matmul",
    "wmma_matmul",
    "naive_softmax",
    "warp_softmax",
    "copy_vec4",
    "copy_scalar",
    "spill",
    "bank_conflict",
    "strided_copy",
    "fp64_poly",
    "tiny",
]
CPP_SRC = (Path(__file__).resolve().parent / "profile_capture_wrappers.cpp").read_text()
TINY_LAUNCHES = 8


def log(msg: str) -> None:
    sys.stderr.write(f"[profile_capture {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def build_module(build_dir: Path) -> tuple[Any, Any]:
    """(module or None, ExtensionBuild record or None)."""
    from torch.utils.cpp_extension import load_inline

    from pytest_kernelpro.profile.capture import capture_extensions

    build_dir.mkdir(parents=True, exist_ok=True)
    module = None
    # both sources bring their own includes; skipping the implicit torch headers in cuda.cu
    # (torch >= 2.8) makes nvcc's part of the build take seconds instead of a minute
    implicit = {}
    if "no_implicit_headers" in inspect.signature(load_inline).parameters:
        implicit["no_implicit_headers"] = True
    with capture_extensions() as capture:
        try:
            module = load_inline(
                MODULE_NAME,
                CPP_SRC,
                cuda_sources=CUDA_SRC,
                functions=FUNCTIONS,
                extra_cuda_cflags=list(BASE_CUDA_FLAGS),
                build_directory=str(build_dir),
                **implicit,
            )
        except Exception as exc:  # recorded below; the bench goes on with what it has
            log(f"build failed: {type(exc).__name__}: {str(exc)[:400]}")
    record = capture.builds[-1] if capture.builds else None
    return module, record


def triton_softmax_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def kp_softmax_kernel(X, Y, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        v = tl.load(X + row * cols + offs, mask=offs < cols, other=-float("inf"))
        v = v - tl.max(v, 0)
        e = tl.exp(v)
        tl.store(Y + row * cols + offs, e / tl.sum(e, 0), mask=offs < cols)

    def run(x):
        import torch

        y = torch.empty_like(x)
        kp_softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y

    return run


def make_cases(module: Any) -> dict[str, Any]:
    """name -> zero-argument callable launching that case's kernel(s) on prepared inputs."""
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    n = 2048
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    ah, bh = a.half(), b.half()
    abf, bbf = a.bfloat16(), b.bfloat16()
    x = torch.randn(8192, 4096, device=dev)
    big = torch.randn(1 << 26, device=dev)
    mid = torch.randn(1 << 24, device=dev)
    small = torch.randn(1 << 20, device=dev)
    dbl = torch.randn(1 << 22, device=dev, dtype=torch.float64)
    tiny_buf = torch.zeros(32, device=dev)
    cases: dict[str, Any] = {}
    if module is not None:
        cases.update(
            {
                "naive_matmul": lambda: module.naive_matmul(a, b),
                "tiled_matmul": lambda: module.tiled_matmul(a, b),
                "wmma_matmul": lambda: module.wmma_matmul(ah, bh),
                "naive_softmax": lambda: module.naive_softmax(x),
                "warp_softmax": lambda: module.warp_softmax(x),
                "copy_vec4": lambda: module.copy_vec4(big),
                "copy_scalar": lambda: module.copy_scalar(big),
                "spill": lambda: module.spill(small),
                "bank_conflict": lambda: module.bank_conflict(mid),
                "strided_copy": lambda: module.strided_copy(mid, 4099),
                "fp64_poly": lambda: module.fp64_poly(dbl),
                "tiny_launches": lambda: [module.tiny(tiny_buf) for _ in range(TINY_LAUNCHES)],
            }
        )
    try:
        tri = triton_softmax_fn()
        cases["triton_softmax"] = lambda: tri(x)
    except Exception as exc:
        log(f"triton unavailable: {exc}")
    cases["torch_bf16_matmul"] = lambda: abf @ bbf
    cases["torch_softmax"] = lambda: torch.softmax(x, -1)
    return cases


def child_main(args: argparse.Namespace) -> int:
    """The ncu target: build (cached), warm every case up, run the chosen cases once inside
    the NVTX ranges kernelpro > kernel. Prints nothing on stdout (ncu's CSV goes there)."""
    import torch

    from pytest_kernelpro.profile.target import run_once_in_nvtx

    module, _ = build_module(Path(args.build_dir))
    cases = make_cases(module)
    chosen = list(cases) if args.cases == "all" else args.cases.split(",")

    def run_all() -> None:
        for name in chosen:
            cases[name]()

    run_once_in_nvtx(run_all, warmup=1)
    torch.cuda.synchronize()
    return 0


# --- parent --------------------------------------------------------------------------------


def tool_text(command: list[str], env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"<{command[0]} failed: {exc}>"
    return done.stdout + (f"\n<stderr>\n{done.stderr}" if done.returncode else "")


def spot_checks(cases: dict[str, Any]) -> dict[str, float]:
    """Relative errors of a few cases against torch, so broken kernels are not profiled."""
    import torch

    errors = {}
    torch.manual_seed(0)
    refs = {
        "tiled_matmul": ("naive_matmul", None),
        "warp_softmax": ("torch_softmax", None),
        "naive_softmax": ("torch_softmax", None),
    }
    for name, (ref, _) in refs.items():
        if name in cases and ref in cases:
            out, want = cases[name](), cases[ref]()
            errors[name] = float((out - want).norm() / want.norm())
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench/results/profile_capture")
    parser.add_argument("--child", default=None)
    parser.add_argument("--build-dir", default="/tmp/kernelpro_profile_bench_build")
    parser.add_argument("--cases", default="all")
    parser.add_argument("--ncu", default=None, help="ncu binary (default: KERNELPRO_NCU, PATH)")
    parser.add_argument(
        "--cuda-home",
        default=None,
        help="CUDA toolkit for a CPU-only torch (dry run: compile, then read the object's SASS)",
    )
    args = parser.parse_args()
    if args.cuda_home:
        import torch.utils.cpp_extension as cpp_extension

        if cpp_extension.CUDA_HOME is None:
            cpp_extension.CUDA_HOME = args.cuda_home
    if args.child:
        return child_main(args)

    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"not_collected": [], "steps_s": {}}

    def step_done(name: str, t0: float) -> None:
        summary["steps_s"][name] = round(time.perf_counter() - t0, 2)

    def left(wanted: float) -> float:
        """A step's timeout: `wanted`, cut to what is left before HARD_LIMIT_S."""
        return max(20.0, min(wanted, HARD_LIMIT_S - (time.perf_counter() - started)))

    def over_deadline(step: str) -> bool:
        if time.perf_counter() - started > DEADLINE_S:
            summary["not_collected"].append(
                f"{step}: skipped, past the {DEADLINE_S:.0f} s deadline"
            )
            return True
        return False

    import torch

    from pytest_kernelpro.fileio import atomic_write_json, atomic_write_text
    from pytest_kernelpro.profile.binaries import cuobjdump_env, find_tool
    from pytest_kernelpro.profile.metrics_catalog import (
        CURATED_METRICS,
        drop_unavailable,
        requested_metric_names,
    )
    from pytest_kernelpro.profile.model import KernelProfile, NotCollected, ProfileReport
    from pytest_kernelpro.profile.ncu import (
        KernelSelector,
        NcuRequest,
        arch_from_cc,
        find_ncu,
        query_catalog,
        run_ncu,
    )
    from pytest_kernelpro.profile.ncu_csv import first_launch_per_kernel
    from pytest_kernelpro.profile.ptxas import ptxas_by_function
    from pytest_kernelpro.profile.render import derived_metrics, render_profile_section
    from pytest_kernelpro.profile.sass import summarize_sass
    from pytest_kernelpro.profile.symbols import (
        demangle,
        entry_points,
        kernel_base_name,
        parse_cuobjdump_symbols,
    )
    from pytest_kernelpro.profile.timeline import timeline_of_callable

    gpu = torch.cuda.is_available()
    summary["env"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "python": sys.version.split()[0],
    }
    try:
        import triton

        summary["env"]["triton"] = triton.__version__
    except ImportError:
        summary["env"]["triton"] = None
    ncu = find_ncu(args.ncu)
    summary["env"]["ncu"] = ncu
    summary["env"]["ncu_version"] = (
        tool_text([ncu, "--version"]).strip().splitlines()[-1:] if ncu else None
    )

    # 1. build under capture
    t0 = time.perf_counter()
    build_dir = Path(args.build_dir)
    module, record = (None, None)
    try:
        module, record = build_module(build_dir)
    except Exception as exc:
        summary["not_collected"].append(f"build: {type(exc).__name__}: {exc}")
    step_done("build", t0)
    so_path = record.so_path if record else None
    ptxas = ptxas_by_function(record.ptxas) if record else {}
    summary["build"] = {
        "so_path": so_path,
        "seconds": round(record.build_seconds, 2) if record else None,
        "flags": list(record.extra_cuda_cflags) if record else None,
        "log_source": record.log_source if record else None,
        "error": record.error[:600] if record and record.error else None,
        "ptxas": {k: vars(v) for k, v in ptxas.items()},
    }
    atomic_write_text(out / "ptxas.txt", record.build_log if record else "<no build>\n")

    # 2. symbols and SASS of the module (no GPU needed)
    t0 = time.perf_counter()
    entries: list[str] = []
    sass: dict[str, Any] = {}
    cuobjdump = find_tool("cuobjdump")
    # a CPU-only torch cannot link the module; the compiled object still has the SASS
    device_code = so_path or next(iter(build_dir.glob("*.cuda.o")), None)
    if device_code and cuobjdump:
        device_code = str(device_code)
        sym_text = tool_text([cuobjdump, "-symbols", device_code])
        nm_text = tool_text(["nm", "-D", "--undefined-only", device_code]) if so_path else ""
        atomic_write_text(out / "symbols.txt", f"== symbols\n{sym_text}\n== nm -D\n{nm_text}")
        entries = entry_points(parse_cuobjdump_symbols(sym_text))
        sass_text = tool_text([cuobjdump, "--dump-sass", device_code], env=cuobjdump_env())
        atomic_write_text(out / "sass.txt", sass_text)
        sass = summarize_sass(sass_text, demangled=demangle(entries))
    else:
        summary["not_collected"].append(f"symbols/sass: so={so_path} cuobjdump={cuobjdump}")
    summary["entry_points"] = entries
    summary["sass_classes"] = {
        kernel_base_name(k): {
            c: v.count(c) for c in ("HGMMA", "HMMA", "LOCAL", "LDGSTS", "BAR", "DFMA")
        }
        | {"ldg_bits": sorted(v.global_load_widths)}
        for k, v in sass.items()
    }
    step_done("symbols_sass", t0)

    if not gpu:
        summary["not_collected"].append("ncu/timeline: no CUDA device on this machine")
        finish(out, summary, started, atomic_write_json)
        return 0

    # 3. correctness spot checks and kineto timelines
    t0 = time.perf_counter()
    cases = make_cases(module)
    summary["cases"] = list(cases)
    summary["spot_check_rel_err"] = spot_checks(cases)
    timelines = {}
    for name in ("tiny_launches", "torch_softmax", "naive_softmax"):
        if name in cases and not over_deadline(f"timeline {name}"):
            result = timeline_of_callable(cases[name], runs=10, warmup=2)
            timelines[name] = (
                {"not_collected": result.why}
                if isinstance(result, NotCollected)
                else vars(result) | {"gaps": len(result.gaps)}
            )
    summary["timelines"] = timelines
    step_done("timelines", t0)
    del cases
    torch.cuda.empty_cache()

    if ncu is None:
        summary["not_collected"].append("ncu: not found (set KERNELPRO_NCU or --ncu)")
        finish(out, summary, started, atomic_write_json)
        return 0

    # 4. catalog, then one ncu run over every case
    t0 = time.perf_counter()
    catalog = query_catalog(ncu)
    step_done("query_catalog", t0)
    requested = requested_metric_names()
    if catalog is not None:
        _, dropped = drop_unavailable(requested, catalog)
        summary["catalog"] = {"size": len(catalog), "dropped": dropped}
    child = (
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "ncu",
        "--build-dir",
        str(build_dir),
    )
    t0 = time.perf_counter()
    combined = run_ncu(
        NcuRequest(target_command=(*child, "--cases", "all"), launch_count=64, timeout_s=left(300)),
        ncu_path=ncu,
        catalog=catalog,
    )
    nvtx_worked = bool(combined.kernels)
    if not nvtx_worked and not over_deadline("ncu without nvtx"):
        log("no kernel inside the NVTX range; repeating without --nvtx-include")
        combined = run_ncu(
            NcuRequest(
                target_command=(*child, "--cases", "all"),
                launch_count=200,
                timeout_s=left(300),
                nvtx_include=None,
            ),
            ncu_path=ncu,
            catalog=catalog,
        )
    step_done("ncu_all_cases", t0)
    atomic_write_text(out / "ncu_raw.csv", combined.stdout or combined.output_tail)
    launches = first_launch_per_kernel(combined.kernels)
    summary["ncu_all"] = {
        "nvtx_filter_worked": nvtx_worked,
        "wall_s": round(combined.wall_s, 2),
        "launches": len(combined.kernels),
        "distinct_kernels": len(launches),
        "wall_s_per_launch": round(combined.wall_s / max(1, len(combined.kernels)), 2),
        "dropped_metrics": list(combined.dropped_metrics),
        "missing_metrics": list(combined.kernels[0].missing) if combined.kernels else [],
        "not_collected": [vars(n) for n in combined.not_collected],
        "command": list(combined.command),
        "kernel_names": list(launches),
    }

    # 5. one ncu invocation per selected kernel, timed
    singles = []
    plans = [("tiled_matmul", "_Z19tiled_matmul_kernelPKfS0_Pfi", "mangled")]
    plans += [("naive_softmax", "_Z20naive_softmax_kernelPKfPfii", "mangled")]
    plans += [("triton_softmax", "kp_softmax_kernel", "function")]
    plans += [("torch_bf16_matmul", "nvjet", "function")]
    for case, kernel, base in plans:
        if over_deadline(f"single ncu {case}"):
            break
        result = run_ncu(
            NcuRequest(
                target_command=(*child, "--cases", case),
                kernels=KernelSelector((kernel,), base),
                launch_count=8,
                timeout_s=left(180),
            ),
            ncu_path=ncu,
            catalog=catalog,
        )
        singles.append(
            {
                "case": case,
                "selector": f"{base}:{kernel}",
                "wall_s": round(result.wall_s, 2),
                "kernel_names": [k.kernel_name for k in result.kernels],
                "duration_ns": [k.get("gpu__time_duration.sum") for k in result.kernels],
                "not_collected": [vars(n) for n in result.not_collected],
            }
        )
    summary["ncu_single"] = singles

    # the drop-and-retry path on a real ncu
    if not over_deadline("bogus metric"):
        result = run_ncu(
            NcuRequest(
                target_command=(*child, "--cases", "tiny_launches"),
                metrics=("gpu__time_duration.sum", "sm__kernelpro_bogus_metric.sum"),
                launch_count=1,
                timeout_s=left(120),
            ),
            ncu_path=ncu,
            query_catalog_first=False,
        )
        summary["bogus_metric"] = {
            "dropped": list(result.dropped_metrics),
            "attempt_errors": list(result.attempt_errors),
            "launches": len(result.kernels),
            "not_collected": [vars(n) for n in result.not_collected],
            "wall_s": round(result.wall_s, 2),
        }

    # 6. join per kernel and render the section
    report = ProfileReport(arch=arch_from_cc(combined.compute_capability), wall_s=combined.wall_s)
    names = demangle(list(launches))
    for name, kernel in launches.items():
        match = next(
            (e for e in entries if e == name or kernel_base_name(e) == kernel_base_name(name)), None
        )
        report.kernels.append(
            KernelProfile(
                name=names.get(name, name),
                metrics=kernel,
                sass=sass.get(match) if match else None,
                ptxas=ptxas.get(match) if match else None,
            )
        )
    report.not_collected = list(combined.not_collected)
    atomic_write_text(out / "report.txt", render_profile_section(report) + "\n")
    table = []
    for profile in report.kernels:
        k = profile.metrics
        derived = derived_metrics(k) if k else {}
        table.append(
            {
                "kernel": kernel_base_name(profile.name)[:40],
                "dur_us": round((k.get("gpu__time_duration.sum") or 0) / 1e3, 1) if k else None,
                "sm_pct": k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed") if k else None,
                "mem_pct": k.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")
                if k
                else None,
                "regs": k.get("launch__registers_per_thread") if k else None,
                "sect_per_req": round(derived.get("sectors/request (ld)", 0.0), 1),
                "hgmma": profile.sass.count("HGMMA") if profile.sass else None,
                "hmma": profile.sass.count("HMMA") if profile.sass else None,
                "local": profile.sass.count("LOCAL") if profile.sass else None,
                "spill_st_B": profile.ptxas.spill_store_bytes if profile.ptxas else None,
            }
        )
    summary["table"] = table
    summary["curated_metrics"] = len(CURATED_METRICS)
    finish(out, summary, started, atomic_write_json)
    return 0


def finish(out: Path, summary: dict[str, Any], started: float, atomic_write_json: Any) -> None:
    summary["total_s"] = round(time.perf_counter() - started, 1)
    atomic_write_json(out / "summary.json", summary)
    print(f"\nprofile_capture: {summary['total_s']} s total, files in {out}")
    for item in summary["not_collected"]:
        print(f"  not collected: {item}")
    if "ncu_all" in summary:
        a = summary["ncu_all"]
        print(
            f"  ncu over all cases: {a['wall_s']} s, {a['launches']} launches, "
            f"{a['distinct_kernels']} kernels, nvtx filter {'ok' if a['nvtx_filter_worked'] else 'FAILED'}"
        )
    for s in summary.get("ncu_single", []):
        print(
            f"  ncu single {s['case']:<18} {s['wall_s']:>6} s  -> {len(s['kernel_names'])} launch(es)"
        )
    header = f"{'kernel':<32}{'us':>9}{'SM%':>7}{'Mem%':>7}{'regs':>6}{'sec/rq':>7}{'HGMMA':>6}{'HMMA':>6}{'LOCAL':>6}{'spillB':>7}"
    if summary.get("table"):
        print(header)
        for row in summary["table"]:
            cells = [
                row[k] if row[k] is not None else "-"
                for k in (
                    "dur_us",
                    "sm_pct",
                    "mem_pct",
                    "regs",
                    "sect_per_req",
                    "hgmma",
                    "hmma",
                    "local",
                    "spill_st_B",
                )
            ]
            print(
                f"{row['kernel']:<32}"
                + "".join(
                    f"{str(c):>{w}}"
                    for c, w in zip(cells, (9, 7, 7, 6, 7, 6, 6, 6, 7), strict=True)
                )
            )
    else:
        print(
            f"  build: {summary.get('build', {}).get('error') or 'ok'}; entry points: {len(summary.get('entry_points', []))}"
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
