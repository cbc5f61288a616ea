"""Strategy: one Triton program per row with the whole row (4096 bf16 = 8 KB) in registers:
one read and one write per element, the sum of squares in fp32, 128-bit loads, and the
weight loaded once per program."""

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _rms_norm_rows(out_ptr, x_ptr, w_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = (x * rstd).to(out_ptr.dtype.element_ty) * w.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        out = torch.empty_like(x2)
        block = triton.next_power_of_2(shape[-1])
        _rms_norm_rows[(x2.shape[0],)](
            out, x2, self.weight, x2.stride(0), shape[-1], self.eps, BLOCK=block, num_warps=8
        )
        return out.reshape(shape)
