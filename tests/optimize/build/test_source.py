"""Parsing kernel signatures and packing launch arguments (no compiler, no GPU)."""

from __future__ import annotations

import struct

import pytest

from pytest_kernelpro.optimize.build.launch import CudaModule, LaunchError, dims
from pytest_kernelpro.optimize.build.source import natural_layout, parse_kernels, parse_param

SOURCE = r"""
#include <cuda_fp16.h>
template <int N> __device__ float helper(float x) { return x * N; }
template <int N> __global__ void templated(float* x) {}   // no C name: not listed
__global__ void mangled(float* x) {}                        // C++ linkage: not listed
extern "C" __global__ void __launch_bounds__(128, 2) scale(
    const float* __restrict__ x,   // input
    float* y, /* output */ float alpha, int n) { }
extern "C" {
__global__ void mixed(const __half* h, unsigned long long count, double d, bool flag,
                      __half hs, __nv_bfloat16 bs, short s, unsigned char u8) {}
__global__ __cluster_dims__(2, 1, 1) void clustered(float x[], size_t n) {}
}
"""


def test_only_c_linkage_kernels_are_listed_with_their_parameters() -> None:
    kernels = parse_kernels(SOURCE)
    assert sorted(kernels) == ["clustered", "mixed", "scale"]
    scale = kernels["scale"]
    assert [(p.name, p.kind, p.size) for p in scale.params] == [
        ("x", "pointer", 8), ("y", "pointer", 8), ("alpha", "float", 4), ("n", "int", 4),
    ]  # fmt: skip
    mixed = kernels["mixed"]
    assert [p.code for p in mixed.params] == ["Q", "Q", "d", "?", "e", "H", "h", "B"]
    assert [p.kind for p in kernels["clustered"].params] == ["pointer", "int"]


def test_unknown_types_are_opaque_until_the_image_gives_their_size() -> None:
    param = parse_param("const __grid_constant__ CUtensorMap tmap")
    assert (param.kind, param.name, param.size) == ("opaque", "tmap", 0)
    assert natural_layout((param,)) is None


class FakeTensor:
    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_arguments_are_packed_at_their_natural_offsets() -> None:
    module = CudaModule("unused.cubin", parse_kernels(SOURCE))
    packed = module.scale.pack([FakeTensor(0x1000), 0x2000, 1.5, 7])
    assert packed == struct.pack("<QQfi", 0x1000, 0x2000, 1.5, 7)
    mixed = module.mixed.pack([FakeTensor(16), 2**40, 0.25, True, 1.0, 1.0, -3, 255])
    # h@0, count@8, d@16, flag@24, hs@26, bs@28, s@30, u8@32; total 33
    assert len(mixed) == 33
    assert struct.unpack_from("<Q", mixed, 8)[0] == 2**40
    assert struct.unpack_from("<e", mixed, 26)[0] == 1.0
    assert struct.unpack_from("<H", mixed, 28)[0] == 0x3F80  # bfloat16 1.0
    assert mixed[32] == 255


def test_wrong_arguments_name_the_parameter_and_the_kernel() -> None:
    module = CudaModule("unused.cubin", parse_kernels(SOURCE))
    with pytest.raises(LaunchError, match=r"argument 3 \(n\) of kernel scale.*integer type"):
        module.scale.pack([FakeTensor(1), FakeTensor(2), 1.0, 2.5])
    with pytest.raises(LaunchError, match=r"argument 0 \(x\).*expects a tensor"):
        module.scale.pack(["x", FakeTensor(2), 1.0, 2])
    with pytest.raises(LaunchError, match="takes 4 argument"):
        module.scale.pack([FakeTensor(1)])


def test_launch_dimensions() -> None:
    assert dims(128, "grid") == (128, 1, 1)
    assert dims((4, 2), "grid") == (4, 2, 1)
    for bad in (0, (1, 2, 3, 4), (2.0,), True):
        with pytest.raises(LaunchError, match="must be a positive int"):
            dims(bad, "block")
