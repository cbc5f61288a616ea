"""Strategy: a fast-path CUDA kernel with float4 loads and stores, four GELUs per thread in
registers (does not compile: a missing semicolon after the index computation)."""

import torch
from torch import nn

from pytest_kernelpro.optimize.build import load_cuda

_K = load_cuda(
    r"""
extern "C" __global__ void gelu4(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x
    if (i >= n4) return;
    float4 v = x[i];
    float e[4] = {v.x, v.y, v.z, v.w};
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        float a = e[k];
        e[k] = 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
    }
    y[i] = make_float4(e[0], e[1], e[2], e[3]);
}
""",
    name="mingpt_gelu4",
)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n4 = x.numel() // 4
        _K.gelu4(x, y, n4, grid=(n4 + 255) // 256, block=256)
        return y
