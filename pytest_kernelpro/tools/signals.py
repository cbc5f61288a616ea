"""ncu metric names (checked against the H200 capture in the fixtures) and the derived signals
several tools share: warp-stall shares, pipe utilization, saturation, occupancy limiters.

Warp-stall shares. ncu reports stall reasons in three proportional families: the % of active
warp-cycles spent in each state (`smsp__warp_issue_stalled_<r>_per_warp_active.pct`, which sums
to ~100% over all reasons including `selected`), cycles per issued instruction
(`smsp__average_warps_issue_stalled_<r>_per_issue_active.ratio`) and an aggregate latency
(`smsp__average_warp_latency_issue_stalled_<r>.ratio`). All three count the same stalled
warp-cycles with a different denominator, so the *share* of a reason is identical whichever
family is present (on the H200 capture the three agree to within rounding). We define

    share(r) = value(r) / sum(value(s) for every reason s except "selected") * 100

i.e. the % of stalled (not-issuing) warp-cycles spent on reason r. For the first family the
denominator is computed as 100 - selected (the states sum to 100%), which stays right when only
some reasons were collected; without `selected` it falls back to 100, the paper's "% of active
cycles stalled on r". `selected` is the cycle in
which the warp issues, not a stall; `not_selected` (eligible but another warp won) stays in the
denominator, so a kernel with plenty of eligible warps shows smaller problem shares.
(PC-sampling counts, `smsp__pcsamp_warps_issue_stalled_<r>`, are per-PC source counters, not
in `ncu --query-metrics` for the raw page, so they are not used.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kernelpro.profile.metrics_catalog import STALL_REASONS as CATALOG_STALL_REASONS
from pytest_kernelpro.tools.contract import MetricRequest

if TYPE_CHECKING:
    from pytest_kernelpro.tools.contract import ToolContext

# Speed of light and time.
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_THROUGHPUT_ALT = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
DURATION = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
L2_HIT = "lts__t_sector_hit_rate.pct"

# ncu's time units (`--print-units base` writes ns; older pages spell them out) in seconds.
SECONDS_PER_UNIT = {
    "ns": 1e-9,
    "nsecond": 1e-9,
    "us": 1e-6,
    "usecond": 1e-6,
    "ms": 1e-3,
    "msecond": 1e-3,
    "s": 1.0,
    "second": 1.0,
}

# Launch and occupancy.
GRID_SIZE = "launch__grid_size"
BLOCK_SIZE = "launch__block_size"
WAVES = "launch__waves_per_multiprocessor"
REGISTERS = "launch__registers_per_thread"
SHARED_PER_BLOCK = "launch__shared_mem_per_block"
THEORETICAL_OCC = "sm__maximum_warps_per_active_cycle_pct"
ACHIEVED_OCC = "sm__warps_active.avg.pct_of_peak_sustained_active"
ELIGIBLE_WARPS = "smsp__warps_eligible.avg.per_cycle_active"
ISSUE_ACTIVE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
OCC_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared memory": "launch__occupancy_limit_shared_mem",
    "warps (block size)": "launch__occupancy_limit_warps",
    "blocks per SM": "launch__occupancy_limit_blocks",
    "barriers": "launch__occupancy_limit_barriers",
}

# Global, local and shared memory traffic (L1TEX).
GLD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
GST_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
GLD_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
GST_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
LLD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"
LST_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"
LOCAL_LD_INST = "smsp__sass_inst_executed_op_local_ld.sum"
SHARED_LD_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
SHARED_ST_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
SHARED_LD_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
SHARED_ST_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"

# Instruction mix.
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
FADD = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"
FMUL = "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"
DFMA = "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum"
DADD = "smsp__sass_thread_inst_executed_op_dadd_pred_on.sum"
DMUL = "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum"
# ncu 2025.3 marks the smsp__thread_inst_executed_*_per_inst_executed names deprecated in favour
# of smsp__average_thread_inst_executed_*; the capture (and the profile part) use the old one.
THREADS_PER_INST = "smsp__thread_inst_executed_per_inst_executed.ratio"
THREADS_PER_INST_NEW = "smsp__average_thread_inst_executed_per_inst_executed.ratio"
THREADS_PRED_ON_PER_INST = "smsp__average_thread_inst_executed_pred_on_per_inst_executed.ratio"
THREADS_PRED_ON_PER_INST_OLD = "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio"
BRANCH_UNIFORM = "smsp__sass_average_branch_targets_threads_uniform.pct"
GMMA_INST = "sm__inst_executed_pipe_tensor_op_gmma.sum"
FP64_RATIO = "device__attribute_single_to_double_precision_perf_ratio"

# Pipe utilization, % of peak over active SM cycles (as ncu's ComputeWorkloadAnalysis).
TENSOR_PIPE = MetricRequest(
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor pipe",
    alternatives=("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",),
)
PIPES: dict[str, MetricRequest] = {
    "FMA (FP32)": MetricRequest(
        "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "fma"
    ),
    "ALU (integer/logic)": MetricRequest(
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active", "alu"
    ),
    "FP64": MetricRequest("sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active", "fp64"),
    "tensor": TENSOR_PIPE,
    "LSU (load/store)": MetricRequest(
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", "lsu"
    ),
    "XU (transcendentals)": MetricRequest(
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "xu", required=False
    ),
}

DRAM_REQUEST = MetricRequest(
    DRAM_THROUGHPUT, "DRAM throughput", alternatives=(DRAM_THROUGHPUT_ALT,)
)

# The stall reasons ncu reports, one list for the profiler and the tools.
STALL_REASONS: tuple[str, ...] = CATALOG_STALL_REASONS
STALL_FAMILIES: tuple[str, ...] = (
    "smsp__warp_issue_stalled_{r}_per_warp_active.pct",
    "smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio",
    "smsp__average_warp_latency_issue_stalled_{r}.ratio",
)
_MIN_REASONS = 5


def stall_metric(reason: str, family: str = STALL_FAMILIES[0]) -> str:
    """The metric name of `reason` in `family`."""
    return family.format(r=reason)


def stall_request(reason: str, required: bool = True) -> MetricRequest:
    """A request for `reason` in the first family, falling back to the others."""
    names = [stall_metric(reason, fam) for fam in STALL_FAMILIES]
    return MetricRequest(names[0], reason, required=required, alternatives=tuple(names[1:]))


@dataclass
class StallBreakdown:
    family: str
    values: dict[str, float] = field(default_factory=dict)  # reason -> raw metric value
    shares: dict[str, float] = field(default_factory=dict)  # reason -> % of stalled cycles
    names: dict[str, str] = field(default_factory=dict)  # reason -> metric name

    def dominant(self, among: tuple[str, ...]) -> tuple[str, float] | None:
        present = [(r, self.shares[r]) for r in among if r in self.shares]
        return max(present, key=lambda item: item[1]) if present else None


def stall_breakdown(ctx: ToolContext) -> StallBreakdown | None:
    """Stall shares from the first family with at least five reasons present, else None."""
    metrics = ctx.metrics
    if metrics is None:
        return None
    for family in STALL_FAMILIES:
        values: dict[str, float] = {}
        names: dict[str, str] = {}
        for reason in STALL_REASONS:
            name = stall_metric(reason, family)
            value = metrics.get(name)
            if value is not None:
                values[reason] = value
                names[reason] = name
        if len(values) < _MIN_REASONS:
            continue
        if family == STALL_FAMILIES[0]:
            # Warp states as % of active warp-cycles sum to 100 over all reasons, so the stalled
            # part is 100 - selected even when some reasons were not collected. Without
            # `selected` this is the paper's plain "% of active cycles" (a few % low).
            total = 100.0 - values.get("selected", 0.0)
        else:
            total = sum(v for r, v in values.items() if r != "selected")
        if total <= 0:
            return StallBreakdown(family, values, {}, names)
        shares = {r: 100.0 * v / total for r, v in values.items() if r != "selected"}
        return StallBreakdown(family, values, shares, names)
    return None


def pipe_utilization(ctx: ToolContext) -> dict[str, tuple[str, float]]:
    """Pipe label -> (metric name, % of peak) for every pipe metric present."""
    out: dict[str, tuple[str, float]] = {}
    for label, request in PIPES.items():
        found = ctx.resolve(request)
        if found is not None:
            out[label] = found
    return out


def saturation(ctx: ToolContext) -> tuple[str, float, str] | None:
    """(resource, % of peak, metric) of the most saturated roof: DRAM bandwidth, a compute
    pipe, or the item's measured roofline efficiency, whichever is highest.

    Each is an upper bound on what a kernel-local fix can gain (100 / %), so the tightest one
    wins. The roofline efficiency is the whole item's: in an item of several kernels (an
    unfused softmax at 18% of its roofline) one kernel can still run at 82% of DRAM bandwidth,
    and access-pattern advice for that kernel is worth at most 1.22x.
    """
    candidates: list[tuple[str, float, str]] = []
    if ctx.roofline_fraction is not None:
        candidates.append(
            ("roofline (measured efficiency)", 100.0 * ctx.roofline_fraction, "roofline_fraction")
        )
    dram = ctx.resolve(DRAM_REQUEST)
    if dram is not None:
        candidates.append(("DRAM bandwidth", dram[1], dram[0]))
    for label, (name, value) in pipe_utilization(ctx).items():
        if label.startswith("LSU"):
            continue  # a busy LSU pipe is a symptom of too many memory instructions, not a roof
        candidates.append((f"{label} pipe", value, name))
    return max(candidates, key=lambda c: c[1]) if candidates else None


def occupancy_limiters(ctx: ToolContext) -> tuple[list[str], float | None, dict[str, float]]:
    """(names of the tightest limiters, blocks per SM, all limits) from launch__occupancy_limit_*."""
    limits: dict[str, float] = {}
    for label, name in OCC_LIMITS.items():
        value = ctx.value(name)
        if value is not None and value > 0:
            limits[label] = value
    if not limits:
        return [], None, limits
    least = min(limits.values())
    tightest = [label for label, v in limits.items() if v == least]
    if "blocks per SM" in tightest:
        # The driver sizes the shared-memory carveout to fit the blocks-per-SM limit, and the
        # barrier limit (32 per SM) equals it, so a tie of those two with the blocks limit
        # (e.g. 1 KB of driver-reserved shared memory per 32-thread block) binds nothing else.
        tightest = [t for t in tightest if t not in ("shared memory", "barriers")]
    return tightest, least, limits


# SASS instruction classes (cuobjdump opcodes; design §3.3 and profiler-reference §5.2).
WGMMA_OPS: tuple[str, ...] = ("HGMMA", "IGMMA", "QGMMA", "BGMMA")
MMA_SYNC_OPS: tuple[str, ...] = ("HMMA", "IMMA", "DMMA", "BMMA")
TENSOR_OPS: tuple[str, ...] = WGMMA_OPS + MMA_SYNC_OPS
ASYNC_COPY_OPS: tuple[str, ...] = ("LDGSTS",)
TMA_OPS: tuple[str, ...] = (
    "UTMALDG",
    "UTMASTG",
    "UTMAREDG",
    "UTMAPF",
    "UBLKCP",
    "UBLKRED",
    "UBLKPF",
)


def sass_count(ctx: ToolContext, *classes: str) -> int | None:
    """Static count of SASS instructions of `classes` (None when SASS is missing).

    Works whether the summary keys are bare opcodes ("HMMA") or full ones ("HMMA.16816.F32");
    "HFMA2.MMA" (a move on the FMA pipe) does not count as HMMA.
    """
    sass = ctx.sass
    if sass is None:
        return None
    wanted = set(classes)
    return sum(int(v) for k, v in sass.counts.items() if k in wanted or k.split(".")[0] in wanted)
