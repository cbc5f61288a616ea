"""The measurements behind the ceilings: timed copies and library GEMMs on CPU and GPU.

Split from `ceilings.py`, which turns these numbers into `Ceilings`, fills gaps from a
device spec and caches the result.
"""

from __future__ import annotations

import platform
import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.measure.devices import DeviceSpec

if TYPE_CHECKING:
    import torch

# GPU sizes (the brief of the project: >= 1 GiB copy; 8192^3 half/TF32/FP32 GEMM, 4096^3 FP64).
_GPU_COPY_BYTES = 1 << 30
_GPU_GEMM = {"bf16_tensor": 8192, "fp16_tensor": 8192, "tf32_tensor": 8192, "fp32": 8192}
_GPU_FP64_GEMM = 4096
_GPU_QUICK_DIVISOR = 2  # quick: 4096^3 / 2048^3 and a 256 MiB copy
# CPU: a copy well past a typical 32 MiB LLC; GEMM grown until one product passes the target.
_CPU_COPY_BYTES = 256 << 20
_CPU_QUICK_COPY_BYTES = 64 << 20
_CPU_LADDER = (128, 256, 512, 1024, 2048, 4096)
_CPU_TARGET_S = 0.25
_CPU_QUICK_TARGET_S = 0.03
# Architectures whose FP64 GEMM runs on DMMA tensor cores (A100, H100/H200, B200).
_DMMA_CAPABILITIES = {(8, 0), (9, 0), (10, 0)}


# --------------------------------------------------------------------------- timing helpers


def _times_cpu(fn: Callable[[], object], reps: int, warmup: int = 1) -> list[float]:
    """On-CPU times of `reps` calls after `warmup` untimed ones: wall time less the time the
    thread waited on the run queue (`timing.cpu_anchor.RunQueueClock`), never below its CPU
    time, so another process holding the core cannot make a probe look slow (a ceiling is an
    upper bound: load may only ever lower it)."""
    from pytest_kernelpro.measure import bound
    from pytest_kernelpro.measure.timing.cpu_anchor import RunQueueClock, on_cpu_seconds

    for _ in range(warmup):
        fn()
    rq = RunQueueClock()
    times = []
    try:
        for _ in range(reps):
            w0, c0 = rq.wait_ns(), bound.thread_time()
            start = time.perf_counter()
            fn()
            wall = time.perf_counter() - start
            c1, w1 = bound.thread_time(), rq.wait_ns()
            times.append(on_cpu_seconds(wall, w1 - w0, c1 - c0, rq.available))
    finally:
        rq.close()
    return times


def _times_cuda(fn: Callable[[], object], reps: int, warmup: int = 3) -> list[float]:
    """Device times (s) of `reps` calls, one CUDA event pair each, after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]


@contextmanager
def _matmul_tf32(enabled: bool) -> Iterator[None]:
    """Set cuBLAS TF32 for the block and restore it, through the API torch prefers."""
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; the legacy flag would mix APIs
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
    else:
        previous_flag = matmul.allow_tf32
        matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32 = previous_flag


# --------------------------------------------------------------------------- measurement


def resolve_device(device: str) -> tuple[str, str, int]:
    """(device_type, display name, cuda index) for "cpu", "cuda" or "cuda:N"."""
    import torch

    text = device.strip().lower()
    if text == "cpu":
        return "cpu", f"cpu ({_cpu_model()})", -1
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise KernelproError(
            f"device {device!r} is not 'cpu', 'cuda' or 'cuda:N'; pass one of those"
        )
    if not torch.cuda.is_available():
        raise KernelproError(
            f"device {device!r} asked for, but torch sees no CUDA GPU "
            f"(torch {torch.__version__}); use --device cpu or install a CUDA build of torch"
        )
    index = int(match.group(1) or torch.cuda.current_device())
    if index >= torch.cuda.device_count():
        raise KernelproError(
            f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s); pick a lower index"
        )
    return "cuda", torch.cuda.get_device_name(index), index


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _rate(work: float, times: list[float], statistic: str) -> dict[str, Any]:
    """Work per second from the median time (GPU) or the best time (CPU, see measure_cpu)."""
    median, best = statistics.median(times), min(times)
    used = best if statistic == "min" else median
    return {"times_s": times, "median_s": median, "min_s": best, "statistic": statistic,
            "rate": work / used}  # fmt: skip


def _gemm_rate(
    dtype: torch.dtype,
    n: int,
    device: str,
    timer: Callable[..., list[float]],
    reps: int,
    statistic: str = "median",
) -> dict[str, Any]:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, generator=gen).to(dtype)
    times = timer(lambda: torch.matmul(a, b), reps)
    work = 2.0 * n**3
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "flops": work,
            **_rate(work, times, statistic)}  # fmt: skip


def _copy_rate(
    nbytes: int,
    device: str,
    timer: Callable[..., list[float]],
    reps: int,
    statistic: str = "median",
) -> dict[str, Any]:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    src = torch.randn(nbytes // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    times = timer(lambda: dst.copy_(src), reps)
    moved = 2 * src.numel() * src.element_size()  # bytes read + bytes written
    return {"bytes_moved": moved, **_rate(moved, times, statistic)}


def _cpu_gemm_size(dtype: torch.dtype, target_s: float, min_n: int) -> int:
    """Grow n until the next size (8x the work) would pass `target_s` for one product.

    Sizes below `min_n` are passed over unless one product already exceeds `target_s`: on an
    oversubscribed machine a thread stall makes a tiny product look slow, and stopping there
    would report a fraction of the real rate.
    """
    import torch

    chosen = _CPU_LADDER[0]
    for n in _CPU_LADDER:
        a = torch.randn(n, n).to(dtype)
        # The fastest of three after a warm-up call: a busy machine's stalls must not stop the
        # growth at a size too small to reach the matmul's real rate.
        elapsed = min(_times_cpu(lambda a=a: torch.matmul(a, a), reps=5 if n <= 512 else 2))
        chosen = n
        if elapsed > target_s or (elapsed * 8 > target_s and n >= min_n):
            break
    return chosen


_CPU_GEMMS = (("fp32", "float32"), ("fp64", "float64"), ("bf16", "bfloat16"))
# Passes of the whole CPU probe (copy and every GEMM); each ceiling is the best pass's. One
# pass measured FP32 at 45 GFLOP/s under load against 143-305 alone: a burst of other work
# lasts seconds, so the passes are spread over the probe's time, not taken back to back.
CPU_PROBE_PASSES = 3
CPU_QUICK_PROBE_PASSES = 2  # quick sizes (tests): still repeated, in less time


def measure_cpu(
    quick: bool, passes: int | None = None
) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """CPU ceilings from the BEST of repeated probes, in on-CPU time, not the median.

    A ceiling is an upper bound. On a shared or oversubscribed host (CI runners, xdist
    workers) other work only ever makes a probe slower: the median of a few runs can land
    at a tenth of the real rate (seen on a 2-core runner at load 5), the fastest does not.
    So each probe is timed in on-CPU time (`_times_cpu`: a preemption is not the probe's
    time), the whole probe (copy, then each GEMM at the size the first pass chose) runs
    `passes` times (default `CPU_PROBE_PASSES`), and each ceiling is the best rate of any
    pass. GPUs are not shared that
    way and use the median.
    """
    import torch

    if passes is None:
        passes = CPU_QUICK_PROBE_PASSES if quick else CPU_PROBE_PASSES
    details: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "gemm": {},
        "probe_passes": passes,
        "timer": "on-CPU (wall less run-queue wait), best of repeated probes",
    }
    copy_bytes = _CPU_QUICK_COPY_BYTES if quick else _CPU_COPY_BYTES
    target = _CPU_QUICK_TARGET_S if quick else _CPU_TARGET_S
    sizes = {
        key: _cpu_gemm_size(getattr(torch, dtype), target, 256 if quick else 512)
        for key, dtype in _CPU_GEMMS
    }
    best_copy: dict[str, Any] | None = None
    best: dict[str, dict[str, Any]] = {}
    rates: list[dict[str, float]] = []
    for _ in range(max(1, passes)):
        copy = _copy_rate(copy_bytes, "cpu", _times_cpu, 5, statistic="min")
        this = {"bandwidth": copy["rate"]}
        if best_copy is None or copy["rate"] > best_copy["rate"]:
            best_copy = copy
        for key, dtype in _CPU_GEMMS:
            # At the chosen size one product takes about target/8 to target seconds.
            result = _gemm_rate(
                getattr(torch, dtype), sizes[key], "cpu", _times_cpu, 5 if quick else 3,
                statistic="min",
            )  # fmt: skip
            this[key] = result["rate"]
            if key not in best or result["rate"] > best[key]["rate"]:
                best[key] = result
        rates.append(this)
    assert best_copy is not None
    details["copy"] = best_copy
    details["gemm"] = best
    details["pass_rates"] = rates
    return best_copy["rate"], {key: best[key]["rate"] for key in best}, details


def measure_cuda(
    index: int, spec: DeviceSpec | None, quick: bool
) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    import torch

    device = f"cuda:{index}"
    divisor = _GPU_QUICK_DIVISOR if quick else 1
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    details: dict[str, Any] = {
        "sms": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "gemm": {},
    }
    flops: dict[str, float] = {}
    bandwidth: float | None = None
    with torch.cuda.device(index):
        copy_bytes = _GPU_COPY_BYTES // (4 if quick else 1)
        try:
            copy = _copy_rate(copy_bytes, device, _times_cuda, 10)
            details["copy"] = copy
            bandwidth = copy["rate"]
        except RuntimeError as exc:  # includes torch.cuda.OutOfMemoryError
            warnings.warn(
                f"copy bandwidth of {device} not measured: {exc}", KernelproWarning, stacklevel=3
            )
        has_dmma = ("fp64_tensor" in spec.peak_flops) if spec else capability in _DMMA_CAPABILITIES
        plan = [
            ("bf16_tensor", torch.bfloat16, _GPU_GEMM["bf16_tensor"], False, 10),
            ("fp16_tensor", torch.float16, _GPU_GEMM["fp16_tensor"], False, 10),
            ("tf32_tensor", torch.float32, _GPU_GEMM["tf32_tensor"], True, 10),
            ("fp32", torch.float32, _GPU_GEMM["fp32"], False, 5),
            ("fp64_tensor" if has_dmma else "fp64", torch.float64, _GPU_FP64_GEMM, False, 10),
        ]
        for key, dtype, n, tf32, reps in plan:
            try:
                with _matmul_tf32(tf32):
                    result = _gemm_rate(dtype, n // divisor, device, _times_cuda, reps)
            except RuntimeError as exc:
                warnings.warn(
                    f"{key} GEMM on {device} not measured: {exc}", KernelproWarning, stacklevel=3
                )
                continue
            result["tf32"] = tf32
            details["gemm"][key] = result
            flops[key] = result["rate"]
            torch.cuda.empty_cache()
    return bandwidth, flops, details
