"""What each warp-stall reason means and what to do about it (the advice tables of
`stalls.WarpStallTool`), with the code examples the findings carry."""

from __future__ import annotations

from dataclasses import dataclass

SMEM_TILING_EXAMPLE = """\
// Load each tile once per block into shared memory, then reuse it from there.
__shared__ float tile[TILE][TILE + 1];          // +1 avoids bank conflicts on transposed reads
tile[threadIdx.y][threadIdx.x] = in[(row0 + threadIdx.y) * ld + col0 + threadIdx.x];
__syncthreads();
for (int k = 0; k < TILE; ++k) acc += tile[threadIdx.y][k] * w[k];  // reuse from shared
"""

WARP_REDUCE_EXAMPLE = """\
// Reduce within a warp with shuffles: no shared memory, no __syncthreads().
__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
"""

PREDICATION_EXAMPLE = """\
// Branch-free select instead of a divergent if/else in the inner loop.
float r = cond ? a : b;               // compiles to SEL/FSEL, no branch
// or arithmetically: r = c * a + (1.0f - c) * b with c = (float)cond
"""

REGISTER_TILE_EXAMPLE = """\
// Register tiling: each thread computes a TM x TN micro-tile, so one shared-memory load
// feeds TN (or TM) FMAs instead of one.
float a[TM], b[TN], acc[TM][TN] = {};
for (int k = 0; k < TILE_K; ++k) {
  for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
  for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
}
"""


@dataclass(frozen=True)
class StallAdvice:
    meaning: str
    cause: str
    recommendations: tuple[tuple[str, float, float], ...]
    code: str | None = None


STALL_ADVICE: dict[str, StallAdvice] = {
    "long_scoreboard": StallAdvice(
        "waiting for an L1TEX result (global, local, texture memory)",
        "warps wait on global/local memory loads (hundreds of cycles to DRAM) and there is not "
        "enough independent work or prefetching to hide that latency",
        (
            (
                "Stage data that is reused in shared memory (tile the loop) so each global value "
                "is loaded once per block instead of once per use",
                1.5,
                3.0,
            ),
            (
                "Keep several independent loads in flight per thread (unroll, load the next "
                "iteration's data before using the current one) and use 128-bit loads (float4)",
                1.2,
                1.6,
            ),
            (
                "On sm_80+ prefetch the next tile asynchronously (cp.async on Ampere, TMA on "
                "Hopper) while computing on the current one",
                1.2,
                1.5,
            ),
        ),
        SMEM_TILING_EXAMPLE,
    ),
    "short_scoreboard": StallAdvice(
        "waiting for an MIO result (shared memory, special functions such as exp/rsqrt, shuffles)",
        "warps wait on shared-memory loads or MUFU/special-function results that the next "
        "instruction needs",
        (
            (
                "Keep reused shared-memory values in registers (register tiling) so fewer "
                "shared loads sit on the critical path",
                1.2,
                1.6,
            ),
            ("Remove shared-memory bank conflicts (pad rows by one element, swizzle)", 1.1, 1.4),
            (
                "Interleave independent work between a shared load / special function and its "
                "use; hoist transcendental math out of inner loops",
                1.1,
                1.3,
            ),
        ),
        REGISTER_TILE_EXAMPLE,
    ),
    "barrier": StallAdvice(
        "waiting at a block barrier (__syncthreads) for the other warps",
        "warps reach __syncthreads() at different times, so most of the block waits for the "
        "slowest warp",
        (
            (
                "Use warp-level primitives (__shfl_xor_sync, __reduce_add_sync, cooperative "
                "groups) instead of shared memory + __syncthreads() for reductions",
                1.2,
                2.0,
            ),
            (
                "Cut barriers per iteration: double-buffer shared tiles so one barrier per tile "
                "suffices",
                1.1,
                1.4,
            ),
            (
                "Balance work across the warps of a block (no warp-dependent loop bounds before a "
                "barrier); consider smaller blocks",
                1.1,
                1.3,
            ),
        ),
        WARP_REDUCE_EXAMPLE,
    ),
    "branch_resolving": StallAdvice(
        "waiting for a branch target to be computed or the warp's divergence to be resolved",
        "data-dependent control flow in hot code makes warps wait on branch resolution",
        (
            (
                "Replace conditionals in the inner loop with predication / selects "
                "(result = cond ? a : b, or cond * a + (1 - cond) * b)",
                1.1,
                1.4,
            ),
            (
                "Hoist loop-invariant and warp-uniform conditions out of the loop; make loop "
                "bounds compile-time constants where possible",
                1.05,
                1.2,
            ),
        ),
        PREDICATION_EXAMPLE,
    ),
    "mio_throttle": StallAdvice(
        "the MIO instruction queue (shared memory, special functions, shuffles) is full",
        "the kernel issues more shared-memory / special-function / shuffle instructions than "
        "the MIO pipe accepts: typically one shared load per FMA in a tiled loop",
        (
            (
                "Register-tile: each thread computes a micro-tile (e.g. 4x4 or 8x8 outputs) so "
                "each shared load feeds several FMAs",
                1.5,
                3.0,
            ),
            (
                "Use wider shared loads (float4 / LDS.128) and, for tensor-core fragments, "
                "ldmatrix",
                1.2,
                1.5,
            ),
            ("Remove shared-memory bank conflicts (each replay is another MIO op)", 1.05, 1.3),
        ),
        REGISTER_TILE_EXAMPLE,
    ),
    "lg_throttle": StallAdvice(
        "the LSU queue for global/local memory instructions is full",
        "the kernel issues too many global or local memory instructions: scalar (32-bit) "
        "accesses, or values re-read from global memory instead of being reused",
        (
            (
                "Reuse loaded values: cache tiles in shared memory or registers instead of "
                "re-reading global memory inside the loop",
                1.5,
                4.0,
            ),
            (
                "Vectorize global accesses (float4 / 128-bit) to issue 4x fewer instructions",
                1.2,
                2.0,
            ),
            ("Remove local-memory traffic (spills, dynamically indexed local arrays)", 1.1, 1.5),
        ),
        SMEM_TILING_EXAMPLE,
    ),
    "math_pipe_throttle": StallAdvice(
        "a math pipe (FMA, ALU, FP64, tensor) is busy",
        "the kernel saturates one arithmetic pipe: it is compute-limited on that pipe",
        (
            (
                "Move matrix work to tensor cores (WMMA/mma.sync, or wgmma on Hopper) or to a "
                "library GEMM",
                2.0,
                8.0,
            ),
            (
                "Use cheaper instructions on the busy pipe: FP32 instead of FP64, fused FFMA, "
                "fast intrinsics; spread integer index math to other pipes",
                1.1,
                1.5,
            ),
        ),
    ),
    "wait": StallAdvice(
        "waiting on a fixed-latency dependency (the previous arithmetic result)",
        "long chains of dependent arithmetic: each instruction needs the previous result",
        (
            (
                "Increase instruction-level parallelism: unroll with several independent "
                "accumulators",
                1.1,
                1.5,
            ),
            ("Raise the number of eligible warps (occupancy) to hide fixed latencies", 1.05, 1.3),
        ),
    ),
    "tex_throttle": StallAdvice(
        "the texture/L1TEX pipe is saturated",
        "too many texture or L1TEX requests in flight",
        (("Reduce texture/surface instructions; fetch wider elements per request", 1.05, 1.3),),
    ),
    "membar": StallAdvice(
        "waiting on a memory fence (__threadfence, membar)",
        "memory fences in hot code force warps to wait for outstanding memory operations",
        (
            (
                "Remove or narrow fences (use block- or cluster-scoped fences, or mbarrier "
                "synchronization)",
                1.05,
                1.5,
            ),
        ),
    ),
    "gmma": StallAdvice(
        "waiting for warpgroup MMA (wgmma) results",
        "warpgroups wait on their own wgmma results: the MMA pipeline is not deep enough",
        (
            (
                "Keep more wgmma groups in flight (wgmma.wait_group with N > 0, more pipeline "
                "stages) and overlap the epilogue with the next tile's MMAs",
                1.1,
                1.4,
            ),
        ),
    ),
    "dispatch_stall": StallAdvice(
        "the dispatcher could not issue the selected instruction",
        "pipeline conflicts at dispatch, often with many register-bank or pipe conflicts",
        (
            (
                "Rebalance the instruction mix across pipes; check register bank conflicts in the "
                "inner loop",
                1.02,
                1.15,
            ),
        ),
    ),
    "drain": StallAdvice(
        "waiting for memory stores to drain at warp exit",
        "the kernel ends with many outstanding stores",
        (
            (
                "Issue stores earlier or vectorize them; give each warp more work so exit is rarer",
                1.02,
                1.2,
            ),
        ),
    ),
    "imc_miss": StallAdvice(
        "waiting on an immediate-constant cache miss",
        "constant-memory accesses miss the constant cache (divergent constant indices)",
        (
            (
                "Make constant-memory indices warp-uniform or move the table to shared memory",
                1.02,
                1.2,
            ),
        ),
    ),
    "no_instruction": StallAdvice(
        "waiting for instructions (instruction cache miss)",
        "the instruction working set is large (heavy unrolling, many template instances)",
        (("Reduce unrolling / code size in the hot loop", 1.02, 1.2),),
    ),
}
