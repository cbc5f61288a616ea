"""The curated ncu metrics, grouped by category, and the check against a chip's catalog.

Names were checked against `ncu --query-metrics` of ncu 2025.3.1 on an H200 (gh100, see
tests/data/profile/) and against the raw page of a real capture. Two kinds exist:

- counters (`implicit=False`): passed to `--metrics`; a chip or ncu version whose
  `--query-metrics` lacks the base name drops them before the run (and reports them).
- launch and occupancy attributes (`implicit=True`): `launch__*` and
  `sm__maximum_warps_per_active_cycle_pct` are not in `--query-metrics` but ncu writes them
  on every raw page (the H200 capture has them although they were not requested), so they
  are never passed on the command line and never dropped; they are only reported missing
  when the raw page lacks them.

Stall reasons use `smsp__warp_issue_stalled_<r>_per_warp_active.pct` (% of active warp
cycles, what WarpStallTool-style thresholds read). The nvprof name "memory dependency" has
no ncu counterpart: it is `long_scoreboard`. Note for tools: on sm_90
`sm__inst_executed_pipe_tensor_op_hmma` also counts HFMA2.MMA moves and HGMMA (the capture
shows 131,072 on a CUDA-core matmul and equal hmma/gmma counts on a cuBLAS wgmma kernel);
subtract `..._hmma_type_hfma2` and `..._gmma` for true mma.sync counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CATEGORIES: tuple[str, ...] = (
    "sol",
    "memory",
    "occupancy",
    "launch",
    "scheduler",
    "stalls",
    "pipes",
    "instructions",
)


@dataclass(frozen=True)
class CatalogMetric:
    """One curated metric: its ncu name, category, a short label for reports, and base unit."""

    name: str
    category: str
    label: str
    unit: str
    implicit: bool = False  # written on every raw page; never passed to --metrics

    @property
    def base_name(self) -> str:
        return metric_base_name(self.name)


def _m(name: str, category: str, label: str, unit: str, implicit: bool = False) -> CatalogMetric:
    return CatalogMetric(name, category, label, unit, implicit)


_PCT_ELAPSED = "avg.pct_of_peak_sustained_elapsed"
_PCT_ACTIVE = "avg.pct_of_peak_sustained_active"

STALL_REASONS: tuple[str, ...] = (
    "long_scoreboard",
    "short_scoreboard",
    "barrier",
    "branch_resolving",
    "mio_throttle",
    "lg_throttle",
    "math_pipe_throttle",
    "wait",
    "not_selected",
    "no_instruction",
    "membar",
    "gmma",
    # The rest of ncu's stall reasons: the tools normalise by all stalled cycles
    # (100 - selected), so every reason must be collected for the shares to be right.
    "selected",
    "dispatch_stall",
    "drain",
    "imc_miss",
    "misc",
    "sleeping",
    "tex_throttle",
)


def stall_metric(reason: str) -> str:
    """The ncu name of stall `reason` as % of active warp cycles."""
    return f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct"


CURATED_METRICS: tuple[CatalogMetric, ...] = (
    # Speed of light: % of peak and time.
    _m("gpu__time_duration.sum", "sol", "Duration", "ns"),
    _m(f"sm__throughput.{_PCT_ELAPSED}", "sol", "Compute (SM) throughput", "%"),
    _m(f"gpu__compute_memory_throughput.{_PCT_ELAPSED}", "sol", "Memory throughput", "%"),
    _m(f"dram__throughput.{_PCT_ELAPSED}", "sol", "DRAM throughput", "%"),
    _m("l1tex__throughput.avg.pct_of_peak_sustained_active", "sol", "L1/TEX throughput", "%"),
    _m(f"lts__throughput.{_PCT_ELAPSED}", "sol", "L2 throughput", "%"),
    _m("sm__cycles_active.avg", "sol", "SM active cycles", "cycle"),
    # Memory: bytes, hit rates, coalescing, shared-memory conflicts, local memory.
    _m("dram__bytes_read.sum", "memory", "DRAM bytes read", "byte"),
    _m("dram__bytes_write.sum", "memory", "DRAM bytes written", "byte"),
    _m("l1tex__t_sector_hit_rate.pct", "memory", "L1 hit rate", "%"),
    _m("lts__t_sector_hit_rate.pct", "memory", "L2 hit rate", "%"),
    _m("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "memory", "Global load sectors", "sector"),
    _m("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "memory", "Global load requests", ""),
    _m(
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "memory", "Global store sectors", "sector"
    ),
    _m("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "memory", "Global store requests", ""),
    _m(
        "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio",
        "memory",
        "Sectors per global load request",
        "sector",
    ),
    _m(
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "memory",
        "Shared load bank conflicts",
        "",
    ),
    _m(
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "memory",
        "Shared store bank conflicts",
        "",
    ),
    _m(
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
        "memory",
        "Shared load wavefronts",
        "",
    ),
    _m(
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        "memory",
        "Shared store wavefronts",
        "",
    ),
    _m("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "memory", "Local load sectors", "sector"),
    _m("l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum", "memory", "Local store sectors", "sector"),
    _m("smsp__sass_inst_executed_op_local_ld.sum", "memory", "Local load instructions", "inst"),
    _m("smsp__sass_inst_executed_op_local_st.sum", "memory", "Local store instructions", "inst"),
    # Occupancy: achieved, theoretical, limiters (blocks per SM).
    _m(f"sm__warps_active.{_PCT_ACTIVE}", "occupancy", "Achieved occupancy", "%"),
    _m("sm__maximum_warps_per_active_cycle_pct", "occupancy", "Theoretical occupancy", "%", True),
    _m("launch__occupancy_limit_registers", "occupancy", "Block limit (registers)", "block", True),
    _m(
        "launch__occupancy_limit_shared_mem", "occupancy", "Block limit (shared mem)", "block", True
    ),
    _m("launch__occupancy_limit_warps", "occupancy", "Block limit (warps)", "block", True),
    _m("launch__occupancy_limit_blocks", "occupancy", "Block limit (blocks)", "block", True),
    _m("launch__occupancy_limit_barriers", "occupancy", "Block limit (barriers)", "block", True),
    # Launch configuration.
    _m("launch__grid_size", "launch", "Grid size", "", True),
    _m("launch__block_size", "launch", "Block size", "", True),
    _m("launch__registers_per_thread", "launch", "Registers per thread", "register/thread", True),
    _m("launch__shared_mem_per_block_static", "launch", "Static shared mem", "byte/block", True),
    _m("launch__shared_mem_per_block_dynamic", "launch", "Dynamic shared mem", "byte/block", True),
    _m("launch__shared_mem_per_block", "launch", "Shared mem per block", "byte/block", True),
    _m("launch__waves_per_multiprocessor", "launch", "Waves per SM", "", True),
    _m("launch__sm_count", "launch", "SMs", "SM", True),
    # Scheduler.
    _m(f"smsp__issue_active.{_PCT_ACTIVE}", "scheduler", "Issue slots busy", "%"),
    _m("smsp__warps_eligible.avg.per_cycle_active", "scheduler", "Eligible warps/cycle", "warp"),
    # Warp stalls, % of active warp cycles.
    *(_m(stall_metric(r), "stalls", f"Stall {r.replace('_', ' ')}", "%") for r in STALL_REASONS),
    # Pipe utilization, % of peak while the SM is active.
    _m(f"sm__pipe_fma_cycles_active.{_PCT_ACTIVE}", "pipes", "FMA pipe", "%"),
    _m(f"sm__pipe_alu_cycles_active.{_PCT_ACTIVE}", "pipes", "ALU pipe", "%"),
    _m(f"sm__pipe_fp64_cycles_active.{_PCT_ACTIVE}", "pipes", "FP64 pipe", "%"),
    _m(f"sm__pipe_shared_cycles_active.{_PCT_ACTIVE}", "pipes", "Shared pipe", "%"),
    _m(f"sm__pipe_tensor_op_hmma_cycles_active.{_PCT_ACTIVE}", "pipes", "Tensor pipe (HMMA)", "%"),
    _m(
        f"sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.{_PCT_ACTIVE}",
        "pipes",
        "Tensor pipe (HMMA+HGMMA+QGMMA)",
        "%",
    ),
    _m(f"sm__pipe_tensor_op_dmma_cycles_active.{_PCT_ACTIVE}", "pipes", "Tensor pipe (DMMA)", "%"),
    _m(f"sm__pipe_tma_cycles_active.{_PCT_ACTIVE}", "pipes", "TMA pipe", "%"),
    _m(f"sm__inst_executed_pipe_lsu.{_PCT_ACTIVE}", "pipes", "LSU pipe", "%"),
    # Instructions and FLOP counts.
    _m("smsp__inst_executed.sum", "instructions", "Warp instructions", "inst"),
    _m("sm__inst_executed.avg.per_cycle_active", "instructions", "IPC (per SM)", "inst/cycle"),
    _m(
        "smsp__thread_inst_executed_per_inst_executed.ratio",
        "instructions",
        "Active threads per instruction",
        "",
    ),
    _m("sm__inst_executed_pipe_tensor_op_hmma.sum", "instructions", "Tensor HMMA inst", "inst"),
    _m(
        "sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum",
        "instructions",
        "HFMA2.MMA inst (not MMA)",
        "inst",
    ),
    _m("sm__inst_executed_pipe_tensor_op_gmma.sum", "instructions", "Tensor wgmma inst", "inst"),
    *(
        _m(
            f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum",
            "instructions",
            f"{op.upper()} thread inst",
            "inst",
        )
        for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma", "hadd", "hmul", "hfma")
    ),
)

METRICS_BY_NAME: Mapping[str, CatalogMetric] = {m.name: m for m in CURATED_METRICS}


def metric_base_name(name: str) -> str:
    """The `--query-metrics` base of a full name: `dram__bytes_read.sum` -> `dram__bytes_read`."""
    return name.split(".", 1)[0]


def metrics_by_category(
    metrics: Iterable[CatalogMetric] = CURATED_METRICS,
) -> dict[str, list[CatalogMetric]]:
    """Group metrics by category in `CATEGORIES` order."""
    groups: dict[str, list[CatalogMetric]] = {c: [] for c in CATEGORIES}
    for metric in metrics:
        groups.setdefault(metric.category, []).append(metric)
    return {c: ms for c, ms in groups.items() if ms}


def requested_metric_names(metrics: Iterable[CatalogMetric] = CURATED_METRICS) -> list[str]:
    """The names passed to `--metrics`: every counter, no implicit attribute."""
    return [m.name for m in metrics if not m.implicit]


_QUERY_LINE = re.compile(r"^([a-z][a-z0-9_]*__[a-z0-9_]+)\s+(Counter|Ratio|Throughput)\b")


def parse_query_metrics(text: str) -> frozenset[str]:
    """Base metric names from `ncu --query-metrics` output (chip-wide table, one per line).

    Configuration-qualified names ("CTC.TriageCompute.ctc__rx_bytes") are skipped: they are
    not collectable under their bare name.
    """
    names = set()
    for line in text.splitlines():
        match = _QUERY_LINE.match(line)
        if match:
            names.add(match.group(1))
    return frozenset(names)


def drop_unavailable(names: Iterable[str], catalog: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split metric names into (kept, dropped) against the base names in `catalog`: implicit
    attributes are always kept (the catalog never lists them); names not in the curated set
    are counters."""
    available = frozenset(catalog)
    kept: list[str] = []
    dropped: list[str] = []
    for name in names:
        known = METRICS_BY_NAME.get(name)
        if (known is not None and known.implicit) or metric_base_name(name) in available:
            kept.append(name)
        else:
            dropped.append(name)
    return kept, dropped
