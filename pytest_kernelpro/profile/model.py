"""The measured profile of one kernel item: the contract between profilers and tools.

Parsers in this package (ncu, sass, ptxas, timeline, linkage) fill these objects; the
micro-profiling tools in `pytest_kernelpro.tools` read them by name and never parse text.
Every field may be missing: a profiler that was absent or refused leaves `None` and adds a
`NotCollected` entry that says why.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MetricValue:
    """One ncu metric in base units (bytes, ns, %, counts), as read from the raw CSV page."""

    name: str
    value: float | str
    unit: str = ""


@dataclass
class KernelMetrics:
    """All ncu metrics of one kernel launch (the first profiled launch of one function)."""

    kernel_name: str
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    # Metrics that were requested but that this chip or ncu version does not have.
    missing: tuple[str, ...] = ()
    block_size: tuple[int, int, int] | None = None
    grid_size: tuple[int, int, int] | None = None

    def get(self, name: str, default: float | None = None) -> float | None:
        """The numeric value of `name`, or `default` when absent or not a number."""
        entry = self.metrics.get(name)
        if entry is None or isinstance(entry.value, str):
            return default
        return float(entry.value)

    def text(self, name: str) -> str | None:
        entry = self.metrics.get(name)
        return None if entry is None else str(entry.value)

    def __contains__(self, name: object) -> bool:
        return name in self.metrics

    def __iter__(self) -> Iterator[str]:
        return iter(self.metrics)


@dataclass(frozen=True)
class SassSummary:
    """Instruction counts of one kernel function's SASS (static counts, not executed)."""

    function: str  # demangled name
    mangled: str
    counts: Mapping[str, int]  # instruction class -> count, e.g. {"HGMMA": 12, "LDL": 3}
    total_instructions: int
    global_load_widths: Mapping[int, int] = field(default_factory=dict)  # bits -> count
    global_store_widths: Mapping[int, int] = field(default_factory=dict)

    def count(self, cls: str) -> int:
        return int(self.counts.get(cls, 0))


@dataclass(frozen=True)
class PtxasReport:
    """`ptxas -v` resources of one function."""

    function: str  # mangled name as ptxas prints it
    arch: str
    registers: int
    shared_bytes: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    constant_bytes: int = 0


@dataclass(frozen=True)
class TimelineGap:
    start_us: float
    duration_us: float
    before_kernel: str


@dataclass(frozen=True)
class TimelineSummary:
    source: str  # "nsys" or "kineto"
    kernel_count: int
    end_to_end_us: float
    kernel_time_us: float
    launch_overhead_share: float  # 0..1 of end-to-end not covered by kernels
    sync_calls: int
    gaps: tuple[TimelineGap, ...] = ()
    gap_threshold_us: float = 5.0
    kernel_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class LibraryLinkage:
    """Which vendor libraries a compiled module links to (`nm -D` / `readelf -d`)."""

    cublas: bool = False
    cublaslt: bool = False
    cudnn: bool = False
    libraries: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotCollected:
    what: str  # "ncu", "sass", "timeline", "ptxas", ...
    why: str  # e.g. "ncu not found on PATH; install Nsight Compute or set KERNELPRO_NCU"


@dataclass
class KernelProfile:
    """Everything measured about one `__global__` function."""

    name: str
    metrics: KernelMetrics | None = None
    sass: SassSummary | None = None
    ptxas: PtxasReport | None = None
    # The binary the SASS was read from when it is not a captured module (a Triton cubin).
    sass_source: str | None = None


@dataclass
class ProfileReport:
    """The profile of one kernel item: its own kernels plus module-wide facts."""

    arch: str | None = None  # e.g. "sm_90"
    kernels: list[KernelProfile] = field(default_factory=list)
    timeline: TimelineSummary | None = None
    linkage: LibraryLinkage | None = None
    not_collected: list[NotCollected] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileReport:
        """The report from its `to_dict()` form (a JSON record's `profile`)."""
        kernels = []
        for k in data.get("kernels") or ():
            m = k.get("metrics")
            metrics = None
            if m is not None:
                metrics = KernelMetrics(
                    m["kernel_name"],
                    {
                        n: MetricValue(v["name"], v["value"], v.get("unit", ""))
                        for n, v in m["metrics"].items()
                    },
                    tuple(m.get("missing") or ()),
                    tuple(m["block_size"]) if m.get("block_size") else None,
                    tuple(m["grid_size"]) if m.get("grid_size") else None,
                )
            s = k.get("sass")
            sass = None
            if s is not None:
                sass = SassSummary(
                    function=s["function"],
                    mangled=s["mangled"],
                    counts=dict(s["counts"]),
                    total_instructions=s["total_instructions"],
                    global_load_widths={
                        int(b): n for b, n in (s.get("global_load_widths") or {}).items()
                    },
                    global_store_widths={
                        int(b): n for b, n in (s.get("global_store_widths") or {}).items()
                    },
                )
            p = k.get("ptxas")
            kernels.append(
                KernelProfile(
                    k["name"],
                    metrics,
                    sass,
                    PtxasReport(**p) if p else None,
                    sass_source=k.get("sass_source"),
                )
            )
        tl = data.get("timeline")
        timeline = None
        if tl is not None:
            timeline = TimelineSummary(
                **{
                    **tl,
                    "gaps": tuple(TimelineGap(**g) for g in tl.get("gaps") or ()),
                    "kernel_names": tuple(tl.get("kernel_names") or ()),
                }
            )
        lk = data.get("linkage")
        linkage = (
            LibraryLinkage(**{**lk, "libraries": tuple(lk.get("libraries") or ())}) if lk else None
        )
        return cls(
            arch=data.get("arch"),
            kernels=kernels,
            timeline=timeline,
            linkage=linkage,
            not_collected=[NotCollected(**n) for n in data.get("not_collected") or ()],
            wall_s=float(data.get("wall_s") or 0.0),
        )
