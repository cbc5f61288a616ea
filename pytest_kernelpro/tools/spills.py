"""RegisterSpillDetector: local memory (register spills or local arrays), flagged only when it hurts.

Evidence that local memory is used: LDL/STL in SASS, spill bytes or a stack frame in the ptxas
report, local-memory sectors in ncu. Harm (any one triggers): the multi-signal conditions of the
KernelPro paper -
  latency:    long-scoreboard stalls dominate while local traffic is a visible share;
  bandwidth:  local-memory sectors are a large share of L1 global+local traffic;
  occupancy:  registers are the occupancy limiter, achieved occupancy is low and the
              schedulers starve - register pressure is the root bottleneck.
A kernel whose spills are harmless (a few spill bytes in a cold path) is not flagged.
"""

from __future__ import annotations

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
    ACHIEVED_OCC,
    ELIGIBLE_WARPS,
    GLD_SECTORS,
    GST_SECTORS,
    LLD_SECTORS,
    LOCAL_LD_INST,
    LST_SECTORS,
    REGISTERS,
    occupancy_limiters,
    sass_count,
    stall_breakdown,
)


class RegisterSpillDetector(ProfilingTool):
    """Local-memory traffic from register spills or local arrays that costs time."""

    name = "register_spills"
    description = "Register spills / local memory (SASS LDL/STL, ptxas, local traffic, occupancy), only when harmful"
    affinity = "always"
    bounded_by_saturation = False
    required_metrics = (
        MetricRequest(LLD_SECTORS, "local load sectors"),
        MetricRequest(LST_SECTORS, "local store sectors"),
        MetricRequest(GLD_SECTORS, "global load sectors", required=False),
        MetricRequest(GST_SECTORS, "global store sectors", required=False),
        MetricRequest(ACHIEVED_OCC, "achieved occupancy", required=False),
        MetricRequest(ELIGIBLE_WARPS, "eligible warps", required=False),
    )
    LATENCY_STALL_PCT = 40.0  # long_scoreboard share of stalled warp-cycles
    LATENCY_LOCAL_MIN_PCT = 5.0  # ...while local traffic is at least this share
    LOCAL_TRAFFIC_PCT = 20.0  # local sectors / (local + global) sectors
    CRITICAL_LOCAL_PCT = 50.0
    OCC_STARVED_PCT = 50.0  # achieved occupancy below this with registers limiting
    STARVED_ELIGIBLE = 1.0

    def _signals(self, ctx: ToolContext) -> dict[str, float]:
        local = (ctx.value(LLD_SECTORS) or 0.0) + (ctx.value(LST_SECTORS) or 0.0)
        glob = (ctx.value(GLD_SECTORS) or 0.0) + (ctx.value(GST_SECTORS) or 0.0)
        ldl_stl = sass_count(ctx, "LDL", "STL")
        ptxas = ctx.ptxas
        out = {
            "local_sectors": local,
            "local_share": 0.0 if local + glob <= 0 else 100.0 * local / (local + glob),
            "ldl_stl": -1.0 if ldl_stl is None else float(ldl_stl),
            "spill_bytes": -1.0
            if ptxas is None
            else float(ptxas.spill_store_bytes + ptxas.spill_load_bytes),
            "stack_bytes": -1.0 if ptxas is None else float(ptxas.stack_frame_bytes),
        }
        bd = stall_breakdown(ctx)
        out["long_scoreboard"] = 0.0 if bd is None else bd.shares.get("long_scoreboard", 0.0)
        return out

    def _present(self, s: dict[str, float]) -> bool:
        return s["local_sectors"] > 0 or s["ldl_stl"] > 0 or s["spill_bytes"] > 0

    def _harms(self, ctx: ToolContext, s: dict[str, float]) -> list[str]:
        harms = []
        if (
            s["long_scoreboard"] >= self.LATENCY_STALL_PCT
            and s["local_share"] >= self.LATENCY_LOCAL_MIN_PCT
        ):
            harms.append("latency")
        if s["local_share"] >= self.LOCAL_TRAFFIC_PCT:
            harms.append("bandwidth")
        limiters, _, _ = occupancy_limiters(ctx)
        ach, eligible = ctx.value(ACHIEVED_OCC), ctx.value(ELIGIBLE_WARPS)
        if (
            "registers" in limiters
            and ach is not None
            and ach < self.OCC_STARVED_PCT
            and (eligible is None or eligible < self.STARVED_ELIGIBLE)
        ):
            harms.append("occupancy")
        return harms

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        s = self._signals(ctx)
        if not self._present(s):
            return None
        harms = self._harms(ctx, s)
        if not harms:
            return None
        if len(harms) >= 2 and s["local_share"] >= self.CRITICAL_LOCAL_PCT:
            severity = "critical"
        elif len(harms) >= 2:
            severity = "high"
        else:
            severity = "medium"
        evidence: dict[str, Evidence] = {}
        lld, lst = ctx.value(LLD_SECTORS) or 0.0, ctx.value(LST_SECTORS) or 0.0
        evidence[LLD_SECTORS] = Evidence(lld, f"{num(lld)} local load sectors")
        evidence[LST_SECTORS] = Evidence(lst, f"{num(lst)} local store sectors")
        evidence["local share of L1 sectors"] = Evidence(
            round(s["local_share"], 2),
            f"{pct(s['local_share'])} of global+local sectors"
            + (f" >= {self.LOCAL_TRAFFIC_PCT:g}%" if "bandwidth" in harms else ""),
            "%",
        )
        if s["ldl_stl"] >= 0:
            evidence["sass LDL+STL"] = Evidence(
                int(s["ldl_stl"]), "static local load/store instructions"
            )
        ptxas = ctx.ptxas
        if ptxas is not None:
            evidence["ptxas"] = Evidence(
                f"{ptxas.registers} regs, {ptxas.stack_frame_bytes} B stack, "
                f"{ptxas.spill_store_bytes} B spill stores, {ptxas.spill_load_bytes} B spill loads",
                "ptxas -v resource report",
            )
        if "latency" in harms:
            evidence["long_scoreboard share"] = Evidence(
                round(s["long_scoreboard"], 2),
                f"{pct(s['long_scoreboard'])} of stalled warp-cycles >= {self.LATENCY_STALL_PCT:g}%",
                "%",
            )
        local_inst = ctx.value(LOCAL_LD_INST)
        if local_inst:
            evidence[LOCAL_LD_INST] = Evidence(
                local_inst, f"{num(local_inst)} local load instructions executed"
            )
        regs = ctx.value(REGISTERS)
        if "occupancy" in harms:
            evidence[ACHIEVED_OCC] = Evidence(
                ctx.value(ACHIEVED_OCC) or 0.0,
                f"< {self.OCC_STARVED_PCT:g}% with registers ({num(regs or 0)}/thread) as the occupancy limiter",
                "%",
            )
        if s["spill_bytes"] > 0:
            kind = "register spills"
            what = (
                f"ptxas reports {num(s['spill_bytes'])} bytes of spill loads+stores: the kernel needs "
                "more registers than it gets, so values round-trip through local memory"
            )
            recs = [
                Recommendation(
                    action("register_spills", "reduce_live_registers"),
                    1.2,
                    2.0,
                    "heuristic",
                ),
                Recommendation(
                    action("register_spills", "relax_register_cap"),
                    1.1,
                    1.5,
                    "heuristic",
                ),
            ]
            code = None
        else:
            stack = s["stack_bytes"]
            if stack > 0:
                kind = "a local array"
                what = (
                    f"ptxas reports a {num(stack)}-byte stack frame but no spills: a per-thread "
                    "array indexed at run time lives in local memory (DRAM-backed, cached in L1/L2)"
                )
            else:
                kind = "local memory"
                what = "the kernel reads and writes local memory (register spills or a runtime-indexed local array)"
            recs = [
                Recommendation(
                    action("register_spills", "keep_array_registers"),
                    1.5,
                    4.0,
                    "heuristic; bounded by the local share of memory traffic",
                ),
                Recommendation(
                    action("register_spills", "shrink_array_split"),
                    1.1,
                    2.0,
                    "heuristic",
                ),
            ]
            code = example("local_array")
        bound = 1.0 / max(1.0 - s["local_share"] / 100.0, 0.1)
        recs = [r.capped(max(bound, 1.5)) for r in recs]
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Local memory hurts ({kind}): {pct(s['local_share'])} of L1 traffic, harm: {', '.join(harms)}",
            root_cause=(
                f"{what}. Local traffic is {pct(s['local_share'])} of global+local sectors and it "
                f"costs time through {' and '.join(harms)}."
            ),
            evidence=evidence,
            recommendations=recs,
            code_example=code,
        )
