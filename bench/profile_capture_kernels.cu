// The load_inline module of bench/profile_capture.py: 12 deliberately different kernels.
// No torch headers here: nvcc compiles this file in seconds; the torch::Tensor wrappers
// are in profile_capture_wrappers.cpp and call the plain launchers at the bottom.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
using namespace nvcuda;

__global__ void naive_matmul_kernel(const float* A, const float* B, float* C, int N) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < N && col < N) {
    float acc = 0.f;
    for (int k = 0; k < N; ++k) acc += A[row * N + k] * B[k * N + col];
    C[row * N + col] = acc;
  }
}

#define TILE 32
__global__ void tiled_matmul_kernel(const float* A, const float* B, float* C, int N) {
  __shared__ float As[TILE][TILE + 1];
  __shared__ float Bs[TILE][TILE + 1];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < N; t += TILE) {
    As[threadIdx.y][threadIdx.x] = A[row * N + t + threadIdx.x];
    Bs[threadIdx.y][threadIdx.x] = B[(t + threadIdx.y) * N + col];
    __syncthreads();
    #pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  C[row * N + col] = acc;
}

__global__ void wmma_matmul_kernel(const half* A, const half* B, float* C, int N) {
  int warp_m = (blockIdx.x * blockDim.x + threadIdx.x) / 32, warp_n = blockIdx.y;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < N; k += 16) {
    wmma::load_matrix_sync(a, A + warp_m * 16 * N + k, N);
    wmma::load_matrix_sync(b, B + k * N + warp_n * 16, N);
    wmma::mma_sync(acc, a, b, acc);
  }
  wmma::store_matrix_sync(C + warp_m * 16 * N + warp_n * 16, acc, N, wmma::mem_row_major);
}

// one thread per row: neighbouring lanes read addresses a row apart (uncoalesced)
__global__ void naive_softmax_kernel(const float* x, float* y, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + (size_t)r * cols; float* yr = y + (size_t)r * cols;
  float m = -INFINITY;
  for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += __expf(xr[c] - m);
  for (int c = 0; c < cols; ++c) yr[c] = __expf(xr[c] - m) / s;
}

// one warp per row, shuffles for the reductions: coalesced
__global__ void warp_softmax_kernel(const float* x, float* y, int rows, int cols) {
  int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= rows) return;
  const float* xr = x + (size_t)warp * cols; float* yr = y + (size_t)warp * cols;
  float m = -INFINITY;
  for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  float s = 0.f;
  for (int c = lane; c < cols; c += 32) s += __expf(xr[c] - m);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffff, s, o);
  for (int c = lane; c < cols; c += 32) yr[c] = __expf(xr[c] - m) / s;
}

__global__ void copy_vec4_kernel(const float4* __restrict__ in, float4* __restrict__ out, int n4) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) out[i] = in[i];
}

__global__ void copy_scalar_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// 96 live values under a 32-register cap: real register spills (STL/LDL)
__global__ void __launch_bounds__(1024, 2) spill_kernel(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v[96];
  #pragma unroll
  for (int k = 0; k < 96; ++k) v[k] = in[(i + k * 97) % n];
  float acc = 0.f;
  #pragma unroll
  for (int r = 0; r < 4; ++r)
    #pragma unroll
    for (int k = 0; k < 96; ++k) acc += v[k] * v[(k * 7 + r) % 96];
  out[i] = acc;
}

// column reads of an unpadded 32x32 tile: a 32-way shared-memory bank conflict
__global__ void bank_conflict_kernel(const float* in, float* out, int n) {
  __shared__ float tile[32][32];
  int base = blockIdx.x * 1024, tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  if (base + threadIdx.x >= n) return;
  tile[ty][tx] = in[base + threadIdx.x];
  __syncthreads();
  float acc = 0.f;
  #pragma unroll 4
  for (int k = 0; k < 32; ++k) acc += tile[(tx + k) % 32][ty] * tile[tx][k];
  out[base + threadIdx.x] = acc;
}

// gather with a large stride: every lane in its own sector
__global__ void strided_copy_kernel(const float* in, float* out, int n, int stride) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[(long long)i * stride % n];
}

__global__ void fp64_poly_kernel(const double* x, double* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double v = x[i], acc = 0.0;
  #pragma unroll 8
  for (int k = 0; k < 256; ++k) acc = fma(acc, v, 1.0 / (k + 1));
  y[i] = acc;
}

// one warp of work: launch-bound when called in a loop
__global__ void tiny_kernel(float* x) { x[threadIdx.x] += 1.0f; }

// --- launchers (raw pointers; called from profile_capture_wrappers.cpp) ---
void launch_naive_matmul(const float* A, const float* B, float* C, int N) {
  naive_matmul_kernel<<<dim3((N + 15) / 16, (N + 15) / 16), dim3(16, 16)>>>(A, B, C, N);
}
void launch_tiled_matmul(const float* A, const float* B, float* C, int N) {
  tiled_matmul_kernel<<<dim3(N / TILE, N / TILE), dim3(TILE, TILE)>>>(A, B, C, N);
}
void launch_wmma_matmul(const void* A, const void* B, float* C, int N) {
  wmma_matmul_kernel<<<dim3(N / 64, N / 16), 128>>>((const half*)A, (const half*)B, C, N);
}
void launch_naive_softmax(const float* x, float* y, int rows, int cols) {
  naive_softmax_kernel<<<(rows + 127) / 128, 128>>>(x, y, rows, cols);
}
void launch_warp_softmax(const float* x, float* y, int rows, int cols) {
  warp_softmax_kernel<<<(rows * 32 + 255) / 256, 256>>>(x, y, rows, cols);
}
void launch_copy_vec4(const float* x, float* y, int n) {
  int n4 = n / 4;
  copy_vec4_kernel<<<(n4 + 255) / 256, 256>>>((const float4*)x, (float4*)y, n4);
}
void launch_copy_scalar(const float* x, float* y, int n) {
  copy_scalar_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
void launch_spill(const float* x, float* y, int n) {
  spill_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
void launch_bank_conflict(const float* x, float* y, int n) {
  bank_conflict_kernel<<<(n + 1023) / 1024, 1024>>>(x, y, n);
}
void launch_strided_copy(const float* x, float* y, int n, int stride) {
  strided_copy_kernel<<<(n + 255) / 256, 256>>>(x, y, n, stride);
}
void launch_fp64_poly(const double* x, double* y, int n) {
  fp64_poly_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
void launch_tiny(float* x) { tiny_kernel<<<1, 32>>>(x); }
