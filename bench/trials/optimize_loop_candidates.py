"""Hand-written candidates for the optimize-loop bench (bench/trials/optimize_loop.py).

Three kernels of different kinds, each with: a wrong candidate, a slow correct one, a fast
one (a fused fast-path CUDA kernel through `pytest_kernelpro.optimize.build.load_cuda`) and one that
does not compile. The canned model answers the Programmer by mode: initial -> [wrong, slow],
optimize -> [fast, broken], debug -> [slow].
"""

from __future__ import annotations

HEAD = "import torch\nfrom torch import nn\n"

# --- bias + GELU (tanh), elementwise, memory-bound ------------------------------------------

GELU_WRONG = (
    HEAD
    + """

class ModelNew(nn.Module):
    def forward(self, x, bias):
        return torch.nn.functional.gelu(x + bias)  # the erf GELU, not the tanh one
"""
)
GELU_SLOW = (
    HEAD
    + """

class ModelNew(nn.Module):
    def forward(self, x, bias):
        y = (x + bias).double()
        out = 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
        return out.float()
"""
)
GELU_FAST = (
    HEAD
    + '''from pytest_kernelpro.optimize.build import load_cuda

_K = load_cuda(r"""
extern "C" __global__ void bias_gelu(const float4* __restrict__ x, const float4* __restrict__ b,
                                     float4* __restrict__ out, long long n4, int cols4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = x[i];
    float4 c = b[i % cols4];
    float e[4] = {v.x + c.x, v.y + c.y, v.z + c.z, v.w + c.w};
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        float y = e[k];
        e[k] = 0.5f * y * (1.0f + tanhf(0.7978845608028654f * (y + 0.044715f * y * y * y)));
    }
    out[i] = make_float4(e[0], e[1], e[2], e[3]);
}
""", name="bias_gelu_fused")


class ModelNew(nn.Module):
    def forward(self, x, bias):
        x = x.contiguous()
        out = torch.empty_like(x)
        n4 = x.numel() // 4
        _K.bias_gelu(x, bias, out, n4, x.shape[-1] // 4, grid=(n4 + 255) // 256, block=256)
        return out
'''
)
GELU_BROKEN = (
    HEAD
    + '''from pytest_kernelpro.optimize.build import load_cuda

_K = load_cuda(r"""
extern "C" __global__ void bias_gelu(const float* x, const float* b, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x
    if (i < n) out[i] = x[i] + b[i];
}
""", name="bias_gelu_broken")


class ModelNew(nn.Module):
    def forward(self, x, bias):
        return x
'''
)

# --- row softmax, a reduction, memory-bound -------------------------------------------------

SOFTMAX_WRONG = (
    HEAD
    + """

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=0)  # over the wrong dimension
"""
)
SOFTMAX_SLOW = (
    HEAD
    + """

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x.double(), dim=-1).float()
"""
)
_SOFTMAX_CU = r"""
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
// One block of 256 threads per row; float4 loads; max, sum of exp, write.
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[8];
    const float4* xr = reinterpret_cast<const float4*>(x + (long long)blockIdx.x * cols);
    float4* yr = reinterpret_cast<float4*>(y + (long long)blockIdx.x * cols);
    int n4 = cols / 4, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m = -3.402823466e38f;
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
        float4 v = xr[c];
        m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    }
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float s = 0.f;
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
        float4 v = xr[c];
        s += expf(v.x - m) + expf(v.y - m) + expf(v.z - m) + expf(v.w - m);
    }
    s = warp_sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += red[w];
    float inv = 1.f / s;
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
        float4 v = xr[c];
        yr[c] = make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv,
                            expf(v.w - m) * inv);
    }
}
"""
SOFTMAX_FAST = (
    HEAD
    + "from pytest_kernelpro.optimize.build import load_cuda\n\n_K = load_cuda(r'''"
    + _SOFTMAX_CU
    + "''', name=\"softmax_rows_fused\")\n"
    + """

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _K.softmax_rows(x, y, x.shape[-1], grid=x.shape[0], block=256)
        return y
"""
)
SOFTMAX_BROKEN = (
    HEAD
    + "from pytest_kernelpro.optimize.build import load_cuda\n\n_K = load_cuda(r'''"
    + _SOFTMAX_CU.replace("float inv = 1.f / s;", "float inv = 1.f / undeclared_sum;")
    + "''', name=\"softmax_rows_broken\")\n"
    + """

class ModelNew(nn.Module):
    def forward(self, x):
        return x
"""
)

# --- RMSNorm module with a learned weight, reduction + scale --------------------------------
# The candidates name the weight `scale`; the reference's is `weight` (inside the checker's
# wrapper: `ref.weight`). The checker hands it over by position and shape.

# The candidates' class header and weight, shared by all four.
RMS_CLASS = """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1024))
"""

RMS_WRONG = (
    HEAD
    + "\n"
    + RMS_CLASS
    + """
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # forgets the weight
"""
)
RMS_SLOW = (
    HEAD
    + "\n"
    + RMS_CLASS
    + """
    def forward(self, x):
        x64 = x.double()
        out = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale.double()
        return out.float()
"""
)
_RMS_CU = r"""
// One block of 256 threads per row of 1024 floats: one float4 per thread.
extern "C" __global__ void rms_norm(const float4* __restrict__ x, const float4* __restrict__ w,
                                    float4* __restrict__ out, int cols4, float eps) {
    __shared__ float red[8];
    const float4* xr = x + (long long)blockIdx.x * cols4;
    float4* outr = out + (long long)blockIdx.x * cols4;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4 v = xr[threadIdx.x];
    float s = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) s += red[i];
    float r = rsqrtf(s / (4.f * cols4) + eps);
    float4 g = w[threadIdx.x];
    outr[threadIdx.x] = make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
}
"""
RMS_FAST = (
    HEAD
    + "from pytest_kernelpro.optimize.build import load_cuda\n\n_K = load_cuda(r'''"
    + _RMS_CU
    + "''', name=\"rms_norm_fused\")\n"
    + "\n"
    + RMS_CLASS
    + """
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _K.rms_norm(x, self.scale, out, x.shape[-1] // 4, 1e-6, grid=x.shape[0], block=x.shape[-1] // 4)
        return out
"""
)
RMS_BROKEN = (
    HEAD
    + "from pytest_kernelpro.optimize.build import load_cuda\n\n_K = load_cuda(r'''"
    + _RMS_CU.replace("float4 g = w[threadIdx.x];", "float4 g = w[threadIdx.x]")
    + "''', name=\"rms_norm_broken\")\n"
    + "\n"
    + RMS_CLASS
    + """
    def forward(self, x):
        return x
"""
)


def _plan(
    wrong: tuple[str, str], slow: tuple[str, str], fast: tuple[str, str], broken: tuple[str, str]
) -> dict[str, list[tuple[str, str]]]:
    """What the canned model answers per mode: initial -> [wrong, slow], optimize -> [fast,
    broken], debug -> [slow] (each a (strategy, code) pair)."""
    return {"initial": [wrong, slow], "optimize": [fast, broken], "debug": [slow]}


# kernel name -> mode -> [(strategy, code)]
CANDIDATES = {
    "bias_gelu": _plan(
        ("erf GELU in one call", GELU_WRONG),
        ("tanh GELU in float64", GELU_SLOW),
        ("one fused float4 kernel: bias add and tanh GELU in registers", GELU_FAST),
        ("fused scalar kernel", GELU_BROKEN),
    ),
    "softmax_rows": _plan(
        ("torch.softmax", SOFTMAX_WRONG),
        ("softmax in float64", SOFTMAX_SLOW),
        ("one block per row: float4 loads, warp-shuffle max and sum", SOFTMAX_FAST),
        ("same, reusing the sum register", SOFTMAX_BROKEN),
    ),
    "RMSNorm": _plan(
        ("rsqrt of the mean square", RMS_WRONG),
        ("RMSNorm in float64", RMS_SLOW),
        ("one block per row, one float4 per thread, weight fused", RMS_FAST),
        ("same without the weight load's semicolon", RMS_BROKEN),
    ),
}
