"""Measuring this machine's ceilings: the probes that time a large copy and a library GEMM
per dtype (on CPU and GPU), the cache they fill (`load_or_measure_ceilings`), and the rule
that load never lowers a CPU ceiling (`best_of`, `reprobe`). A probe costs seconds, tens
under load (a session with usable cached ceilings never imports this module).

GPU: a device-to-device copy of >= 1 GiB (bytes read + written over the median time of CUDA
events) and a cuBLAS GEMM per dtype on random data (never zeros: zeros run faster). CPU:
the copy of a tensor larger than the last-level cache, and torch.matmul per dtype at a size
grown until one product takes a fraction of a second.

Load only ever makes a probe slower, so a CPU ceiling is never lowered by it: one measured
while other processes held the cores it needed (`CpuLoadMonitor`) is kept as *provisional*,
not cached for good, and re-measured by the first session that finds the machine quiet
(`quiet_now`, a 0.2 s look); whenever the CPU's ceilings of one machine, torch version and
thread count are measured again each keeps the best of the old and the new probe (`best_of`);
and a kernel whose compulsory bytes beat the bandwidth ceiling has the ceilings re-probed
(`reprobe`) before anything is blamed (`exceedance_note` says on what).
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.measure.ceilings import (
    CACHE_SCHEMA,
    CacheTarget,
    Ceilings,
    cache_path,
    cache_target,
    combine_with_spec,
    format_rate,
    measured_under_load,
    merge_spec,
    read_cached,
    resolve_device,
)
from pytest_kernelpro.measure.devices import DeviceSpec, find_device_spec
from pytest_kernelpro.measure.timing.cpu_load import CpuLoadMonitor

if TYPE_CHECKING:
    import torch


def measure_ceilings(
    device: str, *, spec: DeviceSpec | None = None, quick: bool = False
) -> Ceilings:
    """Measure copy bandwidth and GEMM FLOP/s on `device` ("cpu", "cuda", "cuda:N").

    `spec` fills the keys not measured (on GPU: fp64 CUDA-core, fp8, int8); without one the
    built-in table is searched by the device's name. `quick` uses smaller sizes (tests).
    """
    import torch

    device_type, name, index = resolve_device(device)
    if device_type == "cpu":
        spec = None  # GPU datasheets say nothing about a CPU
    elif spec is None:
        spec = find_device_spec(name)
    measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    if device_type == "cpu":
        bandwidth, flops, details = measure_cpu(quick)
    else:
        bandwidth, flops, details = measure_cuda(index, spec, quick)
    details["quick"] = quick
    details["device_type"] = device_type
    # A busy host lowers CPU ceilings (and the launch rate of GPU ones): keep the evidence.
    details["loadavg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    details["cpu_count"] = os.cpu_count()
    details["wall_s"] = time.perf_counter() - start
    return combine_with_spec(name, bandwidth, flops, spec, details, measured_at, torch.__version__)


def load_or_measure_ceilings(
    device: str,
    cache_dir: Path,
    *,
    spec: DeviceSpec | None = None,
    refresh: bool = False,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    replace_cached: bool = False,
) -> Ceilings:
    """Cached ceilings of `device` for this torch version (and CPU thread count), measured
    and cached if absent, by the rules of load (module docstring; `replace_cached`: the new
    probe replaces the cached CPU set instead of keeping the best of both); `progress` hears
    a line before a measurement starts. A corrupt or mismatched cache file is reported as a
    KernelproWarning and re-measured; provisional ceilings' `details["not_cached"]` says why.

    One probe at a time per cache file: two processes probing at once (xdist workers, two CI
    jobs on one runner) would each measure the other as load. A process that waited for
    another's probe uses what that one wrote, as it would have on arriving later.
    """
    target = cache_target(device, cache_dir, spec, quick)
    found = _usable_or_kept(target, refresh=refresh, replace_cached=replace_cached, warn=True)
    if isinstance(found, Ceilings):
        return found
    with _probe_lock(target.path):
        if not refresh:
            found = _usable_or_kept(target, refresh=False, replace_cached=False, warn=False)
            if isinstance(found, Ceilings):
                return found
        return _probe(
            device, target, found.previous, quick=quick, refresh=refresh, progress=progress
        )


@dataclass(frozen=True)
class _Kept:
    """No cached ceilings to use as they are; `previous`: a valid cached CPU set that a new
    probe keeps the best of (None: nothing to keep)."""

    previous: Ceilings | None


@contextmanager
def _probe_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on probing into `path`'s folder: flock on the folder itself, so no
    lock file is left in the cache, and the system lets go of it when its process ends (a
    probe stopped half-way leaves no lock behind)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # closing the last descriptor releases the lock


def _usable_or_kept(
    target: CacheTarget, *, refresh: bool, replace_cached: bool, warn: bool
) -> Ceilings | _Kept:
    """`target`'s cached ceilings when they are used as they are, else what a probe keeps."""
    import torch

    previous: Ceilings | None = None
    if target.path.exists() and not (refresh and replace_cached):
        try:
            cached = read_cached(target.path, target.name, torch.__version__)
            previous = cached if target.device_type == "cpu" else None
            busy = measured_under_load(cached)
            if refresh:
                pass  # re-measure; on the CPU the best of both is kept
            elif busy is None:
                return merge_spec(cached, target.spec)
            elif target.threads is not None and not quiet_now(target.threads):
                note = (
                    f"provisional: measured under load on {cached.measured_at} ({busy}); "
                    "re-measured once the machine is quiet"
                )
                return replace(cached, details={**cached.details, "not_cached": note})
            # quiet now: fall through and measure them properly
        except (OSError, ValueError, KeyError, TypeError, KernelproError) as exc:
            if warn:
                warnings.warn(
                    f"ignoring ceilings cache {target.path}: {exc}; re-measuring {target.name}",
                    KernelproWarning,
                    stacklevel=3,
                )
    return _Kept(previous)


def _probe(
    device: str,
    target: CacheTarget,
    previous: Ceilings | None,
    *,
    quick: bool,
    refresh: bool,
    progress: Callable[[str], None] | None,
) -> Ceilings:
    """Measure `device`'s ceilings (the best of each with `previous`), cache them and return
    them, marked provisional when measured under load."""
    name, threads, spec, path = target.name, target.threads, target.spec, target.path
    if progress is not None:
        what = f"{threads} thread(s)" if threads else "copy bandwidth and GEMMs"
        progress(
            f"kernelpro: measuring the ceilings of {name} ({what}; once per machine, "
            f"cached in {path.parent})"
        )
    ceilings = _monitored(lambda: measure_ceilings(device, spec=spec, quick=quick), threads)
    if previous is not None:
        why = "kernelpro calibrate" if refresh else "re-measured on a quiet machine"
        ceilings = _best_with_history(previous, ceilings, ceilings.measured_at, why)
    atomic_write_json(
        path, {"schema": CACHE_SCHEMA, "quick": quick, "ceilings": ceilings.to_dict()}
    )
    busy = measured_under_load(ceilings)
    if busy is not None:
        note = f"provisional: measured under load ({busy}); re-measured once the machine is quiet"
        ceilings = replace(ceilings, details={**ceilings.details, "not_cached": note})
    return ceilings


def _monitored(measure: Callable[[], Ceilings], threads: int | None) -> Ceilings:
    """`measure()`'s CPU ceilings with the load they were measured under (`details["load"]`)
    and whether that probe ran on a quiet machine (`quiet_probes`: 1 or 0)."""
    if not threads:
        return measure()
    monitor = CpuLoadMonitor(threads)
    ceilings = measure()
    load = monitor.stop()
    quiet = 0 if load.oversubscribed else 1
    details = {**ceilings.details, "load": load.to_dict(), "quiet_probes": quiet}
    return replace(ceilings, details=details)


def quiet_now(threads: int, seconds: float = 0.2) -> bool:
    """True when the machine looks quiet enough to re-measure: the 1-minute load average is
    below the CPU count (a short look alone catches a lull between bursts), and over the next
    `seconds` other processes leave the cores `threads` need."""
    try:
        load_1m = os.getloadavg()[0]
    except (AttributeError, OSError):
        load_1m = None
    if load_1m is not None and load_1m >= (os.cpu_count() or 1):
        return False
    monitor = CpuLoadMonitor(threads)
    time.sleep(seconds)
    return not monitor.stop().oversubscribed


def _measured(ceilings: Ceilings) -> dict[str, float]:
    return {k: v for k, v in ceilings.flops.items() if ceilings.origin(k) == "measured"}


def best_of(old: Ceilings, new: Ceilings) -> tuple[Ceilings, list[str]]:
    """`new` with each measured ceiling raised to `old`'s where `old` was higher (load can only
    lower a probe), and the list of what rose ("fp32 45 -> 143 GFLOP/s")."""
    if old.device != new.device or old.torch_version != new.torch_version:
        return new, []
    flops = dict(new.flops)
    rose: list[str] = []
    gemm = dict(new.details.get("gemm") or {})
    for key, value in _measured(old).items():
        if new.origin(key) == "measured" and value > flops.get(key, 0.0):
            flops[key] = value
            gemm[key] = (old.details.get("gemm") or {}).get(key, gemm.get(key))
    for key, value in flops.items():
        before = old.flops.get(key)
        if before is not None and value > before * 1.001:
            rose.append(f"{key} {format_rate(before, 'FLOP/s')} -> {format_rate(value, 'FLOP/s')}")
    bandwidth = max(new.bandwidth_Bps, old.bandwidth_Bps)
    if new.bandwidth_Bps > old.bandwidth_Bps * 1.001:
        rose.append(
            f"bandwidth {format_rate(old.bandwidth_Bps, 'B/s')} -> "
            f"{format_rate(new.bandwidth_Bps, 'B/s')}"
        )
    details = dict(new.details)
    details["gemm"] = gemm
    if old.bandwidth_Bps > new.bandwidth_Bps:
        details["copy"] = old.details.get("copy", details.get("copy"))
    details["probe_passes"] = int(old.details.get("probe_passes") or 1) + int(
        new.details.get("probe_passes") or 1
    )
    details["reprobes"] = int(old.details.get("reprobes") or 0) + 1
    details["quiet_probes"] = int(old.details.get("quiet_probes") or 0) + int(
        new.details.get("quiet_probes") or 0
    )
    details["first_measured_at"] = old.details.get("first_measured_at", old.measured_at)
    details.pop("not_cached", None)  # re-probed: the best of both is no longer provisional
    return replace(new, bandwidth_Bps=bandwidth, flops=flops, details=details), rose


def _best_with_history(old: Ceilings, new: Ceilings, at: str, why: str) -> Ceilings:
    """`best_of(old, new)` with the re-probe (when, why, what rose) appended to `old`'s
    `reprobe_history` (the last ten kept)."""
    merged, rose = best_of(old, new)
    entry = {"at": at, "why": why, "rose": rose}
    history = [*(old.details.get("reprobe_history") or []), entry][-10:]
    return replace(merged, details={**merged.details, "reprobe_history": history})


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


def _times_cpu(fn: Callable[[], object], reps: int, warmup: int = 1) -> list[float]:
    """On-CPU times (`timing.on_cpu.on_cpu_seconds`) of `reps` calls after `warmup` untimed
    ones: another process holding the core cannot make a probe look slow (a ceiling is an
    upper bound: load may only ever lower it)."""
    from pytest_kernelpro.measure import bound
    from pytest_kernelpro.measure.timing.on_cpu import RunQueueClock, on_cpu_seconds

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
        flag, value = "fp32_precision", "tf32" if enabled else "ieee"
    else:
        flag, value = "allow_tf32", enabled
    previous = getattr(matmul, flag)
    setattr(matmul, flag, value)
    try:
        yield
    finally:
        setattr(matmul, flag, previous)


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


# Passes of the whole CPU probe (copy and every GEMM); each ceiling is the best pass's: a
# burst of other work lasts seconds, so the passes are spread over the probe's time.
CPU_PROBE_PASSES = 3


CPU_QUICK_PROBE_PASSES = 2  # quick sizes (tests): still repeated, in less time


def measure_cpu(
    quick: bool, passes: int | None = None
) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """CPU ceilings, each the best rate of `passes` (default `CPU_PROBE_PASSES`) passes of the
    whole probe (the copy, then each GEMM at the size the first pass chose), timed in on-CPU
    time (`_times_cpu`), not the median: other work only ever makes a probe slower (the
    module docstring). GPUs are not shared that way and use the median."""
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


def reprobe(ceilings: Ceilings, device: str, cache_dir: Path, *, why: str) -> Ceilings:
    """Measure `device`'s ceilings again and keep the best of both (`best_of`), cached;
    `why` is recorded (the kernel that exceeded a ceiling). GPU ceilings are returned as they
    are: device-timed, no load lowers them."""
    import torch

    if ceilings.device_type != "cpu":
        return ceilings
    threads = torch.get_num_threads()
    fresh = _monitored(lambda: measure_ceilings(device, quick=False), threads)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    merged = _best_with_history(ceilings, fresh, now, why)
    path = cache_path(Path(cache_dir), merged.device, merged.torch_version, False, threads)
    atomic_write_json(path, {"schema": CACHE_SCHEMA, "quick": False, "ceilings": merged.to_dict()})
    return merged


def reprobe_summary(ceilings: Ceilings) -> str:
    """One line on the last re-probe: "re-probed (a kernel exceeded them): fp32 45 -> 143
    GFLOP/s" or "re-probed: no ceiling rose"."""
    history = ceilings.details.get("reprobe_history") or []
    if not history:
        return "not re-probed"
    last = history[-1]
    rose = last.get("rose") or []
    what = "; ".join(rose) if rose else "no ceiling rose"
    return f"re-probed ({last.get('why')}): {what}"


def exceedance_note(ceilings: Ceilings) -> str:
    """What a CPU rate above every ceiling is blamed on, after the re-probe (or without it)."""
    if ceilings.trusted and ceilings.details.get("reprobe_history"):
        return (
            f"the ceilings were re-probed and still hold ({ceilings.trust_reason()}; "
            f"{reprobe_summary(ceilings)}), so load did not cause it"
        )
    if ceilings.trusted:
        return (
            f"the ceilings are an upper bound ({ceilings.trust_reason()}), so load did not cause it"
        )
    return (
        f"the CPU ceilings are {ceilings.trust_reason().removeprefix('not trusted: ')} "
        "and could not be re-probed here: they may have been measured under load, which "
        "lowers them; run `kernelpro calibrate` on a quiet machine before suspecting the "
        "FLOP or byte count"
    )
