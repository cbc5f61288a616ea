"""Global-memory tools: coalescing and vectorization (DRAM saturation and L2 locality: dram.py).

Coalescing. A warp-wide access of b-bit elements by 32 threads needs b/8 sectors of 32 bytes
(4 for 32-bit, 16 for 128-bit). ncu gives sectors and requests per op; SASS gives the access
widths, so the ideal is the static-count-weighted mean of b/8 over the op's instructions
(exact when one width is used). Sectors above ideal x requests are excess, the same quantity as
Nsight Compute's "excessive sectors" (its UncoalescedGlobalAccess rule). Without SASS the
width is unknown; only more than 16 sectors per request (beyond even 128-bit accesses) is
then reported, against an assumed 128-bit ideal, as a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_kernelpro.tools.advice import action, example
from pytest_kernelpro.tools.contract import (
    Evidence,
    Finding,
    MetricRequest,
    ProfilingTool,
    Recommendation,
    ToolContext,
    num,
    pct,
)
from pytest_kernelpro.tools.signals import (
    DRAM_REQUEST,
    GLD_REQUESTS,
    GLD_SECTORS,
    GST_REQUESTS,
    GST_SECTORS,
)

MAX_IDEAL_SECTORS = 16.0  # 32 threads x 16 bytes / 32-byte sectors


@dataclass(frozen=True)
class OpCoalescing:
    op: str  # "load" | "store"
    sectors_metric: str
    sectors: float
    requests: float
    ideal: float  # sectors per request
    width_note: str
    lower_bound: bool

    @property
    def per_request(self) -> float:
        return self.sectors / self.requests

    @property
    def excess(self) -> float:
        return max(0.0, self.sectors - self.ideal * self.requests)


def _ideal_from_widths(widths: dict[int, int] | None) -> tuple[float, str] | None:
    if not widths:
        return None
    total = sum(widths.values())
    if total <= 0:
        return None
    ideal = sum(max(bits / 8.0, 1.0) * n for bits, n in widths.items()) / total
    desc = ", ".join(f"{n}x {bits}-bit" for bits, n in sorted(widths.items()))
    return ideal, f"SASS: {desc}"


def coalescing_ops(ctx: ToolContext) -> list[OpCoalescing]:
    """Per-op sectors/request against the ideal, for every op that can be assessed."""
    sass = ctx.sass
    out = []
    for op, sectors_name, requests_name, widths in (
        (
            "load",
            GLD_SECTORS,
            GLD_REQUESTS,
            None if sass is None else dict(sass.global_load_widths),
        ),
        (
            "store",
            GST_SECTORS,
            GST_REQUESTS,
            None if sass is None else dict(sass.global_store_widths),
        ),
    ):
        sectors = ctx.value(sectors_name)
        requests = ctx.value(requests_name)
        if not sectors or not requests:
            continue
        ideal = _ideal_from_widths(widths)
        if ideal is not None:
            out.append(OpCoalescing(op, sectors_name, sectors, requests, ideal[0], ideal[1], False))
        elif sectors / requests > MAX_IDEAL_SECTORS:
            out.append(
                OpCoalescing(
                    op,
                    sectors_name,
                    sectors,
                    requests,
                    MAX_IDEAL_SECTORS,
                    "no SASS: assumed 128-bit accesses (excess is a lower bound)",
                    True,
                )
            )
    return out


def excess_share(ops: list[OpCoalescing]) -> float:
    total = sum(o.sectors for o in ops)
    return 0.0 if total <= 0 else 100.0 * sum(o.excess for o in ops) / total


class GlobalCoalescingTool(ProfilingTool):
    """Uncoalesced global accesses: more 32-byte sectors per request than the access width needs."""

    name = "global_coalescing"
    description = "Global memory sectors per request vs the ideal for the access width"
    affinity = "memory"
    bounded_by_saturation = False  # coalescing removes bytes, so the DRAM roof does not bound it
    required_metrics = (
        MetricRequest(GLD_SECTORS, "global load sectors"),
        MetricRequest(GLD_REQUESTS, "global load requests"),
        MetricRequest(GST_SECTORS, "global store sectors", required=False),
        MetricRequest(GST_REQUESTS, "global store requests", required=False),
    )
    TRIGGER_PCT = 10.0
    HIGH_PCT = 30.0
    CRITICAL_PCT = 60.0

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        ops = coalescing_ops(ctx)
        share = excess_share(ops)
        if share < self.TRIGGER_PCT:
            return None
        severity = (
            "critical"
            if share >= self.CRITICAL_PCT
            else "high"
            if share >= self.HIGH_PCT
            else "medium"
        )
        total = sum(o.sectors for o in ops)
        excess = sum(o.excess for o in ops)
        evidence = {
            o.sectors_metric: Evidence(
                round(o.per_request, 2),
                f"{o.per_request:.1f} sectors/request vs ideal {o.ideal:.3g} ({o.width_note})",
                "sectors/request",
            )
            for o in ops
        }
        limit = (
            self.CRITICAL_PCT
            if severity == "critical"
            else self.HIGH_PCT
            if severity == "high"
            else self.TRIGGER_PCT
        )
        evidence["excess sectors"] = Evidence(
            excess, f"{num(excess)} of {num(total)} sectors ({pct(share)}) are excess >= {limit:g}%"
        )
        bound = min(1.0 / max(1.0 - share / 100.0, 0.125), 8.0)
        worst = max(ops, key=lambda o: o.excess)
        lower = any(o.lower_bound for o in ops)
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Uncoalesced global memory: {pct(share)} of sectors are excess",
            root_cause=(
                f"Global {worst.op}s use {worst.per_request:.1f} sectors per request where "
                f"{worst.ideal:.3g} would do: neighbouring threads access addresses far apart (a "
                f"stride between threads), so each 32-byte sector carries few useful bytes. "
                f"{num(excess)} of {num(total)} sectors ({pct(share)}) are excess"
                + (" (a lower bound: access widths unknown without SASS)." if lower else ".")
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("global_coalescing", "remap_threads_consecutive"),
                    1.0 + (bound - 1.0) / 4.0,
                    bound,
                    "bound: 1/(1 - excess share) sectors, capped at 8x",
                ),
                Recommendation(
                    action("global_coalescing", "stage_strided_through_shared"),
                    1.0 + (bound - 1.0) / 6.0,
                    1.0 + (bound - 1.0) / 2.0,
                    "heuristic fraction of the bound",
                ),
                Recommendation(
                    action("global_coalescing", "after_coalescing_vectorize"),
                    1.05,
                    1.3,
                    "heuristic",
                ),
            ],
            code_example=example("warp_per_row"),
        )


class VectorizationTool(ProfilingTool):
    """Mostly scalar (<= 32-bit) global accesses in a memory-bound kernel."""

    name = "vectorization"
    description = "Global load/store widths from SASS: scalar accesses where 128-bit would do"
    affinity = "memory"
    required_inputs = ("metrics", "sass")
    required_metrics = (
        MetricRequest(
            DRAM_REQUEST.name,
            "DRAM throughput",
            required=False,
            alternatives=DRAM_REQUEST.alternatives,
        ),
    )
    NARROW_SHARE_PCT = 80.0
    DRAM_SATURATED_PCT = 80.0
    UNCOALESCED_PCT = 30.0  # above this excess share, fix coalescing first

    def _widths(self, ctx: ToolContext) -> tuple[int, int, dict[int, int]] | None:
        sass = ctx.sass
        if sass is None:
            return None
        merged: dict[int, int] = {}
        for widths in (sass.global_load_widths, sass.global_store_widths):
            for bits, n in widths.items():
                merged[int(bits)] = merged.get(int(bits), 0) + int(n)
        total = sum(merged.values())
        narrow = sum(n for bits, n in merged.items() if bits <= 32)
        return (narrow, total, merged) if total else None

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        found = self._widths(ctx)
        if found is None:
            return None
        narrow, total, merged = found
        dram = ctx.resolve(DRAM_REQUEST)
        if dram is not None and dram[1] >= self.DRAM_SATURATED_PCT:
            return None
        share = 100.0 * narrow / total
        if share < self.NARROW_SHARE_PCT:
            return None
        uncoalesced = excess_share(coalescing_ops(ctx))
        severity = "low" if uncoalesced >= self.UNCOALESCED_PCT else "medium"
        widths = ", ".join(f"{n}x {bits}-bit" for bits, n in sorted(merged.items()))
        evidence = {
            "sass global access widths": Evidence(
                widths,
                f"{narrow} of {total} global ld/st instructions ({pct(share)}) are <= 32-bit >= {self.NARROW_SHARE_PCT:g}%",
            )
        }
        if dram is not None:
            evidence[dram[0]] = Evidence(
                dram[1],
                f"{pct(dram[1])} < {self.DRAM_SATURATED_PCT:g}%: bandwidth headroom left",
                "%",
            )
        notes = []
        if severity == "low":
            notes.append(
                f"{pct(uncoalesced)} of sectors are excess: fix coalescing first "
                "(global_coalescing), vectorize afterwards."
            )
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Scalar global accesses: {pct(share)} of global ld/st are <= 32-bit",
            root_cause=(
                f"SASS shows {widths} global accesses: each instruction moves at most 4 bytes per "
                "thread, so the kernel needs 4x more memory instructions (and LSU queue slots) "
                "than with 128-bit accesses, while DRAM still has headroom."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("vectorization", "vector_128_bit"),
                    1.1,
                    1.4,
                    "heuristic (fewer instructions; bytes unchanged)",
                ),
                Recommendation(
                    action("vectorization", "give_thread_several"),
                    1.05,
                    1.3,
                    "heuristic",
                ),
            ],
            code_example=example("float4"),
            notes=notes,
        )
