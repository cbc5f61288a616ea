"""Strategy: a Triton kernel with one program per row: the whole row (4096 fp32 = 16 KB)
stays in registers, so max, exp, sum and the division cost one DRAM read and one write."""

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _softmax_rows(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * stride + offs, num / tl.sum(num, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        _softmax_rows[(rows,)](out, x, x.stride(0), cols, BLOCK=block, num_warps=8)
        return out
