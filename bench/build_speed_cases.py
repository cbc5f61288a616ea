"""The candidates of `bench/build_speed.py`: fast-path CUDA sources of five kinds, each with
its inputs, its launch and a torch reference.

Each case's kernels are `extern "C" __global__` (the fast-path form). The same source, with
a generated torch binding, is what the plain `load_inline` side builds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

N_ELEM = 1 << 20
ROWS, COLS = 1024, 1024
GEMM = 512  # M = N = K


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # elementwise, reduction, tiled-gemm, mma, cute-wgmma
    source: str
    inputs: Callable[[Any], dict[str, Any]]  # torch -> tensors on the GPU
    run: Callable[[Callable[..., None], dict[str, Any], Any], Any]  # (call, inputs, torch)
    reference: Callable[[dict[str, Any], Any], Any]
    atol: float = 1e-5
    rtol: float = 1e-5
    cutlass: bool = False
    flags: tuple[str, ...] = field(default=())


def _vec(torch: Any, n: int = N_ELEM, dtype: Any = None) -> Any:
    return torch.randn(n, device="cuda", dtype=dtype or torch.float32)


def _blocks(n: int, threads: int = 256) -> int:
    return (n + threads - 1) // threads


# ----------------------------------------------------------------------------- elementwise

ADD = r"""
extern "C" __global__ void add(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""
RELU = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
"""
GELU = r"""
extern "C" __global__ void gelu_tanh(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}
"""
SCALE_BIAS = r"""
extern "C" __global__ void scale_bias(const float* __restrict__ x, float* __restrict__ y,
                                      float alpha, float beta, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = fmaf(alpha, x[i], beta);
}
"""
ADD_VEC4 = r"""
extern "C" __global__ void add_vec4(const float4* __restrict__ a, const float4* __restrict__ b,
                                    float4* __restrict__ out, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 x = a[i], y = b[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}
"""
SILU_BF16 = r"""
#include <cuda_bf16.h>
extern "C" __global__ void silu_bf16(const __nv_bfloat16* __restrict__ x,
                                     __nv_bfloat16* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __bfloat162float(x[i]);
        y[i] = __float2bfloat16(v / (1.0f + __expf(-v)));
    }
}
"""
TRANSPOSE = r"""
#define TILE 32
extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out,
                                     int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += 8)
        if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x; y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += 8)
        if (x < rows && y + j < cols) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}
"""
REVERSE_BIG_SMEM = r"""
// Reverses each 16384-float segment through 64 KiB of dynamic shared memory (above the
// 48 KiB default: needs the opt-in).
extern "C" __global__ void reverse_segments(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ float buf[];
    const int seg = 16384;
    const float* src = x + (long long)blockIdx.x * seg;
    float* dst = y + (long long)blockIdx.x * seg;
    for (int i = threadIdx.x; i < seg; i += blockDim.x) buf[i] = src[i];
    __syncthreads();
    for (int i = threadIdx.x; i < seg; i += blockDim.x) dst[i] = buf[seg - 1 - i];
}
"""

# ----------------------------------------------------------------------------- reductions

ROW_SUM = r"""
extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out,
                                   int rows, int cols) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows) return;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += x[(long long)warp * cols + c];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (lane == 0) out[warp] = s;
}
"""
ROW_MAX = r"""
extern "C" __global__ void row_max(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float part[256];
    const float* row = x + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    part[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}
"""
SOFTMAX = r"""
__device__ float block_reduce(float v, float* part, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int warps = blockDim.x / 32;
    v = lane < warps ? part[lane] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();
    return v;
}
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y,
                                        int cols) {
    __shared__ float part[32];
    const float* row = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_reduce(m, part, true);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(row[c] - m);
    s = block_reduce(s, part, false);
    float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = __expf(row[c] - m) * inv;
}
"""
LAYERNORM = r"""
extern "C" __global__ void layernorm_rows(const float* __restrict__ x, const float* __restrict__ g,
                                          const float* __restrict__ b, float* __restrict__ y,
                                          int cols, float eps) {
    __shared__ float s1[256], s2[256];
    const float* row = x + (long long)blockIdx.x * cols;
    float a = 0.0f, q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = row[c]; a += v; q += v * v; }
    s1[threadIdx.x] = a; s2[threadIdx.x] = q;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { s1[threadIdx.x] += s1[threadIdx.x + s]; s2[threadIdx.x] += s2[threadIdx.x + s]; }
        __syncthreads();
    }
    float mean = s1[0] / cols, var = s2[0] / cols - mean * mean;
    float inv = rsqrtf(var + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[(long long)blockIdx.x * cols + c] = (row[c] - mean) * inv * g[c] + b[c];
}
"""
TOTAL_SUM = r"""
extern "C" __global__ void total_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += x[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (threadIdx.x % 32 == 0) atomicAdd(out, s);
}
"""

# ----------------------------------------------------------------------------- tiled GEMM (fp32)

GEMM_NAIVE = r"""
extern "C" __global__ void gemm_naive(const float* A, const float* B, float* C, int M, int N, int K) {
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < M && c < N) {
        float s = 0.0f;
        for (int k = 0; k < K; ++k) s += A[r * K + k] * B[k * N + c];
        C[r * N + c] = s;
    }
}
"""
GEMM_SMEM = r"""
#define T 16
extern "C" __global__ void gemm_smem(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[T][T], Bs[T][T];
    int r = blockIdx.y * T + threadIdx.y, c = blockIdx.x * T + threadIdx.x;
    float s = 0.0f;
    for (int k0 = 0; k0 < K; k0 += T) {
        As[threadIdx.y][threadIdx.x] = (r < M && k0 + threadIdx.x < K) ? A[r * K + k0 + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (c < N && k0 + threadIdx.y < K) ? B[(k0 + threadIdx.y) * N + c] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < T; ++k) s += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (r < M && c < N) C[r * N + c] = s;
}
"""
GEMM_REGBLOCK = r"""
// 64x64 block tile, 256 threads, 4x4 outputs per thread; M, N, K multiples of 64 / 16.
extern "C" __global__ void __launch_bounds__(256)
gemm_regblock(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
              int M, int N, int K) {
    __shared__ float As[16][64], Bs[16][64];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int i = threadIdx.x; i < 16 * 64; i += 256) {
            int kk = i / 64, mm = i % 64;
            As[kk][mm] = A[(row0 + mm) * K + k0 + kk];
            Bs[kk][mm] = B[(k0 + kk) * N + col0 + mm];
        }
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < 16; ++k) {
            float a[4], b[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) { a[i] = As[k][ty * 4 + i]; b[i] = Bs[k][tx * 4 + i]; }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) C[(row0 + ty * 4 + i) * N + col0 + tx * 4 + j] = acc[i][j];
}
"""

# ----------------------------------------------------------------------------- tensor cores

WMMA_BF16 = r"""
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;
// C (M x N, fp32, row-major) = A (M x K, row-major) * B (K x N, row-major); a warp per 16x16 tile.
extern "C" __global__ void wmma_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C,
                                     int M, int N, int K) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tiles_n = N / 16, tm = warp / tiles_n, tn = warp % tiles_n;
    if (tm >= M / 16) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(fa, A + tm * 16 * K + k, K);
        wmma::load_matrix_sync(fb, B + k * N + tn * 16, N);
        wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(C + tm * 16 * N + tn * 16, fc, N, wmma::mem_row_major);
}
"""
WMMA_F16_SMEM = r"""
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
// 64x64 block tile, 16 warps (each a 16x16 tile), K steps of 32 staged in shared memory.
extern "C" __global__ void __launch_bounds__(512)
wmma_f16_smem(const __half* A, const __half* B, float* C, int M, int N, int K) {
    __shared__ __align__(32) __half As[64][32 + 8];
    __shared__ __align__(32) __half Bs[32][64 + 8];
    int warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
    int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += 32) {
        for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) {
            As[i / 32][i % 32] = A[(row0 + i / 32) * K + k0 + i % 32];
            Bs[i / 64][i % 64] = B[(k0 + i / 64) * N + col0 + i % 64];
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 32; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, &As[wm * 16][kk], 32 + 8);
            wmma::load_matrix_sync(fb, &Bs[kk][wn * 16], 64 + 8);
            wmma::mma_sync(fc, fa, fb, fc);
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(C + (row0 + wm * 16) * N + col0 + wn * 16, fc, N, wmma::mem_row_major);
}
"""
MMA_SYNC = r"""
#include <cuda_bf16.h>
#include <stdint.h>
// mma.sync.m16n8k16 bf16 -> fp32, operands loaded straight from global memory in the PTX
// fragment layout. C (M x N, row-major) = A (M x K, row-major) * B^T with B (N x K, row-major).
extern "C" __global__ void mma_sync_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C,
                                         int M, int N, int K) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    int tiles_n = N / 8, tm = warp / tiles_n, tn = warp % tiles_n;
    if (tm >= M / 16) return;
    int group = lane / 4, tig = lane % 4;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const __nv_bfloat16* a0 = A + (tm * 16 + group) * K;
    const __nv_bfloat16* a1 = A + (tm * 16 + group + 8) * K;
    const __nv_bfloat16* b0 = B + (tn * 8 + group) * K;
    for (int k = 0; k < K; k += 16) {
        uint32_t a[4], b[2];
        a[0] = *reinterpret_cast<const uint32_t*>(a0 + k + tig * 2);
        a[1] = *reinterpret_cast<const uint32_t*>(a1 + k + tig * 2);
        a[2] = *reinterpret_cast<const uint32_t*>(a0 + k + tig * 2 + 8);
        a[3] = *reinterpret_cast<const uint32_t*>(a1 + k + tig * 2 + 8);
        b[0] = *reinterpret_cast<const uint32_t*>(b0 + k + tig * 2);
        b[1] = *reinterpret_cast<const uint32_t*>(b0 + k + tig * 2 + 8);
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    int r0 = tm * 16 + group, c0 = tn * 8 + tig * 2;
    C[r0 * N + c0] = d[0]; C[r0 * N + c0 + 1] = d[1];
    C[(r0 + 8) * N + c0] = d[2]; C[(r0 + 8) * N + c0 + 1] = d[3];
}
"""

# ----------------------------------------------------------------------------- CuTe / wgmma

CUTE_SCALE = r"""
#include <cute/tensor.hpp>
using namespace cute;
// y = alpha * x through CuTe tensors: each block takes a 1024-element tile, each of its 256
// threads 4 elements (local_partition).
extern "C" __global__ void cute_scale(const float* x, float* y, float alpha, int n) {
    Tensor mx = make_tensor(make_gmem_ptr(x), make_shape(n));
    Tensor my = make_tensor(make_gmem_ptr(y), make_shape(n));
    Tensor gx = local_tile(mx, make_shape(Int<1024>{}), make_coord(blockIdx.x));
    Tensor gy = local_tile(my, make_shape(Int<1024>{}), make_coord(blockIdx.x));
    Tensor tx = local_partition(gx, make_layout(Int<256>{}), threadIdx.x);
    Tensor ty = local_partition(gy, make_layout(Int<256>{}), threadIdx.x);
    CUTE_UNROLL
    for (int i = 0; i < size(tx); ++i) ty(i) = alpha * tx(i);
}
"""
# CUTLASS's examples/cute/tutorial/hopper/wgmma_sm90.cu (gemm_tn), bf16 in, fp32 out, as one
# extern "C" kernel: 128x128x64 CTA tile, 3-stage cp.async pipeline, SM90 64x64x16 GMMA.
CUTE_WGMMA = r"""
#include <cute/tensor.hpp>
using namespace cute;

template <class ElementA, class ElementB, class SmemLayoutA, class SmemLayoutB>
struct SharedStorage {
  alignas(128) cute::ArrayEngine<ElementA, cosize_v<SmemLayoutA>> A;
  alignas(128) cute::ArrayEngine<ElementB, cosize_v<SmemLayoutB>> B;
};

template <class ProblemShape, class CtaTiler,
          class TA, class AStride, class ASmemLayout, class TiledCopyA,
          class TB, class BStride, class BSmemLayout, class TiledCopyB,
          class TC, class CStride, class TiledMma>
__device__ void gemm_body(ProblemShape shape_MNK, CtaTiler cta_tiler,
                          TA const* A, AStride dA, ASmemLayout, TiledCopyA copy_a,
                          TB const* B, BStride dB, BSmemLayout, TiledCopyB copy_b,
                          TC* C, CStride dC, TiledMma mma) {
  Tensor mA = make_tensor(make_gmem_ptr(A), select<0,2>(shape_MNK), dA);
  Tensor mB = make_tensor(make_gmem_ptr(B), select<1,2>(shape_MNK), dB);
  Tensor mC = make_tensor(make_gmem_ptr(C), select<0,1>(shape_MNK), dC);
  auto cta_coord = make_coord(blockIdx.x, blockIdx.y, _);
  Tensor gA = local_tile(mA, cta_tiler, cta_coord, Step<_1, X,_1>{});
  Tensor gB = local_tile(mB, cta_tiler, cta_coord, Step< X,_1,_1>{});
  Tensor gC = local_tile(mC, cta_tiler, cta_coord, Step<_1,_1, X>{});
  extern __shared__ char shared_memory[];
  using Storage = SharedStorage<TA, TB, ASmemLayout, BSmemLayout>;
  Storage& smem = *reinterpret_cast<Storage*>(shared_memory);
  Tensor sA = make_tensor(make_smem_ptr(smem.A.begin()), ASmemLayout{});
  Tensor sB = make_tensor(make_smem_ptr(smem.B.begin()), BSmemLayout{});
  ThrCopy thr_copy_a = copy_a.get_slice(threadIdx.x);
  Tensor tAgA = thr_copy_a.partition_S(gA);
  Tensor tAsA = thr_copy_a.partition_D(as_position_independent_swizzle_tensor(sA));
  ThrCopy thr_copy_b = copy_b.get_slice(threadIdx.x);
  Tensor tBgB = thr_copy_b.partition_S(gB);
  Tensor tBsB = thr_copy_b.partition_D(as_position_independent_swizzle_tensor(sB));
  ThrMMA thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);
  Tensor tCsB = thr_mma.partition_B(sB);
  Tensor tCgC = thr_mma.partition_C(gC);
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);
  Tensor tCrC = thr_mma.make_fragment_C(tCgC);
  auto K_TILE_MAX = size<3>(tAgA);
  auto K_PIPE_MAX = size<3>(tAsA);
  CUTE_UNROLL
  for (int k = 0; k < K_PIPE_MAX - 1; ++k) {
    copy(copy_a, tAgA(_,_,_,k), tAsA(_,_,_,k));
    copy(copy_b, tBgB(_,_,_,k), tBsB(_,_,_,k));
    cp_async_fence();
  }
  clear(tCrC);
  __syncthreads();
  int k_pipe_read = 0, k_pipe_write = K_PIPE_MAX - 1;
  CUTE_NO_UNROLL
  for (int k_tile = 0; k_tile < K_TILE_MAX; ++k_tile) {
    int k_tile_next = k_tile + (K_PIPE_MAX - 1);
    k_tile_next = (k_tile_next >= K_TILE_MAX) ? K_TILE_MAX - 1 : k_tile_next;
    copy(copy_a, tAgA(_,_,_,k_tile_next), tAsA(_,_,_,k_pipe_write));
    copy(copy_b, tBgB(_,_,_,k_tile_next), tBsB(_,_,_,k_pipe_write));
    cp_async_fence();
    ++k_pipe_write;
    k_pipe_write = (k_pipe_write == K_PIPE_MAX) ? 0 : k_pipe_write;
    cp_async_wait<0>();
    warpgroup_fence_operand(tCrC);
    warpgroup_arrive();
    cute::gemm(mma, tCrA(_,_,_,k_pipe_read), tCrB(_,_,_,k_pipe_read), tCrC);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tCrC);
    ++k_pipe_read;
    k_pipe_read = (k_pipe_read == K_PIPE_MAX) ? 0 : k_pipe_read;
  }
  CUTE_UNROLL
  for (int i = 0; i < size(tCrC); ++i) tCgC(i) = tCrC(i);
}

// C (M x N, column-major: ldC = M) = A (M x K, row-major) * B^T, B (N x K, row-major).
// M, N multiples of 128, K of 64. 128 threads, 98304 bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(128)
wgmma_tn(const bfloat16_t* A, const bfloat16_t* B, float* C, int M, int N, int K) {
  auto prob_shape = make_shape(M, N, K);
  auto dA = make_stride(K, Int<1>{});
  auto dB = make_stride(K, Int<1>{});
  auto dC = make_stride(Int<1>{}, M);
  auto bM = Int<128>{}; auto bN = Int<128>{}; auto bK = Int<64>{}; auto bP = Int<3>{};
  auto cta_tiler = make_shape(bM, bN, bK);
  auto sA = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(bM, bK, bP));
  auto sB = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(bN, bK, bP));
  TiledCopy copyA = make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEALWAYS<uint128_t>, bfloat16_t>{},
                                    Layout<Shape<_16,_8>, Stride<_8,_1>>{}, Layout<Shape<_1,_8>>{});
  TiledCopy copyB = make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEALWAYS<uint128_t>, bfloat16_t>{},
                                    Layout<Shape<_16,_8>, Stride<_8,_1>>{}, Layout<Shape<_1,_8>>{});
  TiledMMA tiled_mma = make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{});
  gemm_body(prob_shape, cta_tiler, A, dA, sA, copyA, B, dB, sB, copyB, C, dC, tiled_mma);
}
"""
WGMMA_SMEM = 2 * 128 * 64 * 3 * 2  # A and B stages, bf16


# ----------------------------------------------------------------------------- the cases


def _ew(torch):
    return {"a": _vec(torch), "b": _vec(torch)}


def _rows(torch):
    return {"x": torch.randn(ROWS, COLS, device="cuda")}


def _gemm32(torch):
    return {
        "A": torch.randn(GEMM, GEMM, device="cuda") / 8,
        "B": torch.randn(GEMM, GEMM, device="cuda") / 8,
    }


def _gemm16(torch, dtype):
    return {
        "A": (torch.randn(GEMM, GEMM, device="cuda") / 8).to(dtype),
        "B": (torch.randn(GEMM, GEMM, device="cuda") / 8).to(dtype),
    }


def _out(torch, like, shape=None, dtype=None):
    return torch.empty(shape or like.shape, device="cuda", dtype=dtype or like.dtype)


def run_add(call, i, torch):
    out = _out(torch, i["a"])
    call("add", i["a"], i["b"], out, i["a"].numel(), grid=_blocks(N_ELEM), block=256)
    return out


def run_relu(call, i, torch):
    out = _out(torch, i["a"])
    call("relu", i["a"], out, N_ELEM, grid=_blocks(N_ELEM), block=256)
    return out


def run_gelu(call, i, torch):
    out = _out(torch, i["a"])
    call("gelu_tanh", i["a"], out, N_ELEM, grid=_blocks(N_ELEM), block=256)
    return out


def run_scale_bias(call, i, torch):
    out = _out(torch, i["a"])
    call("scale_bias", i["a"], out, 1.5, -0.25, N_ELEM, grid=264, block=256)
    return out


def run_add_vec4(call, i, torch):
    out = _out(torch, i["a"])
    call("add_vec4", i["a"], i["b"], out, N_ELEM // 4, grid=_blocks(N_ELEM // 4), block=256)
    return out


def run_silu(call, i, torch):
    x = i["a"].to(torch.bfloat16)
    out = _out(torch, x)
    call("silu_bf16", x, out, N_ELEM, grid=_blocks(N_ELEM), block=256)
    return out


def run_transpose(call, i, torch):
    x = i["x"]
    out = _out(torch, x, (COLS, ROWS))
    call("transpose", x, out, ROWS, COLS, grid=(COLS // 32, ROWS // 32), block=(32, 8))
    return out


def run_reverse(call, i, torch):
    out = _out(torch, i["a"])
    call("reverse_segments", i["a"], out, grid=N_ELEM // 16384, block=1024, shared_mem=65536)
    return out


def run_row_sum(call, i, torch):
    out = torch.empty(ROWS, device="cuda")
    call("row_sum", i["x"], out, ROWS, COLS, grid=ROWS * 32 // 256, block=256)
    return out


def run_row_max(call, i, torch):
    out = torch.empty(ROWS, device="cuda")
    call("row_max", i["x"], out, COLS, grid=ROWS, block=256)
    return out


def run_softmax(call, i, torch):
    out = _out(torch, i["x"])
    call("softmax_rows", i["x"], out, COLS, grid=ROWS, block=256)
    return out


def run_layernorm(call, i, torch):
    g = torch.linspace(0.5, 1.5, COLS, device="cuda")
    b = torch.linspace(-0.1, 0.1, COLS, device="cuda")
    out = _out(torch, i["x"])
    call("layernorm_rows", i["x"], g, b, out, COLS, 1e-5, grid=ROWS, block=256)
    return out


def run_total_sum(call, i, torch):
    out = torch.zeros(1, device="cuda")
    call("total_sum", i["a"], out, N_ELEM, grid=264, block=256)
    return out


def run_gemm(kernel, block, grid_of):
    def run(call, i, torch):
        out = torch.empty(GEMM, GEMM, device="cuda")
        call(kernel, i["A"], i["B"], out, GEMM, GEMM, GEMM, grid=grid_of(), block=block)
        return out

    return run


def run_wmma_f16(call, i, torch):
    out = torch.empty(GEMM, GEMM, device="cuda")
    call("wmma_f16_smem", i["A"], i["B"], out, GEMM, GEMM, GEMM, grid=(GEMM // 64, GEMM // 64),
         block=512)  # fmt: skip
    return out


def run_mma_sync(call, i, torch):
    out = torch.empty(GEMM, GEMM, device="cuda")
    warps = (GEMM // 16) * (GEMM // 8)
    call("mma_sync_bf16", i["A"], i["B"], out, GEMM, GEMM, GEMM, grid=warps * 32 // 128, block=128)
    return out


def run_cute_scale(call, i, torch):
    out = _out(torch, i["a"])
    call("cute_scale", i["a"], out, 0.5, N_ELEM, grid=N_ELEM // 1024, block=256)
    return out


def run_wgmma(call, i, torch):
    out = torch.empty(GEMM, GEMM, device="cuda")  # column-major M x N = row-major N x M
    call("wgmma_tn", i["A"], i["B"], out, GEMM, GEMM, GEMM, grid=(GEMM // 128, GEMM // 128),
         block=128, shared_mem=WGMMA_SMEM)  # fmt: skip
    return out


def _mm(i):
    return i["A"].float() @ i["B"].float()


CASES: list[Case] = [
    Case("add", "elementwise", ADD, _ew, run_add, lambda i, t: i["a"] + i["b"]),
    Case("relu", "elementwise", RELU, _ew, run_relu, lambda i, t: t.relu(i["a"])),
    Case("gelu_tanh", "elementwise", GELU, _ew, run_gelu,
         lambda i, t: t.nn.functional.gelu(i["a"], approximate="tanh"), 1e-5, 1e-4),
    Case("scale_bias", "elementwise", SCALE_BIAS, _ew, run_scale_bias,
         lambda i, t: 1.5 * i["a"] - 0.25),
    Case("add_vec4", "elementwise", ADD_VEC4, _ew, run_add_vec4, lambda i, t: i["a"] + i["b"]),
    Case("silu_bf16", "elementwise", SILU_BF16, _ew, run_silu,
         lambda i, t: t.nn.functional.silu(i["a"].to(t.bfloat16).float()).to(t.bfloat16),
         1e-2, 1e-2),
    Case("transpose", "elementwise", TRANSPOSE, _rows, run_transpose, lambda i, t: i["x"].T),
    Case("reverse_64k_smem", "elementwise", REVERSE_BIG_SMEM, _ew, run_reverse,
         lambda i, t: i["a"].view(-1, 16384).flip(1).reshape(-1)),
    Case("row_sum", "reduction", ROW_SUM, _rows, run_row_sum, lambda i, t: i["x"].sum(1),
         1e-3, 1e-4),
    Case("row_max", "reduction", ROW_MAX, _rows, run_row_max, lambda i, t: i["x"].amax(1)),
    Case("softmax", "reduction", SOFTMAX, _rows, run_softmax,
         lambda i, t: t.softmax(i["x"], 1), 1e-6, 1e-4),
    Case("layernorm", "reduction", LAYERNORM, _rows, run_layernorm,
         lambda i, t: t.nn.functional.layer_norm(
             i["x"], (COLS,), t.linspace(0.5, 1.5, COLS, device="cuda"),
             t.linspace(-0.1, 0.1, COLS, device="cuda"), 1e-5), 1e-4, 1e-4),
    Case("total_sum", "reduction", TOTAL_SUM, _ew, run_total_sum,
         lambda i, t: i["a"].sum().reshape(1), 1e-1, 1e-4),
    Case("gemm_naive", "tiled-gemm", GEMM_NAIVE, _gemm32,
         run_gemm("gemm_naive", (16, 16), lambda: (GEMM // 16, GEMM // 16)),
         lambda i, t: _mm(i), 1e-3, 1e-3),
    Case("gemm_smem16", "tiled-gemm", GEMM_SMEM, _gemm32,
         run_gemm("gemm_smem", (16, 16), lambda: (GEMM // 16, GEMM // 16)),
         lambda i, t: _mm(i), 1e-3, 1e-3),
    Case("gemm_regblock64", "tiled-gemm", GEMM_REGBLOCK, _gemm32,
         run_gemm("gemm_regblock", 256, lambda: (GEMM // 64, GEMM // 64)),
         lambda i, t: _mm(i), 1e-3, 1e-3),
    Case("wmma_bf16", "mma", WMMA_BF16, lambda t: _gemm16(t, t.bfloat16),
         run_gemm("wmma_bf16", 128, lambda: (GEMM // 16) * (GEMM // 16) * 32 // 128),
         lambda i, t: _mm(i), 1e-2, 1e-2),
    Case("wmma_f16_smem", "mma", WMMA_F16_SMEM, lambda t: _gemm16(t, t.float16), run_wmma_f16,
         lambda i, t: _mm(i), 1e-2, 1e-2),
    Case("mma_sync_bf16", "mma", MMA_SYNC, lambda t: _gemm16(t, t.bfloat16), run_mma_sync,
         lambda i, t: i["A"].float() @ i["B"].float().T, 1e-2, 1e-2),
    Case("cute_scale", "cute-wgmma", CUTE_SCALE, _ew, run_cute_scale,
         lambda i, t: 0.5 * i["a"], cutlass=True),
    Case("cute_wgmma_tn", "cute-wgmma", CUTE_WGMMA, lambda t: _gemm16(t, t.bfloat16), run_wgmma,
         lambda i, t: (i["A"].float() @ i["B"].float().T).T, 1e-2, 1e-2, cutlass=True),
]  # fmt: skip
