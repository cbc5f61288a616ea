"""Shared-memory tools: bank conflicts, and staging without async copies (cp.async / TMA).

Bank conflicts follow Nsight Compute's SharedMemoryConflicts rule (conflicts / wavefronts of
an op >= 10%) but an op that carries under 10% of the shared wavefronts cannot cost much, so
it only counts when the op matters; severity follows the conflict share of all shared
wavefronts.
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
    ASYNC_COPY_OPS,
    SHARED_LD_CONFLICTS,
    SHARED_LD_WAVEFRONTS,
    SHARED_ST_CONFLICTS,
    SHARED_ST_WAVEFRONTS,
    TMA_OPS,
    sass_count,
    stall_breakdown,
)


class SharedBankConflictTool(ProfilingTool):
    """Shared-memory bank conflicts: extra wavefronts per shared load/store."""

    name = "shared_bank_conflicts"
    description = "Shared memory bank conflicts (conflict wavefronts vs all shared wavefronts)"
    affinity = "always"
    required_metrics = (
        MetricRequest(SHARED_LD_CONFLICTS, "shared load bank conflicts"),
        MetricRequest(SHARED_LD_WAVEFRONTS, "shared load wavefronts"),
        MetricRequest(SHARED_ST_CONFLICTS, "shared store bank conflicts", required=False),
        MetricRequest(SHARED_ST_WAVEFRONTS, "shared store wavefronts", required=False),
    )
    TRIGGER_PCT = 10.0  # of all shared wavefronts, or of one op's that matters
    OP_MIN_SHARE_PCT = 10.0  # an op must carry this share of shared wavefronts to count alone
    MEDIUM_PCT = 10.0
    HIGH_PCT = 30.0

    def _ops(self, ctx: ToolContext) -> list[tuple[str, str, float, float]]:
        out = []
        for op, c_name, w_name in (
            ("load", SHARED_LD_CONFLICTS, SHARED_LD_WAVEFRONTS),
            ("store", SHARED_ST_CONFLICTS, SHARED_ST_WAVEFRONTS),
        ):
            conflicts, waves = ctx.value(c_name), ctx.value(w_name)
            if conflicts is not None and waves:
                out.append((op, c_name, conflicts, waves))
        return out

    def _shares(
        self, ctx: ToolContext
    ) -> tuple[float, list[tuple[str, str, float, float, float, float]]]:
        ops = self._ops(ctx)
        total_waves = sum(w for *_, w in ops)
        total_conf = sum(c for _, _, c, _ in ops)
        overall = 0.0 if total_waves <= 0 else 100.0 * total_conf / total_waves
        detailed = [
            (op, name, c, w, 100.0 * c / w, 100.0 * w / total_waves) for op, name, c, w in ops
        ]
        return overall, detailed

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        overall, ops = self._shares(ctx)
        if overall < self.TRIGGER_PCT and not any(
            r >= self.TRIGGER_PCT and s >= self.OP_MIN_SHARE_PCT for *_, r, s in ops
        ):
            return None
        severity = (
            "high"
            if overall >= self.HIGH_PCT
            else "medium"
            if overall >= self.MEDIUM_PCT
            else "low"
        )
        evidence = {}
        worst = max(ops, key=lambda o: o[4])
        for op, name, c, w, ratio, _share in ops:
            ways = w / max(w - c, 1.0)
            evidence[name] = Evidence(
                c,
                f"{num(c)} conflicts / {num(w)} wavefronts = {pct(ratio)} of {op} wavefronts (~{ways:.1f}-way)",
            )
        evidence["shared conflict share"] = Evidence(
            round(overall, 3), f"{pct(overall)} of all shared wavefronts are conflict replays", "%"
        )
        bd = stall_breakdown(ctx)
        mio = (
            None
            if bd is None
            else bd.shares.get("mio_throttle", 0.0) + bd.shares.get("short_scoreboard", 0.0)
        )
        stall_text = (
            ""
            if mio is None
            else f" MIO-related stalls (mio_throttle + short_scoreboard) are {pct(mio)} of stalled cycles."
        )
        bound = 1.0 / max(1.0 - overall / 100.0, 0.2)
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Shared-memory bank conflicts: {pct(worst[4])} of {worst[0]} wavefronts",
            root_cause=(
                f"Threads of a warp hit the same shared-memory bank at different addresses, so "
                f"accesses replay: {pct(worst[4])} of {worst[0]} wavefronts and {pct(overall)} of all "
                f"shared wavefronts are conflicts.{stall_text}"
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("shared_bank_conflicts", "pad_shared_arrays"),
                    1.0 + (bound - 1.0) / 3.0,
                    bound,
                    "bound: 1/(1 - conflict share of shared wavefronts)",
                ),
                Recommendation(
                    action("shared_bank_conflicts", "consecutive_words"),
                    1.0 + (bound - 1.0) / 4.0,
                    max(1.0, (1.0 + bound) / 2.0),
                    "heuristic fraction of the bound",
                ),
            ],
            code_example=example("padding"),
        )


class AsyncCopyTool(ProfilingTool):
    """Global->shared staging through registers on sm_80+ where cp.async / TMA would overlap it."""

    name = "async_copy"
    description = "Shared-memory staging without cp.async (Ampere) or TMA (Hopper)"
    affinity = "always"
    required_inputs = ("metrics", "sass")
    STALL_PCT = 15.0  # long_scoreboard + barrier share of stalled warp-cycles
    MEDIUM_STALL_PCT = 25.0
    HIGH_STALL_PCT = 40.0

    def _state(self, ctx: ToolContext) -> tuple[int, int, int, float] | None:
        cc = ctx.compute_capability
        if cc is None or cc < (8, 0):
            return None
        sts, ldg = sass_count(ctx, "STS"), sass_count(ctx, "LDG")
        asyncs = sass_count(ctx, *ASYNC_COPY_OPS, *TMA_OPS)
        if sts is None or ldg is None or asyncs is None:
            return None
        bd = stall_breakdown(ctx)
        if bd is None:
            return None
        waiting = bd.shares.get("long_scoreboard", 0.0) + bd.shares.get("barrier", 0.0)
        return sts, ldg, asyncs, waiting

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        state = self._state(ctx)
        if state is None:
            return None
        sts, ldg, asyncs, waiting = state
        if not (sts > 0 and ldg > 0 and asyncs == 0 and waiting >= self.STALL_PCT):
            return None
        severity = (
            "high"
            if waiting >= self.HIGH_STALL_PCT
            else "medium"
            if waiting >= self.MEDIUM_STALL_PCT
            else "low"
        )
        hopper = ctx.is_hopper
        evidence = {
            "sass STS / LDG / LDGSTS+TMA": Evidence(
                f"{sts} / {ldg} / 0", "global->register->shared staging, no async copy instructions"
            ),
            "long_scoreboard + barrier stalls": Evidence(
                round(waiting, 2),
                f"{pct(waiting)} of stalled warp-cycles >= {self.STALL_PCT:g}%",
                "%",
            ),
        }
        if hopper:
            first = Recommendation(
                action("async_copy", "load_tiles_tma"),
                1.2,
                1.6,
                "heuristic",
            )
        else:
            first = Recommendation(
                action("async_copy", "use_cp_async"),
                1.1,
                1.4,
                "heuristic",
            )
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Synchronous global->shared staging on {'Hopper' if hopper else 'sm_80+'} (no {'TMA' if hopper else 'cp.async'})",
            root_cause=(
                f"The kernel copies global memory to shared memory through registers ({ldg} LDG, "
                f"{sts} STS, no LDGSTS/TMA in SASS), so every tile load is exposed: warps wait on "
                f"it (long_scoreboard) and then at the barrier; together {pct(waiting)} of stalled "
                "warp-cycles."
            ),
            evidence=evidence,
            recommendations=[
                first,
                Recommendation(
                    action("async_copy", "prefetch_into_registers"),
                    1.05,
                    1.25,
                    "heuristic",
                ),
            ],
            code_example=example("cp_async"),
        )
