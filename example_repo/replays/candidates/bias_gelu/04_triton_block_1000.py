"""Strategy: the fused Triton kernel with 1000-element blocks so rows of 1000 align (does not
compile: tl.arange needs a power-of-two range)."""

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _bias_gelu(x_ptr, b_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(x_ptr + offs, mask=mask, other=0.0) + tl.load(
        b_ptr + offs % cols, mask=mask, other=0.0
    )
    z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
    tanh = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
    tl.store(out_ptr + offs, 0.5 * y * (1.0 + tanh), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _bias_gelu[(triton.cdiv(n, 1000),)](x, bias.contiguous(), out, n, x.shape[-1], BLOCK=1000)
        return out
