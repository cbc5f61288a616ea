"""Twenty GPU kernels gated against their own baseline through `pytest --kernelpro-check`
with the plugin's defaults (fresh content on every timed call, the default threshold), for
`bench/gate_accuracy.py --suite plugin`: unchanged, and with a slowdown injected.

KP_SLOWDOWN=s (a fraction, default 0) makes every kernel do extra work of its own kind on a
share s of its data (a prefix of its rows, elements, batch or GEMM rows) after its real work,
on the same stream; the extra output is discarded, so the kernel stays correct and only slower.
The injected change is not exactly s (launch and tail of the extra kernels, tile rounding):
the report takes the change the gate itself measured.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

SLOWDOWN = float(os.environ.get("KP_SLOWDOWN", "0"))


def extra(fn, *tensors, dim: int = 0):
    """`fn` again on the first SLOWDOWN share of every tensor along `dim` (at least one)."""
    if SLOWDOWN <= 0:
        return
    size = tensors[0].shape[dim]
    k = max(1, round(size * SLOWDOWN))
    fn(*(t.narrow(dim, 0, k) for t in tensors))


def kp(reference, inputs, **kw):
    return pytest.mark.kernelpro(reference=reference, inputs=inputs, device="cuda", **kw)


def randn(*shape, dtype=torch.float32):
    return lambda device: tuple(torch.randn(*s, device=device, dtype=dtype) for s in shape)


# Memory-bound element-wise and row-wise work.
@kp(torch.add, randn((64 << 20,), (64 << 20,)))
def add_fp32(a, b):
    out = a + b
    extra(torch.add, a, b)
    return out


@kp(torch.mul, randn((128 << 20,), (128 << 20,), dtype=torch.bfloat16))
def mul_bf16(a, b):
    out = a * b
    extra(torch.mul, a, b)
    return out


@kp(F.gelu, randn((64 << 20,), dtype=torch.float16))
def gelu_fp16(x):
    out = F.gelu(x)
    extra(F.gelu, x)
    return out


@kp(torch.relu, randn((96 << 20,)))
def relu_fp32(x):
    out = torch.relu(x)
    extra(torch.relu, x)
    return out


def _where(x, y):
    return torch.where(x > 0, x, 2 * y)


@kp(_where, randn((64 << 20,), (64 << 20,)))
def where_fp32(x, y):
    out = torch.where(x > 0, x, 2 * y)
    extra(_where, x, y)
    return out


def _softmax(x):
    return torch.softmax(x, dim=-1)


@kp(_softmax, randn((16384, 8192)))
def softmax_fp32(x):
    out = torch.softmax(x, dim=-1)
    extra(_softmax, x)
    return out


def _layer_norm(x):
    return F.layer_norm(x, x.shape[-1:])


@kp(_layer_norm, randn((32768, 4096), dtype=torch.bfloat16))
def layer_norm_bf16(x):
    out = F.layer_norm(x, x.shape[-1:])
    extra(_layer_norm, x)
    return out


def _rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


@kp(_rms_norm, randn((16384, 8192)))
def rms_norm_fp32(x):
    out = _rms_norm(x)
    extra(_rms_norm, x)
    return out


def _sum_rows(x):
    return x.sum(dim=-1)


@kp(_sum_rows, randn((16384, 8192)))
def sum_rows_fp32(x):
    out = x.sum(dim=-1)
    extra(_sum_rows, x)
    return out


def _amax_cols(x):
    return x.amax(dim=0)


@kp(_amax_cols, randn((16384, 8192), dtype=torch.bfloat16))
def amax_cols_bf16(x):
    out = x.amax(dim=0)
    extra(_amax_cols, x, dim=1)
    return out


def _transpose(x):
    return x.t().contiguous()


@kp(_transpose, randn((8192, 8192)))
def transpose_fp32(x):
    out = x.t().contiguous()
    extra(_transpose, x)
    return out


def _cumsum(x):
    return torch.cumsum(x, dim=-1)


@kp(_cumsum, randn((8192, 8192)))
def cumsum_fp32(x):
    out = torch.cumsum(x, dim=-1)
    extra(_cumsum, x)
    return out


def _gather_inputs(device):
    table = torch.randn(1 << 20, 256, device=device)
    index = torch.randint(0, 1 << 20, (1 << 18,), device=device)
    return table, index


def _gather(table, index):
    return table.index_select(0, index)


@kp(_gather, _gather_inputs)
def gather_rows_fp32(table, index):
    out = table.index_select(0, index)
    if SLOWDOWN > 0:
        extra(lambda i: table.index_select(0, i), index)
    return out


# Compute-bound work.
def _mm(a, b):
    return a @ b


@kp(_mm, randn((4096, 4096), (4096, 4096), dtype=torch.float16))
def gemm_fp16_4096(a, b):
    out = a @ b
    if SLOWDOWN > 0:
        extra(lambda rows: rows @ b, a)
    return out


@kp(_mm, randn((8192, 8192), (8192, 8192), dtype=torch.bfloat16))
def gemm_bf16_8192(a, b):
    out = a @ b
    if SLOWDOWN > 0:
        extra(lambda rows: rows @ b, a)
    return out


def _fp32_mm(a, b):
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


@kp(_fp32_mm, randn((2048, 2048), (2048, 2048)))
def gemm_fp32_2048(a, b):
    out = _fp32_mm(a, b)
    if SLOWDOWN > 0:
        extra(lambda rows: _fp32_mm(rows, b), a)
    return out


@kp(torch.bmm, randn((64, 1024, 1024), (64, 1024, 1024), dtype=torch.bfloat16))
def bmm_bf16(a, b):
    out = torch.bmm(a, b)
    extra(torch.bmm, a, b)
    return out


def _conv_inputs(device):
    x = torch.randn(32, 128, 56, 56, device=device, dtype=torch.float16)
    w = torch.randn(128, 128, 3, 3, device=device, dtype=torch.float16)
    return x, w


def _conv(x, w):
    return F.conv2d(x, w, padding=1)


@kp(_conv, _conv_inputs)
def conv3x3_fp16(x, w):
    out = F.conv2d(x, w, padding=1)
    if SLOWDOWN > 0:
        extra(lambda images: F.conv2d(images, w, padding=1), x)
    return out


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


@kp(
    _sdpa, randn((32, 16, 1024, 128), (32, 16, 1024, 128), (32, 16, 1024, 128), dtype=torch.float16)
)
def sdpa_fp16(q, k, v):
    out = F.scaled_dot_product_attention(q, k, v)
    extra(_sdpa, q, k, v)
    return out


def _sort(x):
    return torch.sort(x, dim=-1).values


@kp(_sort, randn((8192, 4096)))
def sort_rows_fp32(x):
    out = torch.sort(x, dim=-1).values
    extra(_sort, x)
    return out
