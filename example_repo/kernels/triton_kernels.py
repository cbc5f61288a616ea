"""Triton kernels (GPU only). `triton` is imported lazily so CPU machines can collect."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _softmax_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, row_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(in_ptr + row * row_stride + offs, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * row_stride + offs, num / tl.sum(num, axis=0), mask=mask)

    return softmax_kernel


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax, one program per row (rows up to 16k columns)."""
    import triton

    rows, cols = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    _softmax_kernel()[(rows,)](
        out, x, x.stride(0), cols, BLOCK=block, num_warps=8 if block >= 2048 else 4
    )
    return out


@functools.cache
def _add_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    return add_kernel


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise x + y."""
    import triton

    out = torch.empty_like(x)
    n = x.numel()
    _add_kernel()[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out
