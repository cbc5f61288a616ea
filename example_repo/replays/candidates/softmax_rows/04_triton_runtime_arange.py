"""Strategy: a Triton kernel sized by the row length at run time (does not compile:
tl.arange needs compile-time bounds)."""

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _softmax_rows(out_ptr, in_ptr, stride, n_cols):
    row = tl.program_id(0)
    offs = tl.arange(0, n_cols)
    x = tl.load(in_ptr + row * stride + offs)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * stride + offs, num / tl.sum(num, axis=0))


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        _softmax_rows[(x.shape[0],)](out, x, x.stride(0), x.shape[1])
        return out
