"""Candidate build speed: the build layer (`pytest_kernelpro.optimize.build`) against plain `load_inline`.

    python bench/build_speed.py --out DIR [--device cuda|cpu] [--inline add,softmax,...]
        [--inline-jobs 6] [--inline-deadline-s 120]

In one run, on one machine:
1. plain `load_inline` builds of a subset of the candidates (`--inline`, default one or two
   per kind) start in the background, `--inline-jobs` at a time (subprocesses, MAX_JOBS=2
   each), in the form the prompts asked for until now: the kernel source with
   `torch/extension.h` and a generated binding in the `.cu`;
2. meanwhile every candidate (`build_speed_cases.CASES`, 21 of five kinds) is built through
   the layer, one after another, into a fresh cache (misses), then again (hits);
3. one 8-candidate expansion (8 sources not built before) goes through the evaluator's
   `Prebuilder` (8 build threads): its wall time against the sum of the serial builds;
4. with `--device cuda`: every candidate runs on the GPU through the fast path and is
   checked against its torch reference; every `load_inline` build that finished runs the
   same inputs, and its output is compared with the reference and with the fast path's.
Everything goes to DIR/build_speed.jsonl as it happens (one record per line) and a summary
to DIR/build_speed.json. `--device cpu` builds only (no launches): the dry run for this
script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from build_speed_cases import CASES, Case  # noqa: E402

from pytest_kernelpro.optimize.build import BuildCache, build_cuda, load_cuda  # noqa: E402
from pytest_kernelpro.optimize.build.prebuild import Prebuilder  # noqa: E402
from pytest_kernelpro.optimize.build.source import parse_kernels  # noqa: E402

ARCH = "sm_90a"
DEFAULT_INLINE = "add,softmax,gemm_regblock64,wmma_bf16,mma_sync_bf16,cute_wgmma_tn"
EXPANSION = [
    "gemm_naive", "gemm_smem16", "gemm_regblock64", "wmma_bf16", "wmma_f16_smem",
    "mma_sync_bf16", "softmax", "layernorm",
]  # fmt: skip
INLINE_FLAGS = ["-O3", "-std=c++17", "-lineinfo", f"-gencode=arch=compute_90a,code={ARCH}"]


def log(out: Path, record: dict[str, Any]) -> None:
    with open(out / "build_speed.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
    print(json.dumps(record, default=str)[:400], flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# ----------------------------------------------------------------------------- load_inline side


def binding_source(case: Case) -> tuple[str, str, list[str]]:
    """(cuda source, cpp declarations, function names): the kernel source behind
    `torch/extension.h` plus one `launch_<kernel>` host function per kernel."""
    kernels = parse_kernels(case.source)
    functions, decls, bodies = [], [], []
    for name, sig in kernels.items():
        params, args = [], []
        for index, param in enumerate(sig.params):
            words = param.ctype.replace("__restrict__", "").replace("__grid_constant__", "")
            ctype = words.rsplit(param.name, 1)[0].strip() if param.name else words.strip()
            if param.kind == "pointer":
                params.append(f"torch::Tensor p{index}")
                args.append(f"reinterpret_cast<{ctype}>(p{index}.data_ptr())")
            elif param.kind == "float":
                params.append(f"double p{index}")
                args.append(f"static_cast<{ctype}>(p{index})")
            else:
                params.append(f"int64_t p{index}")
                args.append(f"static_cast<{ctype}>(p{index})")
        signature = (
            f"void launch_{name}(int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by, "
            f"int64_t bz, int64_t smem{''.join(', ' + p for p in params)})"
        )
        decls.append(signature + ";")
        bodies.append(
            signature + " {\n" + f"  if (smem > 48 * 1024) cudaFuncSetAttribute({name}, "
            "cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);\n"
            + f"  {name}<<<dim3(gx, gy, gz), dim3(bx, by, bz), smem, "
            f"c10::cuda::getCurrentCUDAStream()>>>({', '.join(args)});\n"
            + "  C10_CUDA_KERNEL_LAUNCH_CHECK();\n}\n"
        )
        functions.append(f"launch_{name}")
    cuda = (
        "#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>\n"
        "#include <c10/cuda/CUDAException.h>\n" + case.source + "\n" + "\n".join(bodies)
    )
    return cuda, "\n".join(decls), functions


def split_binding(case: Case, salt: str = "") -> tuple[str, str, list[str]]:
    """(cuda source, cpp source, functions) for the full path with the binding in the C++
    file: the .cu holds the kernels and a plain launcher (no torch), the .cpp converts
    tensors to pointers. `salt` changes the device code only."""
    kernels = parse_kernels(case.source)
    device, host, functions = [case.source + salt], ["#include <c10/cuda/CUDAStream.h>"], []
    for name, sig in kernels.items():
        dparams, dargs, hparams, hargs = [], [], [], []
        for index, param in enumerate(sig.params):
            words = param.ctype.replace("__restrict__", "").replace("__grid_constant__", "")
            ctype = words.rsplit(param.name, 1)[0].strip() if param.name else words.strip()
            if param.kind == "pointer":
                dparams.append(f"void* p{index}")
                dargs.append(f"reinterpret_cast<{ctype}>(p{index})")
                hparams.append(f"torch::Tensor p{index}")
                hargs.append(f"p{index}.data_ptr()")
            else:
                wide = "double" if param.kind == "float" else "int64_t"
                dparams.append(f"{wide} p{index}")
                dargs.append(f"static_cast<{ctype}>(p{index})")
                hparams.append(f"{wide} p{index}")
                hargs.append(f"p{index}")
        dims = (
            "int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by, int64_t bz, int64_t smem"
        )
        device.append(
            f"void dev_launch_{name}({dims}, void* stream{''.join(', ' + p for p in dparams)}) {{\n"
            f"  if (smem > 48 * 1024) cudaFuncSetAttribute({name}, "
            "cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);\n"
            f"  {name}<<<dim3(gx, gy, gz), dim3(bx, by, bz), smem, (cudaStream_t)stream>>>"
            f"({', '.join(dargs)});\n}}\n"
        )
        host.append(
            f"void dev_launch_{name}({dims}, void* stream{''.join(', ' + p for p in dparams)});"
        )
        host.append(
            f"void launch_{name}({dims}{''.join(', ' + p for p in hparams)}) {{\n"
            f"  dev_launch_{name}(gx, gy, gz, bx, by, bz, smem, "
            f"c10::cuda::getCurrentCUDAStream().stream(){''.join(', ' + a for a in hargs)});\n}}"
        )
        functions.append(f"launch_{name}")
    return "\n".join(device), "\n".join(host), functions


def run_extension_demo(names: list[str], out: Path, cache: BuildCache, results: dict) -> None:
    """Full path through the layer: each case built cold, then with its device code changed
    (same binding: only cuda.cu recompiles)."""
    from pytest_kernelpro.optimize.build.extension import build_extension

    if len(names) > 1:  # one thread per case: the cold builds run side by side
        threads = [threading.Thread(target=run_extension_demo, args=([n], out, cache, results))
                   for n in names]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return
    by_name = {c.name: c for c in CASES}
    for name in names:
        case = by_name[name]
        for step, salt in (("cold", ""), ("device_changed", "\n// changed device code\n")):
            cuda, cpp, functions = split_binding(case, salt)
            started = time.perf_counter()
            try:
                build = build_extension(
                    f"ext_{name}", cpp, cuda, functions, cache=cache,
                    extra_cuda_cflags=INLINE_FLAGS,
                )  # fmt: skip
                record = {"ok": True, **build.record()}
            except Exception as exc:
                record = {"ok": False, "error": str(getattr(exc, "message", exc))[-1500:],
                          "log": str(getattr(exc, "log", ""))[-1500:]}  # fmt: skip
                build = None
            record.update(kind="extension", case=name, step=step,
                          seconds=time.perf_counter() - started)  # fmt: skip
            results[(name, step)] = (record, build)
            log(out, record)


def check_extensions(
    ext_results: dict, by_name: dict, fast_outputs: dict, torch: Any, device: str
) -> dict[str, Any]:
    """Run each extension build on the GPU: reference check, and equality with the fast path."""
    extension: dict[str, Any] = {}
    for (name, step), (record, build) in sorted(ext_results.items()):
        if build is not None and device == "cuda":
            from pytest_kernelpro.optimize.build.extension import import_extension

            try:
                module = import_extension(build)

                def ecall(kernel, *a, grid, block, shared_mem=0, _m=module):
                    getattr(_m, f"launch_{kernel}")(*dims3(grid), *dims3(block), shared_mem, *a)

                result, output = check(by_name[name], ecall, torch)
                record["check"] = result
                fast = fast_outputs.get(name)
                if fast is not None:
                    record["same_as_fast"] = bool(torch.equal(fast, output))
            except Exception as exc:
                record["check"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
        extension[f"{name}/{step}"] = record
    return extension


def inline_kwargs(case: Case, build_dir: Path) -> dict[str, Any]:
    cuda, cpp, functions = binding_source(case)
    flags = list(INLINE_FLAGS)
    includes: list[str] = []
    if case.cutlass:
        from pytest_kernelpro.optimize.build.api import CUTLASS_FLAGS
        from pytest_kernelpro.optimize.cutlass.locate import locate_cutlass

        install = locate_cutlass().install
        includes = [str(d) for d in install.include_dirs] if install else []
        flags += list(CUTLASS_FLAGS)
    return {
        "name": f"bs_{case.name}",
        "cpp_sources": cpp,
        "cuda_sources": cuda,
        "functions": functions,
        "extra_cuda_cflags": flags,
        "extra_include_paths": includes,
        "build_directory": str(build_dir),
        "verbose": False,
    }


def inline_one(name: str, out: Path) -> int:
    """Child process: one plain load_inline build, timed; writes inline/<name>.json."""
    import torch.utils.cpp_extension as cpp_extension

    if cpp_extension.CUDA_HOME is None and os.environ.get("CUDA_HOME"):
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # a CPU-only torch (the dry run)
    load_inline = cpp_extension.load_inline

    case = next(c for c in CASES if c.name == name)
    build_dir = out / "inline" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    record: dict[str, Any] = {"case": name}
    try:
        load_inline(**inline_kwargs(case, build_dir))
        record.update(ok=True)
    except Exception as exc:  # a build failure is a result
        record.update(ok=False, error=str(exc)[-3000:])
    record["seconds"] = time.perf_counter() - started
    (out / "inline" / f"{name}.json").write_text(json.dumps(record))
    return 0


def start_inline(names: list[str], out: Path, jobs: int) -> list[tuple[str, Any]]:
    (out / "inline").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MAX_JOBS="2", PYTHONUNBUFFERED="1")
    queue = list(names)
    running: list[tuple[str, Any]] = []
    started: list[tuple[str, Any]] = []
    while queue and len(running) < jobs:
        name = queue.pop(0)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--inline-one", name, "--out", str(out)],
            env=env, stdout=open(out / "inline" / f"{name}.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        running.append((name, proc))
        started.append((name, proc))
    if queue:
        print(f"inline: {len(queue)} case(s) not started (jobs={jobs}): {queue}", flush=True)
    return started


def import_inline(case: Case, out: Path) -> Any:
    import importlib.machinery
    import importlib.util

    name = f"bs_{case.name}"
    path = out / "inline" / case.name / f"{name}.so"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def dims3(value: Any) -> tuple[int, int, int]:
    items = [value] if isinstance(value, int) else list(value)
    return tuple(items + [1] * (3 - len(items)))  # type: ignore[return-value]


# ----------------------------------------------------------------------------- runs


def check(case: Case, call: Any, torch: Any, seed: int = 0) -> tuple[dict[str, Any], Any]:
    torch.manual_seed(seed)
    inputs = case.inputs(torch)
    out = case.run(call, inputs, torch)
    torch.cuda.synchronize()
    ref = case.reference(inputs, torch)
    err = (out.float() - ref.float()).abs()
    ok = bool(torch.allclose(out.float(), ref.float(), atol=case.atol, rtol=case.rtol))
    return {"ok": ok, "max_abs_err": float(err.max())}, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--inline", default=DEFAULT_INLINE, help="cases built with load_inline")
    parser.add_argument("--inline-jobs", type=int, default=6)
    parser.add_argument(
        "--extension",
        default="add,softmax",
        help="cases built through build.extension (cold, then device change)",
    )
    parser.add_argument("--inline-deadline-s", type=float, default=120.0)
    parser.add_argument("--inline-one", help=argparse.SUPPRESS)
    parser.add_argument("--inline-only", action="store_true", help="dry run of the inline side")
    parser.add_argument(
        "--extension-only",
        action="store_true",
        help="only the full-path demo (--extension cases) and its checks",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.inline_one:
        return inline_one(args.inline_one, out)
    if args.inline_only:
        for name, proc in start_inline(args.inline.split(","), out, args.inline_jobs):
            proc.wait()
            print(name, (out / "inline" / f"{name}.json").read_text()[-1500:])
        return 0

    t0 = time.perf_counter()
    import torch

    from pytest_kernelpro.optimize.build.nvcc import compiler_version, find_nvcc

    env = {
        "kind": "env", "torch": torch.__version__, "nvcc": compiler_version(find_nvcc()),
        "cpus": os.cpu_count(), "python": platform.python_version(), "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "cases": len(CASES), "kinds": sorted({c.kind for c in CASES}),
    }  # fmt: skip
    try:
        import cuda.bindings

        env["cuda_bindings"] = cuda.bindings.__version__
    except (ImportError, AttributeError):
        env["cuda_bindings"] = None
    log(out, env)

    ext_cache = BuildCache(Path(tempfile.mkdtemp(prefix="bs-ext-cache-")))
    ext_results: dict[Any, Any] = {}
    ext_names = [n for n in args.extension.split(",") if n]
    ext_thread = threading.Thread(
        target=run_extension_demo, args=(ext_names, out, ext_cache, ext_results), daemon=True
    )
    if ext_names:
        ext_thread.start()
    if args.extension_only:
        ext_thread.join()
        fast_outputs = {}
        for name in ext_names if args.device == "cuda" else []:
            case = next(c for c in CASES if c.name == name)
            module = load_cuda(case.source, arch=ARCH, cache=ext_cache, cutlass=case.cutlass)

            def fcall(kernel, *a, grid, block, shared_mem=0, _m=module):
                getattr(_m, kernel)(*a, grid=grid, block=block, shared_mem=shared_mem)

            fast_outputs[name] = check(case, fcall, torch)[1]
        by_name = {c.name: c for c in CASES}
        extension = check_extensions(ext_results, by_name, fast_outputs, torch, args.device)
        (out / "build_speed_extension.json").write_text(
            json.dumps(extension, indent=1, default=str)
        )
        print(json.dumps(extension, indent=1, default=str)[:6000])
        return 0
    inline_names = [n for n in args.inline.split(",") if n]
    inline_started = time.perf_counter()
    procs = start_inline(inline_names, out, args.inline_jobs) if inline_names else []
    log(out, {"kind": "inline_started", "cases": inline_names, "jobs": args.inline_jobs})

    # 2. through the layer: cold (fresh cache), then warm.
    cache = BuildCache(Path(tempfile.mkdtemp(prefix="bs-cache-")))
    cold: dict[str, float] = {}
    for case in CASES:
        started = time.perf_counter()
        try:
            build = build_cuda(case.source, arch=ARCH, cache=cache, cutlass=case.cutlass,
                               name=case.name)  # fmt: skip
            seconds = time.perf_counter() - started
            cold[case.name] = seconds
            log(out, {"kind": "fast_cold", "case": case.name, "case_kind": case.kind,
                      "seconds": seconds, "compile_s": build.compile_s, "hit": build.hit})  # fmt: skip
        except Exception as exc:
            log(out, {"kind": "fast_cold", "case": case.name, "error": str(exc)[:2000]})
    warm = []
    for case in CASES:
        started = time.perf_counter()
        try:
            build = build_cuda(case.source, arch=ARCH, cache=cache, cutlass=case.cutlass)
            warm.append(time.perf_counter() - started)
            assert build.hit
        except Exception as exc:
            log(out, {"kind": "fast_warm", "case": case.name, "error": str(exc)[:500]})
    log(out, {"kind": "fast_warm", "median_s": statistics.median(warm) if warm else None,
              "max_s": max(warm) if warm else None, "n": len(warm)})  # fmt: skip

    # 3. one 8-candidate expansion through the evaluator's prebuilder (new sources: misses).
    by_name = {c.name: c for c in CASES}
    codes = []
    for name in EXPANSION:
        case = by_name[name]
        source = case.source + "\n// expansion candidate\n"
        codes.append(
            f"from pytest_kernelpro.optimize.build import load_cuda\nK = load_cuda(r'''{source}''')\n"
        )
    builder = Prebuilder(cache, arch=ARCH, jobs=8)
    started = time.perf_counter()
    builder.submit_many(codes)
    results = [builder.wait(code) for code in codes]
    expansion_wall = time.perf_counter() - started
    builder.close()
    log(out, {
        "kind": "expansion", "candidates": EXPANSION, "jobs": 8, "wall_s": expansion_wall,
        "serial_sum_s": sum(cold.get(n, 0.0) for n in EXPANSION),
        "per_candidate_s": [r.build_s if r else None for r in results],
        "errors": [r.errors if r else None for r in results],
    })  # fmt: skip

    # 4. GPU: fast path correctness.
    fast_outputs: dict[str, Any] = {}
    fast_checks: dict[str, Any] = {}
    if args.device == "cuda":
        for case in CASES:
            try:
                module = load_cuda(case.source, arch=ARCH, cache=cache, cutlass=case.cutlass)

                def call(kernel, *a, grid, block, shared_mem=0, _m=module):
                    getattr(_m, kernel)(*a, grid=grid, block=block, shared_mem=shared_mem)

                result, output = check(case, call, torch)
                fast_outputs[case.name] = output
            except Exception as exc:
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1500]}
            fast_checks[case.name] = result
            log(out, {"kind": "fast_check", "case": case.name, **result})

    # 5. load_inline: wait (up to the deadline), then run what built.
    inline: dict[str, Any] = {}
    deadline = inline_started + args.inline_deadline_s
    for name, proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        path = out / "inline" / f"{name}.json"
        record = json.loads(path.read_text()) if path.exists() else {
            "case": name, "ok": False, "error": f"not finished within {args.inline_deadline_s:g}s"
        }  # fmt: skip
        if record.get("ok") and args.device == "cuda":
            case = by_name[name]
            try:
                module = import_inline(case, out)

                def icall(kernel, *a, grid, block, shared_mem=0, _m=module):
                    getattr(_m, f"launch_{kernel}")(*dims3(grid), *dims3(block), shared_mem, *a)

                result, output = check(case, icall, torch)
                record["check"] = result
                fast = fast_outputs.get(name)
                if fast is not None:
                    record["same_as_fast"] = bool(torch.equal(fast, output))
                    record["max_abs_diff_to_fast"] = float(
                        (fast.float() - output.float()).abs().max()
                    )
            except Exception as exc:
                record["check"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1500]}
        inline[name] = record
        log(out, {"kind": "inline", **{k: v for k, v in record.items() if k != "error"},
                  "error": (record.get("error") or "")[-800:]})  # fmt: skip

    ext_thread.join(timeout=max(1.0, deadline - time.perf_counter())) if ext_names else None
    extension = check_extensions(ext_results, by_name, fast_outputs, torch, args.device)
    log(out, {"kind": "extension_checks", **{k: v.get("check") for k, v in extension.items()}})

    fast_times = list(cold.values())
    inline_times = [r["seconds"] for r in inline.values() if r.get("ok")]
    subset_fast = [cold[n] for n in inline if n in cold and inline[n].get("ok")]
    summary = {
        "env": env,
        "fast_cold": {"n": len(fast_times), "median_s": statistics.median(fast_times),
                      "p95_s": percentile(fast_times, 0.95), "max_s": max(fast_times),
                      "per_case_s": cold},
        "fast_warm_median_s": statistics.median(warm) if warm else None,
        "expansion": {"wall_s": expansion_wall, "jobs": 8,
                      "serial_sum_s": sum(cold.get(n, 0.0) for n in EXPANSION)},
        "inline": {"n_built": len(inline_times), "cases": inline_names,
                   "jobs": args.inline_jobs,
                   "median_s": statistics.median(inline_times) if inline_times else None,
                   "p95_s": percentile(inline_times, 0.95) if inline_times else None,
                   "per_case": inline},
        "speedup_median_same_cases": (statistics.median(inline_times) /
                                      statistics.median(subset_fast))
        if inline_times and subset_fast else None,
        "speedup_median_all": (statistics.median(inline_times) / statistics.median(fast_times))
        if inline_times else None,
        "fast_checks": fast_checks,
        "extension": extension,
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    (out / "build_speed.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("fast_checks",)},
                     indent=1, default=str)[:6000])  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
