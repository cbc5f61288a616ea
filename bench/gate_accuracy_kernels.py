"""The kernels of `bench/gate_accuracy.py --suite kernels`: 22 kinds of GPU work.

Each kernel has one dimension `n` that its work is proportional to (elements or rows for the
memory-bound ones, the inner dimension K of the GEMMs, the batch of the batched GEMM, the
convolutions and attention), so a slowdown can be injected as extra work of the same kind on
the GPU: the slow variant is the same op on more of that dimension, its inputs allocated
separately (no strided views that could take another code path). `build(n, small)` returns a
zero-argument launch; `small=True` shrinks every other dimension for a CPU dry run.

GEMMs grow K (the tile count, and with it wave quantization, stays the same, so time is
linear in K); row-wise ops grow rows; convolutions and attention grow the batch (in steps of
one image or one sequence: the granularity shows in the measured change, which the report
prints next to the nominal one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Launch = Callable[[], object]


@dataclass(frozen=True)
class KernelSpec:
    name: str
    kind: str  # "memory" | "compute"
    what: str
    n0: int  # the scaled dimension at the base size (GPU)
    n0_small: int  # the same for the CPU dry run
    build: Callable[[int, bool], Launch]
    granule: int = 1  # the scaled dimension moves in steps of this
    tf32: bool = False  # allow TF32 in matmul and cuDNN while this kernel runs
    weight: float = 1.0  # share of the time budget, relative to the others


_DEVICE = ["cuda"]


def set_device(device: str) -> None:
    _DEVICE[0] = device


def _t(*shape: int, dtype: Any = None, channels_last: bool = False) -> Any:
    import torch

    x = torch.randn(*shape, device=_DEVICE[0], dtype=dtype or torch.float32)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _bf16() -> Any:
    import torch

    return torch.bfloat16


def _fp16() -> Any:
    import torch

    return torch.float16


def add_fp32(n: int, small: bool) -> Launch:
    import torch

    a, b, c = _t(n), _t(n), _t(n)
    return lambda: torch.add(a, b, out=c)


def mul_bf16(n: int, small: bool) -> Launch:
    import torch

    a, b, c = _t(n, dtype=_bf16()), _t(n, dtype=_bf16()), _t(n, dtype=_bf16())
    return lambda: torch.mul(a, b, out=c)


def gelu_fp16(n: int, small: bool) -> Launch:
    import torch

    x = _t(n, dtype=_fp16())
    return lambda: torch.nn.functional.gelu(x)


def transpose_fp32(n: int, small: bool) -> Launch:
    x = _t(n, 256 if small else 8192)
    return lambda: x.t().contiguous()


def sum_rows_fp32(n: int, small: bool) -> Launch:
    x = _t(n, 256 if small else 8192)
    return lambda: x.sum(dim=1)


def sum_rows_small(n: int, small: bool) -> Launch:
    x = _t(n, 64 if small else 1024)
    return lambda: x.sum(dim=1)


def amax_cols_bf16(n: int, small: bool) -> Launch:
    x = _t(n, 128 if small else 4096, dtype=_bf16())
    return lambda: x.amax(dim=0)


def softmax_fp32(n: int, small: bool) -> Launch:
    import torch

    x = _t(n, 256 if small else 4096)
    return lambda: torch.softmax(x, dim=-1)


def softmax_fp16_small(n: int, small: bool) -> Launch:
    import torch

    x = _t(n, 64 if small else 1024, dtype=_fp16())
    return lambda: torch.softmax(x, dim=-1)


def layer_norm_bf16(n: int, small: bool) -> Launch:
    import torch

    h = 256 if small else 4096
    x, w, b = _t(n, h, dtype=_bf16()), _t(h, dtype=_bf16()), _t(h, dtype=_bf16())
    return lambda: torch.nn.functional.layer_norm(x, (h,), w, b)


def rms_norm_fp32(n: int, small: bool) -> Launch:
    import torch

    h = 256 if small else 8192
    x, w = _t(n, h), _t(h)
    return lambda: torch.nn.functional.rms_norm(x, (h,), w)


def _gemm(m: int, nn: int, dtype: Callable[[], Any] | None) -> Callable[[int, bool], Launch]:
    def build(k: int, small: bool) -> Launch:
        import torch

        mm, ncols = (64, 64) if small else (m, nn)
        d = dtype() if dtype else None
        a, b = _t(mm, k, dtype=d), _t(k, ncols, dtype=d)
        return lambda: torch.matmul(a, b)

    return build


def bmm_bf16(n: int, small: bool) -> Launch:
    import torch

    s = 32 if small else 512
    a, b = _t(n, s, s, dtype=_bf16()), _t(n, s, s, dtype=_bf16())
    return lambda: torch.bmm(a, b)


def conv_fp16_nhwc(n: int, small: bool) -> Launch:
    import torch

    c, hw = (16, 8) if small else (256, 28)
    x = _t(n, c, hw, hw, dtype=_fp16(), channels_last=True)
    w = _t(c, c, 3, 3, dtype=_fp16(), channels_last=True)
    return lambda: torch.nn.functional.conv2d(x, w, padding=1)


def conv_fp32_tf32(n: int, small: bool) -> Launch:
    import torch

    c, hw = (16, 8) if small else (128, 56)
    x, w = _t(n, c, hw, hw), _t(c, c, 3, 3)
    return lambda: torch.nn.functional.conv2d(x, w, padding=1)


def conv_depthwise_fp16(n: int, small: bool) -> Launch:
    import torch

    c, hw = (16, 8) if small else (512, 56)
    x = _t(n, c, hw, hw, dtype=_fp16(), channels_last=True)
    w = _t(c, 1, 3, 3, dtype=_fp16())
    return lambda: torch.nn.functional.conv2d(x, w, padding=1, groups=c)


def _sdpa(seq: int, dim: int) -> Callable[[int, bool], Launch]:
    """Attention over `n` heads of one batch: the flash kernel's grid is heads x query
    blocks, so time is linear in the heads (the sequence would be quadratic)."""

    def build(n: int, small: bool) -> Launch:
        import torch

        s, d = (32, 16) if small else (seq, dim)
        q, k, v = (_t(1, n, s, d, dtype=_fp16()) for _ in range(3))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)

    return build


SUITE: tuple[KernelSpec, ...] = (
    KernelSpec("add_fp32_20M", "memory", "c = a + b, fp32", 20_000_000, 200_000, add_fp32),
    KernelSpec("add_fp32_64K", "memory", "c = a + b, fp32 (small)", 65_536, 4096, add_fp32),
    KernelSpec("mul_bf16_64M", "memory", "c = a * b, bf16", 64_000_000, 200_000, mul_bf16),
    KernelSpec("gelu_fp16_32M", "memory", "gelu, fp16", 32_000_000, 200_000, gelu_fp16),
    KernelSpec("transpose_fp32", "memory", "x.t().contiguous(), n x 8192", 4096, 64,
               transpose_fp32),
    KernelSpec("sum_rows_fp32", "memory", "row sums, n x 8192", 8192, 64, sum_rows_fp32),
    KernelSpec("sum_rows_small", "memory", "row sums, n x 1024 (small)", 1024, 64,
               sum_rows_small),
    KernelSpec("amax_cols_bf16", "memory", "column max, n x 4096, bf16", 16384, 64,
               amax_cols_bf16),
    KernelSpec("softmax_fp32", "memory", "softmax, n x 4096", 16384, 64, softmax_fp32),
    KernelSpec("softmax_fp16_small", "memory", "softmax, n x 1024, fp16 (small)", 256, 16,
               softmax_fp16_small),
    KernelSpec("layer_norm_bf16", "memory", "layer_norm, n x 4096, bf16", 16384, 64,
               layer_norm_bf16),
    KernelSpec("rms_norm_fp32", "memory", "rms_norm, n x 8192", 4096, 64, rms_norm_fp32),
    KernelSpec("gemm_fp16_4096", "compute", "4096 x 4096 x K matmul, fp16", 4096, 256,
               _gemm(4096, 4096, _fp16), granule=64),
    KernelSpec("gemm_bf16_8192_power", "compute",
               "8192 x 8192 x K matmul, bf16, random data (power-limited)", 8192, 256,
               _gemm(8192, 8192, _bf16), granule=64, weight=2.0),
    KernelSpec("gemm_tf32_4096", "compute", "4096 x 4096 x K matmul, fp32 with TF32", 4096,
               256, _gemm(4096, 4096, None), granule=64, tf32=True),
    KernelSpec("gemm_fp32_2048", "compute", "2048 x 2048 x K matmul, fp32 (no TF32)", 2048,
               256, _gemm(2048, 2048, None), granule=64),
    KernelSpec("gemm_fp16_512_small", "compute", "512 x 512 x K matmul, fp16 (small)", 512,
               256, _gemm(512, 512, _fp16), granule=8),
    KernelSpec("bmm_bf16_512", "compute", "n x (512 x 512 @ 512 x 512), bf16", 128, 4,
               bmm_bf16),
    KernelSpec("conv3x3_fp16_nhwc", "compute", "conv 3x3, 256 -> 256 ch, 28x28, fp16 NHWC",
               64, 2, conv_fp16_nhwc),
    KernelSpec("conv3x3_fp32_tf32", "compute", "conv 3x3, 128 -> 128 ch, 56x56, fp32 (TF32)",
               64, 2, conv_fp32_tf32, tf32=True),
    KernelSpec("conv_depthwise_fp16", "memory", "depthwise conv 3x3, 512 ch, 56x56, fp16",
               64, 2, conv_depthwise_fp16),
    KernelSpec("sdpa_fp16_2048", "compute", "attention, n heads x 2048 x 128, fp16", 128, 4,
               _sdpa(2048, 128)),
    KernelSpec("sdpa_fp16_small", "compute", "attention, n heads x 256 x 64, fp16 (small)",
               32, 4, _sdpa(256, 64)),
)  # fmt: skip


@contextlib.contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """TF32 for matmul and cuDNN on (for a TF32 kernel) or off, restored after."""
    import torch

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
