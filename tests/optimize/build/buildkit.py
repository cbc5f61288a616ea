"""Shared constants and helpers of the build tests (a module name of its own: test modules
of other folders import their own `conftest`)."""

from __future__ import annotations

import pytest

from pytest_kernelpro.profile.binaries import find_tool

ARCH = "sm_90a"  # what the H200 runs; nvcc builds it on any machine

ADD_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256)
add(const float* __restrict__ a, const float* __restrict__ b, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""


def require_tool(name: str) -> str:
    """Path of a CUDA tool, or skip naming the missing tool and how to get it."""
    path = find_tool(name)
    if path is None:
        hint = {
            "nvcc": "install the CUDA toolkit (nvcc)",
            "cuobjdump": "pip install nvidia-cuda-cuobjdump",
        }.get(name, f"install {name}")
        pytest.skip(f"{name} not found: {hint}")
    return path


# A fast-path candidate as the Programmer writes it (tests/optimize/build/test_prebuild.py).
CANDIDATE = '''
import torch
import torch.nn as nn
from pytest_kernelpro.optimize.build import load_cuda

HEADER = r"""
#include <cuda_fp16.h>
"""
KERNEL = HEADER + r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i] + OFFSET;
}
"""
kernels = load_cuda(KERNEL, name="add", flags=["-DOFFSET=0.0f"])


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        kernels.add(x, x, out, x.numel(), grid=(x.numel() + 255) // 256, block=256)
        return out
'''
