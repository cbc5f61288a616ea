"""Warp-stall tools: the dominant stall reason, and barrier stalls on their own.

Shares are % of stalled warp-cycles (see `signals` for the normalisation). Like Nsight
Compute's CPIStall rule, stalls only matter while the scheduler has idle issue slots: when
warps issue on >= 80% of cycles the stalls are already hidden by other warps.
"""

from __future__ import annotations

from pytest_kernelpro.tools.advice import STALL_ADVICE, action, example
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
    ISSUE_ACTIVE,
    SHARED_LD_CONFLICTS,
    SHARED_LD_WAVEFRONTS,
    SHARED_ST_CONFLICTS,
    SHARED_ST_WAVEFRONTS,
    STALL_REASONS,
    StallBreakdown,
    stall_breakdown,
    stall_request,
)
from pytest_kernelpro.tools.streaming import long_scoreboard_advice, stream_state

CONFLICTS_FIRST = "Remove the shared-memory bank conflicts first"

# Reasons a kernel author can act on; `selected`, `not_selected`, `misc` and `sleeping` are not.
ACTIONABLE = tuple(
    r for r in STALL_REASONS if r not in ("selected", "not_selected", "misc", "sleeping")
)


def _stall_evidence(
    bd: StallBreakdown, reasons: list[str], condition_for: dict[str, str]
) -> dict[str, Evidence]:
    out: dict[str, Evidence] = {}
    for reason in reasons:
        name = bd.names[reason]
        share = bd.shares.get(reason, 0.0)
        cond = condition_for.get(reason, f"{pct(share)} of stalled warp-cycles")
        unit = "%" if name.endswith(".pct") else ""
        out[name] = Evidence(round(bd.values[reason], 4), cond, unit)
    return out


def _amdahl(share: float) -> float:
    """Upper bound on speedup if stalls of this share disappeared entirely."""
    return 1.0 / max(1.0 - share / 100.0, 0.05)


class WarpStallTool(ProfilingTool):
    """The dominant warp-stall reason and what to do about it."""

    name = "warp_stalls"
    description = "Dominant warp stall reason (long/short scoreboard, barrier, branch, MIO/LG throttle, math pipe)"
    affinity = "always"
    required_metrics = (
        *(
            stall_request(r)
            for r in (
                "long_scoreboard",
                "short_scoreboard",
                "barrier",
                "branch_resolving",
                "mio_throttle",
            )
        ),
        MetricRequest(ISSUE_ACTIVE, "issue active", required=False),
    )
    TRIGGER_PCT = 40.0
    CRITICAL_PCT = 60.0
    # At or above this issue-slot utilization the stalls are hidden by other warps (CPIStall).
    ISSUE_HIDDEN_PCT = 80.0
    # Long-scoreboard stalls near the DRAM roof are the signature of a bandwidth-bound kernel
    # (see `streaming`): at most medium from this DRAM throughput (% of peak), low from the next.
    # The H200's copies reach 86-90%, so 60% leaves <= 1.5x and 70% <= 1.3x to gain.
    STREAM_MEDIUM_DRAM_PCT = 60.0
    STREAM_LOW_DRAM_PCT = 70.0
    # Global-load bytes requested from L1 / DRAM bytes read at or below which a kernel streams
    # (uses each loaded byte about once): shared-memory staging has nothing to reuse.
    STREAM_REUSE_RATIO = 1.5
    # Below this DRAM throughput a kernel barely reads DRAM: its reuse ratio is not evidence.
    STREAM_MIN_DRAM_PCT = 10.0
    # DRAM bytes / minimal bytes from which "cut the excess traffic" leads the advice.
    EXCESS_BYTES_RATIO = 1.5
    # Share of shared-memory wavefronts that are bank-conflict replays from which removing
    # the conflicts leads the advice for MIO-throttle / short-scoreboard stalls.
    BANK_CONFLICT_LEAD_PCT = 50.0

    def _dominant(self, ctx: ToolContext) -> tuple[StallBreakdown, str, float] | None:
        bd = stall_breakdown(ctx)
        if bd is None:
            return None
        top = bd.dominant(ACTIONABLE)
        if top is None:
            return None
        return bd, top[0], top[1]

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        found = self._dominant(ctx)
        if found is None or found[2] <= self.TRIGGER_PCT:
            return None
        issue = ctx.value(ISSUE_ACTIVE)
        if issue is not None and issue >= self.ISSUE_HIDDEN_PCT:
            return None
        bd, reason, share = found
        advice = STALL_ADVICE[reason]
        severity = "critical" if share > self.CRITICAL_PCT else "high"
        limit = self.CRITICAL_PCT if severity == "critical" else self.TRIGGER_PCT
        ranked = sorted(
            ((r, s) for r, s in bd.shares.items() if r in ACTIONABLE and r != reason),
            key=lambda item: -item[1],
        )[:2]
        conditions = {reason: f"{pct(share)} of stalled warp-cycles > {limit:g}%"}
        conditions.update({r: f"{pct(s)} of stalled warp-cycles (next largest)" for r, s in ranked})
        evidence = _stall_evidence(bd, [reason, *(r for r, _ in ranked)], conditions)
        if issue is not None:
            evidence[ISSUE_ACTIVE] = Evidence(
                issue, f"{pct(issue)} < {self.ISSUE_HIDDEN_PCT:g}%: stalls are not hidden", "%"
            )
        bound = _amdahl(share)
        recs = [
            Recommendation(text, lo, hi, "heuristic range, capped by 1/(1 - stall share)").capped(
                bound
            )
            for text, lo, hi in advice.recommendations
        ]
        cause, code, notes = advice.cause, advice.code, []
        if reason == "long_scoreboard":
            stream = long_scoreboard_advice(
                stream_state(ctx),
                severity,
                bound,
                medium_dram_pct=self.STREAM_MEDIUM_DRAM_PCT,
                low_dram_pct=self.STREAM_LOW_DRAM_PCT,
                reuse_ratio=self.STREAM_REUSE_RATIO,
                excess_ratio=self.EXCESS_BYTES_RATIO,
                min_stream_dram_pct=self.STREAM_MIN_DRAM_PCT,
            )
            if stream is not None:
                severity, cause, recs, code = (
                    stream.severity,
                    stream.cause,
                    stream.recommendations,
                    stream.code,
                )
                evidence.update(stream.evidence)
                notes = stream.notes
        if reason in ("mio_throttle", "short_scoreboard"):
            recs = self._conflicts_first(ctx, recs, evidence, bound)
            if recs and recs[0].action.startswith(CONFLICTS_FIRST):
                code = example("padding")
        others = ", ".join(f"{r} {pct(s)}" for r, s in ranked) or "none"
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"{reason} stalls dominate ({pct(share)} of stalled warp-cycles)",
            root_cause=(
                f"{pct(share)} of stalled warp-cycles are '{reason}' ({advice.meaning}): "
                f"{cause}. Next largest: {others}."
            ),
            evidence=evidence,
            recommendations=recs,
            code_example=code,
            notes=notes,
        )

    def _conflicts_first(
        self,
        ctx: ToolContext,
        recs: list[Recommendation],
        evidence: dict[str, Evidence],
        bound: float,
    ) -> list[Recommendation]:
        """Lead with removing bank conflicts when most shared wavefronts are conflict replays:
        then the MIO queue is full of replays, not of useful shared loads."""
        conflicts = (ctx.value(SHARED_LD_CONFLICTS) or 0.0) + (
            ctx.value(SHARED_ST_CONFLICTS) or 0.0
        )
        wavefronts = (ctx.value(SHARED_LD_WAVEFRONTS) or 0.0) + (
            ctx.value(SHARED_ST_WAVEFRONTS) or 0.0
        )
        if wavefronts <= 0:
            return recs
        share = 100.0 * conflicts / wavefronts
        if share < self.BANK_CONFLICT_LEAD_PCT:
            return recs
        evidence["shared bank-conflict wavefronts"] = Evidence(
            round(share, 2),
            f"{num(conflicts)} of {num(wavefronts)} shared wavefronts are conflict replays "
            f"({pct(share)} >= {self.BANK_CONFLICT_LEAD_PCT:g}%)",
            "%",
        )
        # Without the replays the shared pipe does wavefronts - conflicts of work.
        high = max(1.1, min(bound, wavefronts / max(wavefronts - conflicts, 1.0)))
        lead = Recommendation(
            action("warp_stalls", "conflicts_first", lead=CONFLICTS_FIRST),
            min(1.1, high),
            high,
            "bound: shared wavefronts / conflict-free wavefronts, capped by 1/(1 - stall share)",
        )
        return [lead, *(r for r in recs if "bank conflicts" not in r.action)]


class BarrierStallTool(ProfilingTool):
    """Barrier (__syncthreads) stalls, flagged at a lower threshold than other stalls."""

    name = "barrier_stalls"
    description = "Warps waiting at __syncthreads() for the rest of the block"
    affinity = "always"
    required_metrics = (stall_request("barrier"),)
    TRIGGER_PCT = 30.0
    CRITICAL_PCT = 50.0

    def _share(self, ctx: ToolContext) -> tuple[StallBreakdown, float] | None:
        bd = stall_breakdown(ctx)
        if bd is None or "barrier" not in bd.shares:
            return None
        return bd, bd.shares["barrier"]

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        found = self._share(ctx)
        if found is None or found[1] <= self.TRIGGER_PCT:
            return None
        bd, share = found
        severity = "critical" if share > self.CRITICAL_PCT else "high"
        limit = self.CRITICAL_PCT if severity == "critical" else self.TRIGGER_PCT
        evidence = _stall_evidence(
            bd, ["barrier"], {"barrier": f"{pct(share)} of stalled warp-cycles > {limit:g}%"}
        )
        block = ctx.value("launch__block_size")
        if block is not None:
            evidence["launch__block_size"] = Evidence(
                block, f"{num(block)} threads wait for the slowest warp"
            )
        advice = STALL_ADVICE["barrier"]
        bound = _amdahl(share)
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Barrier stalls: {pct(share)} of stalled warp-cycles at __syncthreads()",
            root_cause=(
                f"{pct(share)} of stalled warp-cycles are spent at block barriers: {advice.cause}. "
                "Barrier-heavy code is also where missing or misplaced __syncthreads() cause "
                "races, so keep the remaining barriers correct when removing others."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(t, lo, hi, "heuristic range, capped by 1/(1 - stall share)").capped(
                    bound
                )
                for t, lo, hi in advice.recommendations
            ],
            code_example=advice.code,
        )
