"""Ceilings measured on this machine: copy bandwidth and library-GEMM FLOP/s per dtype.

The roofline divides by these, not by datasheet numbers: a datasheet rate is a lead that no
real kernel reaches (METHOD.md, "Two numbers first"). Measured once per machine and torch
version, cached as JSON; `kernelpro calibrate` re-measures.

GPU: a device-to-device copy of >= 1 GiB (bytes read + written over the median time of CUDA
events) and a cuBLAS GEMM per dtype on random data (never zeros: zeros run faster). CPU:
the copy of a tensor larger than the last-level cache, and torch.matmul per dtype at a size
grown until one product takes a fraction of a second.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KernelproError, KernelproWarning
from ..fileio import atomic_write_json
from .devices import DeviceSpec, find_device_spec

if TYPE_CHECKING:
    import torch

CACHE_SCHEMA = 1
DEFAULT_CACHE_DIR = Path(".kernelpro") / "cache"
SOURCES = ("measured", "datasheet", "measured+datasheet")

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


@dataclass(frozen=True)
class Ceilings:
    """The two roofline ceilings of one device: bandwidth and FLOP/s per peak key."""

    device: str
    bandwidth_Bps: float
    flops: Mapping[str, float]
    source: str
    measured_at: str
    torch_version: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.bandwidth_Bps, (int, float)) or not self.bandwidth_Bps > 0:
            raise KernelproError(
                f"ceilings of {self.device!r}: bandwidth_Bps={self.bandwidth_Bps!r} must be a "
                "positive number; re-measure with `kernelpro calibrate`"
            )
        for key, value in self.flops.items():
            if not isinstance(value, (int, float)) or not value > 0:
                raise KernelproError(
                    f"ceilings of {self.device!r}: flops[{key!r}]={value!r} must be a positive "
                    "number; re-measure with `kernelpro calibrate`"
                )
        if self.source not in SOURCES:
            raise KernelproError(
                f"ceilings of {self.device!r}: source {self.source!r} is not one of {SOURCES}"
            )
        object.__setattr__(self, "flops", {k: float(v) for k, v in self.flops.items()})
        object.__setattr__(self, "details", dict(self.details))

    @property
    def device_type(self) -> str:
        """ "cpu" or "cuda"."""
        return "cpu" if self.device.startswith("cpu") else "cuda"

    def origin(self, key: str) -> str:
        """Where `flops[key]` came from: "measured", "datasheet" or "missing"."""
        if key not in self.flops:
            return "missing"
        return str(self.details.get("flops_origin", {}).get(key, "measured"))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "device": self.device,
            "bandwidth_Bps": self.bandwidth_Bps,
            "flops": dict(self.flops),
            "source": self.source,
            "measured_at": self.measured_at,
            "torch_version": self.torch_version,
            "details": json.loads(json.dumps(self.details, default=str)),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ceilings:
        """Inverse of `to_dict`; a missing or mistyped key raises KernelproError."""
        try:
            return cls(
                device=str(d["device"]),
                bandwidth_Bps=float(d["bandwidth_Bps"]),
                flops={str(k): float(v) for k, v in dict(d["flops"]).items()},
                source=str(d["source"]),
                measured_at=str(d["measured_at"]),
                torch_version=str(d["torch_version"]),
                details=dict(d.get("details", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise KernelproError(
                f"ceilings record is malformed ({type(exc).__name__}: {exc}); "
                "delete it or run `kernelpro calibrate`"
            ) from None


# --------------------------------------------------------------------------- timing helpers


def _times_cpu(fn: Callable[[], object], reps: int, warmup: int = 1) -> list[float]:
    """Wall times of `reps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
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
    """Work per second from the median time (GPU) or the best time (CPU, see _measure_cpu)."""
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


def _measure_cpu(quick: bool) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """CPU ceilings from the BEST of several runs, not the median.

    A ceiling is an upper bound. On a shared or oversubscribed host (CI runners, xdist
    workers) torch's worker threads stall for whole scheduler slices, which only ever makes a
    run slower: the median of a few runs can land at a tenth of the real rate (seen on a
    2-core runner at load 5), the fastest run does not. GPUs are not shared that way and
    use the median.
    """
    import torch

    details: dict[str, Any] = {"threads": torch.get_num_threads(), "gemm": {}}
    copy_bytes = _CPU_QUICK_COPY_BYTES if quick else _CPU_COPY_BYTES
    target = _CPU_QUICK_TARGET_S if quick else _CPU_TARGET_S
    copy = _copy_rate(copy_bytes, "cpu", _times_cpu, 5, statistic="min")
    details["copy"] = copy
    flops: dict[str, float] = {}
    for key, dtype in (("fp32", torch.float32), ("fp64", torch.float64), ("bf16", torch.bfloat16)):
        n = _cpu_gemm_size(dtype, target, 256 if quick else 512)
        # At the chosen size one product takes about target/8 to target seconds.
        result = _gemm_rate(dtype, n, "cpu", _times_cpu, 5 if quick else 3, statistic="min")
        details["gemm"][key] = result
        flops[key] = result["rate"]
    return copy["rate"], flops, details


def _measure_cuda(
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


def combine_with_spec(
    name: str,
    bandwidth: float | None,
    measured: Mapping[str, float],
    spec: DeviceSpec | None,
    details: dict[str, Any],
    measured_at: str,
    torch_version: str,
) -> Ceilings:
    """Measured values first, the spec for what was not measured; record each one's origin."""
    flops = dict(measured)
    origin = {key: "measured" for key in measured}
    if spec is not None:
        for key, value in spec.peak_flops.items():
            if key not in flops:
                flops[key] = value
                origin[key] = "datasheet"
    bandwidth_origin = "measured"
    if bandwidth is None:
        if spec is None:
            raise KernelproError(
                f"memory bandwidth of {name!r} could neither be measured nor found in a device "
                "spec; free device memory and run `kernelpro calibrate`, or add a spec through "
                "the pytest_kernelpro_device_specs hook"
            )
        bandwidth, bandwidth_origin = spec.dram_bandwidth_Bps, "datasheet"
    origins = {bandwidth_origin, *origin.values()}
    source = "measured+datasheet" if len(origins) > 1 else origins.pop()
    details = {
        **details,
        "flops_origin": origin,
        "bandwidth_origin": bandwidth_origin,
        "spec": spec.name if spec else None,
    }
    return Ceilings(name, bandwidth, flops, source, measured_at, torch_version, details)


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
        bandwidth, flops, details = _measure_cpu(quick)
    else:
        bandwidth, flops, details = _measure_cuda(index, spec, quick)
    details["quick"] = quick
    details["device_type"] = device_type
    # A busy host lowers CPU ceilings (and the launch rate of GPU ones): keep the evidence.
    details["loadavg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    details["cpu_count"] = os.cpu_count()
    details["wall_s"] = time.perf_counter() - start
    return combine_with_spec(name, bandwidth, flops, spec, details, measured_at, torch.__version__)


def _merge_spec(ceilings: Ceilings, spec: DeviceSpec | None) -> Ceilings:
    """Refresh the datasheet fill-ins of cached ceilings from today's spec (a hook may add one)."""
    measured = {k: v for k, v in ceilings.flops.items() if ceilings.origin(k) == "measured"}
    bandwidth = (
        ceilings.bandwidth_Bps
        if ceilings.details.get("bandwidth_origin", "measured") == "measured"
        else None
    )
    if spec is None and bandwidth is None:
        return ceilings
    return combine_with_spec(
        ceilings.device,
        bandwidth,
        measured,
        spec,
        dict(ceilings.details),
        ceilings.measured_at,
        ceilings.torch_version,
    )


def cache_path(cache_dir: Path, device_name: str, torch_version: str, quick: bool = False) -> Path:
    """The cache file of one device and torch version."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{device_name}-torch{torch_version}").strip("-").lower()
    return Path(cache_dir) / f"ceilings-{slug}{'-quick' if quick else ''}.json"


def load_or_measure_ceilings(
    device: str,
    cache_dir: Path,
    *,
    spec: DeviceSpec | None = None,
    refresh: bool = False,
    quick: bool = False,
) -> Ceilings:
    """Cached ceilings of `device` for this torch version, measured (and cached) if absent.

    A corrupt or mismatched cache file is reported as a KernelproWarning and re-measured.
    """
    import torch

    device_type, name, _ = resolve_device(device)
    if device_type == "cpu":
        spec = None
    elif spec is None:
        spec = find_device_spec(name)
    path = cache_path(Path(cache_dir), name, torch.__version__, quick)
    if path.exists() and not refresh:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or record.get("schema") != CACHE_SCHEMA:
                raise KernelproError(
                    f"schema {record.get('schema') if isinstance(record, dict) else None!r} != {CACHE_SCHEMA}"
                )
            cached = Ceilings.from_dict(record["ceilings"])
            if cached.device != name or cached.torch_version != torch.__version__:
                raise KernelproError(
                    f"it holds {cached.device!r} / torch {cached.torch_version}, "
                    f"not {name!r} / torch {torch.__version__}"
                )
            return _merge_spec(cached, spec)
        except (OSError, ValueError, KeyError, TypeError, KernelproError) as exc:
            warnings.warn(
                f"ignoring ceilings cache {path}: {exc}; re-measuring {name}",
                KernelproWarning,
                stacklevel=2,
            )
    ceilings = measure_ceilings(device, spec=spec, quick=quick)
    atomic_write_json(
        path, {"schema": CACHE_SCHEMA, "quick": quick, "ceilings": ceilings.to_dict()}
    )
    return ceilings


def format_rate(value: float, unit: str) -> str:
    """`value` with an SI prefix and three significant digits: 788e12, "FLOP/s" -> "788 TFLOP/s"."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def calibrate_main(argv: list[str], *, extra_specs: tuple[DeviceSpec, ...] = ()) -> int:
    """`kernelpro calibrate [--device cuda] [--cache-dir DIR] [--quick] [--json] [--out PATH]`.

    Re-measures the ceilings, writes them to the cache and prints a table (or JSON).
    Returns the exit status: 0 on success, 2 on a bad argument or a failed measurement.
    """
    from .calibrate import run_calibrate

    return run_calibrate(argv, extra_specs=extra_specs)
