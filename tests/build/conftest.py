"""Fixtures of the build tests: nvcc (or a skip), and a fresh build cache per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.build.cache import BuildCache
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


@pytest.fixture
def nvcc() -> str:
    return require_tool("nvcc")


@pytest.fixture
def cache(tmp_path: Path) -> BuildCache:
    return BuildCache(tmp_path / "cache", writable=True)
