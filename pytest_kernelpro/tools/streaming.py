"""Long-scoreboard stalls of kernels that stream data: bandwidth, not latency.

A kernel that uses each byte it loads about once (an elementwise op, a row reduction, a
copy) stalls on long scoreboard whatever it does: its warps wait for DRAM. Near the DRAM
roof that is the expected signature of a bandwidth-bound kernel, and "stage data in shared
memory / tile the loop" is wrong advice (there is nothing to reuse); what is left is moving
fewer bytes (fusing the neighbouring kernels, lower precision, no re-reads). Further from
the roof, a stream gains by keeping more bytes in flight (128-bit loads, several elements
per thread, more resident warps), still not by tiling.

Two signals decide, both from ncu's counters:
- DRAM throughput (% of peak): how close the kernel runs to the memory roof;
- reuse: bytes the global loads request from L1 (sectors x 32) / bytes read from DRAM. About
  1 for a stream; a tiled GEMM requests each DRAM byte hundreds of times from L1.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_kernelpro.tools.advice import action, example
from pytest_kernelpro.tools.contract import (
    Evidence,
    Recommendation,
    ToolContext,
    cap_severity,
    num,
    pct,
)
from pytest_kernelpro.tools.signals import DRAM_READ, DRAM_REQUEST, DRAM_WRITE, GLD_SECTORS

SECTOR_BYTES = 32.0


@dataclass(frozen=True)
class StreamState:
    """How a kernel uses DRAM: throughput, reuse of loaded bytes, traffic vs the minimum."""

    dram_pct: float | None  # DRAM throughput, % of peak
    dram_metric: str
    reuse: float | None  # L1 global-load bytes requested / DRAM bytes read
    moved: float | None  # DRAM bytes read + written
    excess: float | None  # moved / the reference's minimal bytes


def stream_state(ctx: ToolContext) -> StreamState:
    """The DRAM signals of `ctx`'s kernel (fields None where counters are missing)."""
    found = ctx.resolve(DRAM_REQUEST)
    dram_metric, dram = found if found is not None else (DRAM_REQUEST.name, None)
    read, write, sectors = ctx.value(DRAM_READ), ctx.value(DRAM_WRITE), ctx.value(GLD_SECTORS)
    reuse = sectors * SECTOR_BYTES / read if read and sectors else None
    moved = read + write if read is not None and write is not None else None
    excess = moved / ctx.min_bytes if moved is not None and ctx.min_bytes else None
    return StreamState(dram, dram_metric, reuse, moved, excess)


@dataclass
class StreamAdvice:
    """Replacement severity, cause and recommendations for a long-scoreboard finding."""

    severity: str
    cause: str
    recommendations: list[Recommendation]
    evidence: dict[str, Evidence]
    code: str | None
    notes: list[str]


def long_scoreboard_advice(
    state: StreamState,
    severity: str,
    bound: float,
    *,
    medium_dram_pct: float,
    low_dram_pct: float,
    reuse_ratio: float,
    excess_ratio: float,
    min_stream_dram_pct: float,
) -> StreamAdvice | None:
    """Advice for dominant long-scoreboard stalls on a stream or near the DRAM roof, or None
    when neither holds (the generic latency-hiding advice stands).

    `bound` (the stall share's Amdahl bound) caps the latency-hiding estimate; moving fewer
    bytes is bounded by the bytes instead. At >= `low_dram_pct` of peak
    DRAM bandwidth the finding is at most low, at >= `medium_dram_pct` at most medium: the
    stalls are what a bandwidth-bound kernel looks like, and hiding their latency can gain at
    most 100 / DRAM %. A kernel below `min_stream_dram_pct` barely reads DRAM (a tiny or
    cache-resident kernel), so its reuse ratio says nothing and the generic advice stands.
    """
    dram = state.dram_pct
    near_roof = dram is not None and dram >= medium_dram_pct
    stream = (
        state.reuse is not None
        and state.reuse <= reuse_ratio
        and dram is not None
        and dram >= min_stream_dram_pct
    )
    if not (near_roof or stream):
        return None
    evidence: dict[str, Evidence] = {}
    if dram is not None:
        cond = (
            f"{pct(dram)} >= {medium_dram_pct:g}% of peak DRAM bandwidth"
            if near_roof
            else f"DRAM at {pct(dram)} of peak"
        )
        evidence[state.dram_metric] = Evidence(dram, cond, "%")
    if state.reuse is not None:
        evidence["global load bytes / DRAM bytes read"] = Evidence(
            round(state.reuse, 3),
            f"{state.reuse:.2f}x {'<=' if stream else '>'} {reuse_ratio:g}x: "
            + ("each loaded byte is used about once (a stream)" if stream else "data is reused"),
        )
    headroom = 100.0 / max(dram, 1.0) if dram is not None else bound
    in_flight_high = max(1.0, min(bound, headroom))
    in_flight = Recommendation(
        action("warp_stalls", "keep_more_bytes"),
        min(1.1, in_flight_high),
        in_flight_high,
        "bound: 100 / DRAM throughput %, and 1/(1 - stall share)",
    )
    fewer = Recommendation(
        action("warp_stalls", "move_fewer_bytes"),
        1.1,
        2.0,
        "heuristic (depends on how many bytes fusion or precision removes)",
        bounded_by_saturation=False,
    )
    recs: list[Recommendation] = []
    notes: list[str] = []
    if (
        near_roof
        and state.excess is not None
        and state.moved is not None
        and state.excess >= excess_ratio
    ):
        # Only where DRAM is the limiter; further from the roof l2_locality reports the excess.
        evidence["dram bytes / minimal bytes"] = Evidence(
            round(state.excess, 3),
            f"{num(state.moved)} B moved = {state.excess:.2f}x the minimal bytes",
        )
        recs.append(
            Recommendation(
                action("warp_stalls", "cut_excess_traffic", excess=f"{state.excess:.2f}"),
                1.1,
                max(1.1, min(state.excess, 4.0)),
                "bound: DRAM bytes / minimal bytes, capped at 4x",
                bounded_by_saturation=False,
            )
        )
    if near_roof and dram is not None:
        cap = "low" if dram >= low_dram_pct else "medium"
        new = cap_severity(severity, cap)
        if new != severity:
            notes.append(
                f"Severity lowered from {severity} to {new}: DRAM runs at {pct(dram)} of peak "
                f"(>= {low_dram_pct if cap == 'low' else medium_dram_pct:g}%), so these stalls are "
                "the signature of a bandwidth-bound kernel, not latency to hide."
            )
        severity = new
        low_band = cap == "low"
        cause = (
            f"warps wait on DRAM while it runs at {pct(dram)} of its peak bandwidth: the kernel "
            "is bound by the bytes it moves, and long-scoreboard stalls are what that looks "
            f"like. Hiding their latency can gain at most {headroom:.2f}x; moving fewer bytes "
            "is what is left"
        )
        # Below the low band bandwidth use still has some headroom: more bytes in flight first.
        recs += [fewer, in_flight] if low_band else [in_flight, fewer]
    else:
        cause = (
            "the kernel streams data (each loaded byte is used about once) and keeps too few "
            "bytes in flight to cover DRAM latency; there is nothing to reuse, so staging in "
            "shared memory would not help"
        )
        recs += [in_flight, fewer]
    return StreamAdvice(
        severity,
        cause,
        recs,
        evidence,
        example("fusion") if near_roof else example("float4"),
        notes,
    )
