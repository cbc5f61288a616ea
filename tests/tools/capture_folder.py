"""Run the tools on saved profiler output: a capture folder instead of a live profile (for
the tests and `bench/tools_table.py`; the plugin itself always profiles live).

A capture folder holds `ncu_raw.csv` (`ncu --csv --page raw`) and optionally `sass.txt`
(`cuobjdump --dump-sass`), `ptxas.txt` or `run.log` (a build log with `-Xptxas=-v`),
`symbols.txt` (`cuobjdump -symbols`, `nm -D`, `ldd` sections), `ncu_full_details.txt`
(`ncu --page details --print-details all`, for Nsight Compute's own rule messages) and
`kernels.yaml` (per-kernel roofline facts: op, theoretical class, minimal bytes). Parsing is
done by `pytest_kernelpro.profile`; this module only joins the pieces per kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.profile.model import (
    KernelMetrics,
    KernelProfile,
    LibraryLinkage,
    ProfileReport,
    PtxasReport,
    SassSummary,
)


@dataclass
class OfflineKernel:
    """One kernel of a capture folder: its single-kernel profile and its roofline facts."""

    report: ProfileReport
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.report.kernels[0].name

    @property
    def base_name(self) -> str:
        from pytest_kernelpro.profile.symbols import kernel_base_name

        return kernel_base_name(self.name)


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def _section(text: str, title: str) -> str:
    """The lines of `text` between '== title' and the next '== ' line."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("== "):
            inside = line[3:].strip().startswith(title)
            continue
        if inside:
            out.append(line)
    return "\n".join(out)


def linkage_from_symbols(text: str) -> LibraryLinkage:
    """cuBLAS/cuDNN linkage from a symbols.txt with '== nm -D' and '== ldd' sections."""
    from pytest_kernelpro.profile.linkage import classify_linkage, parse_nm_undefined

    undefined = parse_nm_undefined(_section(text, "nm -D"))
    needed = [
        line.split("=>", 1)[0].strip()
        for line in _section(text, "ldd").splitlines()
        if "=>" in line
    ]
    return classify_linkage(needed, undefined)


def load_meta(path: Path) -> dict[str, dict[str, Any]]:
    """kernels.yaml: kernel base name -> {op, theoretical, min_bytes, flops, dtype, label}."""
    import yaml

    text = _read(path)
    if text is None:
        return {}
    data = yaml.safe_load(text) or {}
    kernels = data.get("kernels", data)
    if not isinstance(kernels, dict):
        raise KernelproError(f"{path}: expected a mapping of kernel names under 'kernels'")
    return {str(k): dict(v or {}) for k, v in kernels.items()}


def load_capture_dir(folder: str | Path, csv_name: str = "ncu_raw.csv") -> list[OfflineKernel]:
    """Every kernel (first profiled launch per name) of a capture folder, in launch order."""
    from pytest_kernelpro.profile.ncu_csv import first_launch_per_kernel, parse_ncu_raw_csv
    from pytest_kernelpro.profile.ptxas import parse_ptxas_output
    from pytest_kernelpro.profile.sass import parse_sass, summarize_sass
    from pytest_kernelpro.profile.symbols import kernel_base_name

    root = Path(folder)
    csv_text = _read(root / csv_name)
    if csv_text is None:
        raise KernelproError(f"No {csv_name} in {root}: pass a folder with an ncu raw CSV")
    kernels: dict[str, KernelMetrics] = first_launch_per_kernel(parse_ncu_raw_csv(csv_text))
    sass_by_base: dict[str, SassSummary] = {}
    sass_arch: dict[str, str] = {}
    sass_text = _read(root / "sass.txt")
    if sass_text:
        for fn in parse_sass(sass_text):
            sass_arch[kernel_base_name(fn.mangled)] = fn.arch or ""
        for mangled, summary in summarize_sass(sass_text).items():
            sass_by_base[kernel_base_name(mangled)] = summary
    ptxas_by_base: dict[str, PtxasReport] = {}
    for log_name in ("ptxas.txt", "run.log"):
        log = _read(root / log_name)
        if log:
            for rep in parse_ptxas_output(log):
                ptxas_by_base[kernel_base_name(rep.function)] = rep
            break
    symbols = _read(root / "symbols.txt")
    linkage = linkage_from_symbols(symbols) if symbols else None
    meta = load_meta(root / "kernels.yaml")
    out: list[OfflineKernel] = []
    for name, metrics in kernels.items():
        base = kernel_base_name(name)
        sass = sass_by_base.get(base)
        arch = sass_arch.get(base) if sass is not None else None
        if not arch:
            major = metrics.get("device__attribute_compute_capability_major")
            minor = metrics.get("device__attribute_compute_capability_minor")
            arch = None if major is None or minor is None else f"sm_{int(major)}{int(minor)}"
        profile = KernelProfile(
            name=name, metrics=metrics, sass=sass, ptxas=ptxas_by_base.get(base)
        )
        # Module linkage only describes kernels compiled into that module (those with SASS).
        report = ProfileReport(arch=arch, kernels=[profile], linkage=linkage if sass else None)
        out.append(OfflineKernel(report, meta.get(base, {})))
    return out


# --- Nsight Compute's own rule messages (ncu --page details) ---------------------------------

_KERNEL_LINE = re.compile(r"^  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context")
_SECTION_LINE = re.compile(r"^    Section: (.*)")
_RULE_LINE = re.compile(r"^    (OPT|INF|WRN)\s+(.*)")
_SPEEDUP = re.compile(r"^Est\. (?:Local )?Speedup: ([0-9.]+)%\s*")

# (section prefix, message pattern) -> rule id of the 2025.3 sections/ folder.
RULE_IDS: tuple[tuple[str, str, str], ...] = (
    ("GPU Speed Of Light Throughput", r"grid is too small", "SOLBottleneck (small grid)"),
    ("GPU Speed Of Light Throughput", r"more heavily utilized", "SOLBottleneck (memory/compute)"),
    ("GPU Speed Of Light Throughput", r"greater than 80", "SOLBottleneck (high throughput)"),
    ("GPU Speed Of Light Throughput", r"latency", "SOLBottleneck (latency)"),
    ("GPU Speed Of Light Roofline", r"", "SOLFPRoofline"),
    ("Compute Workload Analysis", r"under-utilized|highest-utilized", "HighPipeUtilization"),
    ("Compute Workload Analysis", r"", "SlowPipeLimiter"),
    ("Memory Workload Analysis Chart", r"Compression", "MemoryL2Compression"),
    ("Memory Workload Analysis Chart", r"", "MemoryApertureUsage"),
    ("Memory Workload Analysis Tables", r"bank", "SharedMemoryConflicts"),
    (
        "Memory Workload Analysis Tables",
        r"access pattern for global",
        "MemoryCacheAccessPattern (global)",
    ),
    (
        "Memory Workload Analysis Tables",
        r"access pattern for local",
        "MemoryCacheAccessPattern (local)",
    ),
    ("Memory Workload Analysis Tables", r"", "MemoryCacheAccessPattern"),
    ("Scheduler Statistics", r"", "IssueSlotUtilization"),
    ("Warp State Statistics", r"Warp Stall Sampling", "PCSamplingData"),
    ("Warp State Statistics", r"", "CPIStall"),
    ("Instruction Statistics", r"fused", "FPInstructions"),
    ("Launch Statistics", r"partial wave|tail effect", "LaunchConfiguration (tail effect)"),
    ("Launch Statistics", r"multiprocessors|too small", "LaunchConfiguration (small grid)"),
    ("Launch Statistics", r"", "LaunchConfiguration"),
    ("Occupancy", r"measured achieved occupancy", "AchievedOccupancy"),
    ("Occupancy", r"", "TheoreticalOccupancy"),
    ("GPU and Memory Workload Distribution", r"", "WorkloadImbalance"),
    ("Source Counters", r"uncoalesced global", "UncoalescedGlobalAccess"),
    ("Source Counters", r"uncoalesced shared", "UncoalescedSharedAccess"),
    ("Source Counters", r"", "SourceCounters"),
)


@dataclass(frozen=True)
class NcuRuleMessage:
    kernel: str
    section: str
    kind: str  # OPT | INF | WRN
    rule: str
    message: str
    speedup_pct: float | None


def _rule_id(section: str, message: str) -> str:
    for prefix, pattern, rule in RULE_IDS:
        if section.startswith(prefix) and re.search(pattern, message, re.IGNORECASE):
            return rule
    return section


def parse_ncu_rule_messages(text: str) -> list[NcuRuleMessage]:
    """Nsight Compute's rule outputs (OPT/INF/WRN blocks) per kernel from a details page."""
    out: list[NcuRuleMessage] = []
    kernel = section = ""
    current: list[str] | None = None

    def flush() -> None:
        if current is None:
            return
        kind, body = current[0], " ".join(current[1:]).strip()
        speedup = None
        match = _SPEEDUP.match(body)
        if match:
            speedup = float(match.group(1))
            body = body[match.end() :]
        out.append(NcuRuleMessage(kernel, section, kind, _rule_id(section, body), body, speedup))

    for line in text.splitlines():
        match = _KERNEL_LINE.match(line)
        if match:
            flush()
            current = None
            kernel = match.group(1)
            continue
        match = _SECTION_LINE.match(line)
        if match:
            flush()
            current = None
            section = match.group(1).strip()
            continue
        match = _RULE_LINE.match(line)
        if match:
            flush()
            current = [match.group(1), match.group(2).strip()]
            continue
        if current is not None and line.startswith("          ") and line.strip():
            current.append(line.strip())
            continue
        flush()
        current = None
    flush()
    return out


def theoretical_class(meta: dict[str, Any], device_name: str | None) -> tuple[str | None, str]:
    """The roofline class of a kernel from its kernels.yaml facts, and how it was obtained.

    An explicit `theoretical:` wins; otherwise FLOPs / minimal bytes against the ridge point
    of the named peak (`peak: fp32`, `bf16_tensor`, ...) and the DRAM bandwidth of the
    device in `pytest_kernelpro.measure.devices` (datasheet values).
    """
    if meta.get("theoretical"):
        return str(meta["theoretical"]), "kernels.yaml"
    flops, nbytes, peak = meta.get("flops"), meta.get("min_bytes"), meta.get("peak")
    if not (flops and nbytes and peak and device_name):
        return None, "no roofline facts"
    from pytest_kernelpro.measure.devices import find_device_spec
    from pytest_kernelpro.measure.roofline import classify_bound

    spec = find_device_spec(device_name)
    if spec is None or peak not in spec.peak_flops:
        return None, f"no {peak} peak for {device_name!r} in the device table"
    ridge = spec.peak_flops[peak] / spec.dram_bandwidth_Bps
    intensity = float(flops) / float(nbytes)
    cls = classify_bound(intensity, ridge)
    return cls, f"CI {intensity:.3g} FLOP/B vs {peak} ridge {ridge:.3g} ({spec.name} datasheet)"
