"""The ceilings of this machine: copy bandwidth and library-GEMM FLOP/s per dtype
(`Ceilings`), their cache, and the trust rule that says which of them bound a kernel.

The roofline divides by these, not by datasheet rates (leads no real kernel reaches).
Measured once per machine and torch version (`measure/ceiling_probe.py`, with the rules of
load), cached as JSON outside the project (`default_cache_dir`: one cache per machine and
user; CPU ceilings per thread count); `kernelpro calibrate` re-measures. A session whose
cache holds usable ceilings reads them here (`cached_ceilings`) and never imports the probe.

`Ceilings.trusted` (the only ceilings the impossible-time rule may use): a GPU's
(device-timed, or the datasheet's); on the CPU the best of repeated probes of which at least
one ran on a quiet machine (`quiet_probes`): probes under load never are, however many agree.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.flops import TF32X3_KEY, TF32X3_MMAS

if TYPE_CHECKING:  # the GPU device table: imported where a CUDA device is looked up
    from pytest_kernelpro.measure.devices import DeviceSpec

CACHE_SCHEMA = 1
CACHE_DIR_ENV = "KERNELPRO_CACHE_DIR"  # the ceilings cache's folder, used as it is


def machine_identity() -> str:
    """A short, stable name of this machine: its host name and a hash of its machine id
    (systemd's /etc/machine-id, else the host name), CPU model and CPU count. The ceilings
    belong to the hardware, so a home folder shared by several machines (NFS) keeps one
    cache per machine instead of one machine's numbers for all of them."""
    import hashlib

    node = platform.node() or "host"
    ident = node
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text:
            ident = text
            break
    from pytest_kernelpro.measure.timing.cpu_load import cpu_model_name

    digest = hashlib.sha256(f"{ident}|{cpu_model_name()}|{os.cpu_count()}".encode()).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", node).strip("-").lower()[:40] or "host"
    return f"{slug}-{digest[:12]}"


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where measured ceilings are cached: $KERNELPRO_CACHE_DIR when set, else
    $XDG_CACHE_HOME (default ~/.cache)/pytest-kernelpro/<machine_identity()>: outside the
    project, as the probe (seconds, tens under load) measures the machine, not the checkout."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or ""
    root = Path(base).expanduser() if Path(base).is_absolute() else Path.home() / ".cache"
    return root / "pytest-kernelpro" / machine_identity()


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
        beyond the machine (module docstring)."""
        return self.trust_reason().startswith("trusted")

    def trust_reason(self) -> str:
        """ "trusted: ..." or "not trusted: ..." with why, for messages."""
        if self.device_type == "cuda":
            return "trusted: GPU ceilings (device-timed, or the datasheet's upper bound)"
        passes = int(self.details.get("probe_passes") or 1)
        quiet = int(self.details.get("quiet_probes") or 0)
        if passes < 2:
            return (
                "not trusted: one probe (measured by an older version); `kernelpro calibrate` "
                "re-measures them"
            )
        if quiet < 1:
            state = "provisional, measured under load" if self.details.get("not_cached") else (
                "none on a quiet machine (load only lowers a probe)"
            )  # fmt: skip
            return f"not trusted: best of {passes} probes, {state}"
        reprobes = int(self.details.get("reprobes") or 0)
        again = f", re-probed {reprobes} time(s)" if reprobes else ""
        return f"trusted: best of {passes} probes, {quiet} on a quiet machine{again}"

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


def merge_spec(ceilings: Ceilings, spec: DeviceSpec | None) -> Ceilings:
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


def read_cached(path: Path, name: str, torch_version: str) -> Ceilings:
    """The ceilings cached in `path` for device `name` and `torch_version`; a KernelproError
    names what is wrong with a file of another schema, device or torch version."""
    record = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(record, dict) or record.get("schema") != CACHE_SCHEMA:
        raise KernelproError(
            f"schema {record.get('schema') if isinstance(record, dict) else None!r} != {CACHE_SCHEMA}"
        )
    cached = Ceilings.from_dict(record["ceilings"])
    if cached.device != name or cached.torch_version != torch_version:
        raise KernelproError(
            f"it holds {cached.device!r} / torch {cached.torch_version}, "
            f"not {name!r} / torch {torch_version}"
        )
    return cached


@dataclass(frozen=True)
class CacheTarget:
    """Whose ceilings a cache file holds: the device's name, type and (CPU) thread count, the
    datasheet that fills what is not measured (None on the CPU), and the file."""

    device_type: str
    name: str
    threads: int | None
    spec: DeviceSpec | None
    path: Path


def cache_target(
    device: str, cache_dir: Path, spec: DeviceSpec | None = None, quick: bool = False
) -> CacheTarget:
    """The cache file of `device` ("cpu", "cuda", "cuda:N") for this torch version."""
    import torch

    device_type, name, _ = resolve_device(device)
    threads = torch.get_num_threads() if device_type == "cpu" else None
    if device_type == "cpu":
        spec = None  # GPU datasheets say nothing about a CPU
    elif spec is None:
        from pytest_kernelpro.measure.devices import find_device_spec

        spec = find_device_spec(name)
    path = cache_path(Path(cache_dir), name, torch.__version__, quick, threads)
    return CacheTarget(device_type, name, threads, spec, path)


def cached_ceilings(
    device: str, cache_dir: Path, *, spec: DeviceSpec | None = None
) -> Ceilings | None:
    """The cached ceilings of `device` when they can be used as they are (a valid file,
    measured undisturbed), with today's datasheet fill-ins; None when they must be measured,
    which `ceiling_probe.load_or_measure_ceilings` does (and warns of a bad file)."""
    import torch

    target = cache_target(device, cache_dir, spec)
    try:
        cached = read_cached(target.path, target.name, torch.__version__)
    except (OSError, ValueError, KeyError, TypeError, KernelproError):
        return None
    return merge_spec(cached, target.spec) if measured_under_load(cached) is None else None


def format_rate(value: float, unit: str) -> str:
    """`value` with an SI prefix and three significant digits: 788e12, "FLOP/s" -> "788 TFLOP/s"."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


# ===================================================== the rate that stands for a peak key

# When a key is not in the ceilings, the next one that is stands in (noted in the analysis).
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp64": ("fp64_tensor", "fp32"),
    "fp64_tensor": ("fp64", "fp32"),
    "tf32_tensor": ("fp32",),
    TF32X3_KEY: ("fp32",),
    "fp16_tensor": ("bf16_tensor", "fp16", "bf16", "tf32_tensor", "fp32"),
    "bf16_tensor": ("fp16_tensor", "bf16", "fp16", "tf32_tensor", "fp32"),
    "fp8_tensor": ("int8_tensor", "bf16_tensor", "fp16_tensor", "bf16", "fp32"),
    "int8_tensor": ("fp8_tensor", "bf16_tensor", "fp16_tensor", "bf16", "fp32"),
    "fp16": ("bf16", "fp32"),
    "bf16": ("fp16", "fp32"),
    "fp32": ("tf32_tensor", "fp64"),
}
_LABELS = {
    "fp64": "FP64 CUDA core",
    "fp64_tensor": "FP64 tensor core (DMMA)",
    "fp32": "FP32 CUDA core",
    "tf32_tensor": "TF32 tensor core",
    TF32X3_KEY: "3xTF32 tensor core (fp32 as three TF32 MMAs)",
    "bf16_tensor": "BF16 tensor core",
    "fp16_tensor": "FP16 tensor core",
    "fp8_tensor": "FP8 tensor core",
    "int8_tensor": "INT8 tensor core",
}


def peak_label(key: str, device_type: str) -> str:
    """Human name of a peak key: "tf32_tensor" -> "TF32 tensor core"."""
    if device_type != "cuda":
        return f"CPU {key.upper()} (torch.matmul rate)"
    return _LABELS.get(key, key)


def resolve_peak(ceilings: Ceilings, key: str) -> tuple[str, float, str | None]:
    """(key used, FLOP/s, note) for `key`, falling back along _FALLBACK when it is missing."""
    if key in ceilings.flops:
        return key, ceilings.flops[key], None
    if key == TF32X3_KEY and "tf32_tensor" in ceilings.flops:
        return key, ceilings.flops["tf32_tensor"] / TF32X3_MMAS, None
    for other in _FALLBACK.get(key, ("fp32",)):
        if other in ceilings.flops:
            note = (
                f"no {key!r} ceiling for {ceilings.device}; used {other!r} "
                f"({format_rate(ceilings.flops[other], 'FLOP/s')}) instead"
            )
            return other, ceilings.flops[other], note
    raise KernelproError(
        f"ceilings of {ceilings.device} have no {key!r} rate nor a stand-in "
        f"(have {sorted(ceilings.flops)}); run `kernelpro calibrate` or add a device spec"
    )


def peak_origin(ceilings: Ceilings, key: str) -> str:
    if key == TF32X3_KEY:
        return f"{ceilings.origin('tf32_tensor')} TF32 rate / {TF32X3_MMAS} ="
    return ceilings.origin(key)


def peak_name(
    per_key: Mapping[str, float],
    rates: Mapping[str, tuple[float, str]],
    peak: float,
    device_type: str,
) -> str:
    def one(key: str) -> str:
        rate, origin = rates[key]
        return f"{peak_label(key, device_type)} ({origin} {format_rate(rate, 'FLOP/s')})"

    if len(per_key) == 1:
        return one(next(iter(per_key)))
    total = sum(per_key.values())
    parts = sorted(per_key, key=lambda k: -per_key[k])
    shares = ", ".join(f"{per_key[k] / total:.0%} on {one(k)}" for k in parts)
    return f"mixed, effective {format_rate(peak, 'FLOP/s')}: {shares}"


def resolve_device(device: str) -> tuple[str, str, int]:
    """(device_type, display name, cuda index) for "cpu", "cuda" or "cuda:N"."""
    import torch

    from pytest_kernelpro.measure.timing.cpu_load import cpu_model_name

    text = device.strip().lower()
    if text == "cpu":
        return "cpu", f"cpu ({cpu_model_name()})", -1
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


def exceeds_every_ceiling(peak_used: Any) -> bool:
    """True when a record's pricing (`roofline.record_pricing`'s peak_used) found its rate
    above every ceiling."""
    return isinstance(peak_used, dict) and bool(peak_used.get("problem"))
