"""Ceilings measured on this machine: copy bandwidth and library-GEMM FLOP/s per dtype.

The roofline divides by these, not by datasheet numbers: a datasheet rate is a lead that no
real kernel reaches (METHOD.md, "Two numbers first"). Measured once per machine and torch
version, cached as JSON; `kernelpro calibrate` re-measures.

GPU: a device-to-device copy of >= 1 GiB (bytes read + written over the median time of CUDA
events) and a cuBLAS GEMM per dtype on random data (never zeros: zeros run faster). CPU:
the copy of a tensor larger than the last-level cache, and torch.matmul per dtype at a size
grown until one product takes a fraction of a second.

CPU ceilings depend on the thread count, so they are measured at the thread policy's count
(measure/cpuload.py) and cached per count. A CPU measurement taken while other processes
held the cores it needed (`CpuLoadMonitor`) is never cached for good (it would stay: FP32
45 GFLOP/s measured under load against 143-305 alone): it is kept as *provisional*, used
(and named in the summary) only while the machine is still busy, and re-measured by the
first session that finds the machine quiet (`quiet_now`, a 0.2 s look). Re-measuring every
busy session instead would cost ~50 s a session at load 11 for numbers no better.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.measure.ceiling_probes import measure_cpu, measure_cuda, resolve_device
from pytest_kernelpro.measure.cpuload import CpuLoadMonitor
from pytest_kernelpro.measure.devices import DeviceSpec, find_device_spec

if TYPE_CHECKING:
    pass

CACHE_SCHEMA = 1
DEFAULT_CACHE_DIR = Path(".kernelpro") / "cache"
SOURCES = ("measured", "datasheet", "measured+datasheet")


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

    @property
    def trusted(self) -> bool:
        """True when no load can have lowered these ceilings, so a kernel beyond them is
        beyond the machine (the rule that fails an impossible time may use only these).

        GPU ceilings: always (timed by device events on a GPU no other process shares; a
        datasheet value is an upper bound). CPU ceilings: only once they are the best of
        repeated probes in on-CPU time AND have been re-probed at least once (the best of
        both kept, `ceiling_trust.reprobe`): provisional ceilings never are."""
        return self.trust_reason().startswith("trusted")

    def trust_reason(self) -> str:
        """ "trusted: ..." or "not trusted: ..." with why, for messages."""
        if self.device_type == "cuda":
            return "trusted: GPU ceilings (device-timed, or the datasheet's upper bound)"
        passes = int(self.details.get("probe_passes") or 1)
        reprobes = int(self.details.get("reprobes") or 0)
        if passes < 2:
            return (
                "not trusted: one probe (measured by an older version); `kernelpro calibrate` "
                "re-measures them"
            )
        if reprobes < 1:
            state = "provisional, measured under load" if self.details.get("not_cached") else (
                "not re-probed yet"
            )  # fmt: skip
            return f"not trusted: best of {passes} probes, {state}"
        return f"trusted: best of {passes} probes, re-probed {reprobes} time(s)"

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


def cache_path(
    cache_dir: Path,
    device_name: str,
    torch_version: str,
    quick: bool = False,
    threads: int | None = None,
) -> Path:
    """The cache file of one device, torch version and (CPU) thread count."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{device_name}-torch{torch_version}").strip("-").lower()
    per_threads = f"-{threads}t" if threads else ""
    return Path(cache_dir) / f"ceilings-{slug}{per_threads}{'-quick' if quick else ''}.json"


def measured_under_load(ceilings: Ceilings) -> str | None:
    """Why these CPU ceilings must not be cached or trusted (None: measured undisturbed)."""
    load = ceilings.details.get("load") or {}
    if not load.get("oversubscribed") or int(ceilings.details.get("reprobes") or 0) >= 1:
        return None  # quiet, or the best of two probes (best_of)
    return "; ".join(load.get("reasons") or []) or "the CPU was oversubscribed"


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
    and cached if absent; `progress` hears a line before a measurement starts.

    A corrupt or mismatched cache file is reported as a KernelproWarning and re-measured.
    CPU ceilings measured under load are returned but not cached: their
    `details["not_cached"]` says why. When valid CPU ceilings are cached and measured again
    (`refresh`, or provisional ones on a quiet machine), each ceiling keeps the best of both
    (`best_of`: load can only lower a probe) unless `replace_cached`.
    """
    import torch

    device_type, name, _ = resolve_device(device)
    threads = torch.get_num_threads() if device_type == "cpu" else None
    if device_type == "cpu":
        spec = None
    elif spec is None:
        spec = find_device_spec(name)
    path = cache_path(Path(cache_dir), name, torch.__version__, quick, threads)
    previous: Ceilings | None = None  # a valid cached CPU set: the new probe keeps its best
    if path.exists() and not (refresh and replace_cached):
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
            previous = cached if device_type == "cpu" else None
            busy = measured_under_load(cached)
            if refresh:
                pass  # re-measure; on the CPU the best of both is kept
            elif busy is None:
                return _merge_spec(cached, spec)
            elif threads is not None and not quiet_now(threads):
                note = (
                    f"provisional: measured under load on {cached.measured_at} ({busy}); "
                    "re-measured once the machine is quiet"
                )
                return replace(cached, details={**cached.details, "not_cached": note})
            # quiet now: fall through and measure them properly
        except (OSError, ValueError, KeyError, TypeError, KernelproError) as exc:
            warnings.warn(
                f"ignoring ceilings cache {path}: {exc}; re-measuring {name}",
                KernelproWarning,
                stacklevel=2,
            )
    if progress is not None:
        what = f"{threads} thread(s)" if threads else "copy bandwidth and GEMMs"
        progress(
            f"kernelpro: measuring the ceilings of {name} ({what}; once per machine, "
            f"cached in {path.parent})"
        )
    monitor = CpuLoadMonitor(threads) if threads else None
    ceilings = measure_ceilings(device, spec=spec, quick=quick)
    if monitor is not None:
        load = monitor.stop()
        details = {**ceilings.details, "load": load.to_dict()}
        ceilings = replace(ceilings, details=details)
    if previous is not None:
        ceilings, rose = best_of(previous, ceilings)
        history = [*(previous.details.get("reprobe_history") or []), {
            "at": ceilings.measured_at,
            "why": "kernelpro calibrate" if refresh else "re-measured on a quiet machine",
            "rose": rose,
        }]  # fmt: skip
        ceilings = replace(ceilings, details={**ceilings.details, "reprobe_history": history[-10:]})
    atomic_write_json(
        path, {"schema": CACHE_SCHEMA, "quick": quick, "ceilings": ceilings.to_dict()}
    )
    busy = measured_under_load(ceilings)
    if busy is not None:
        note = f"provisional: measured under load ({busy}); re-measured once the machine is quiet"
        ceilings = replace(ceilings, details={**ceilings.details, "not_cached": note})
    return ceilings


def quiet_now(threads: int, seconds: float = 0.2) -> bool:
    """True when the machine looks quiet enough to re-measure: the 1-minute load average is
    below the CPU count (a short look alone catches a lull between bursts: one re-measured
    ceilings at load 11 and got provisional ones again, 17 s later), and over the next
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


def format_rate(value: float, unit: str) -> str:
    """`value` with an SI prefix and three significant digits: 788e12, "FLOP/s" -> "788 TFLOP/s"."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


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
    details["first_measured_at"] = old.details.get("first_measured_at", old.measured_at)
    details.pop("not_cached", None)  # re-probed: the best of both is no longer provisional
    return replace(new, bandwidth_Bps=bandwidth, flops=flops, details=details), rose
