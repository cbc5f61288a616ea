"""Strategy: compute in float64 to avoid cancellation in the cubic term (slower: twice the
bytes for every intermediate, and nine kernels still)."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = (x + bias).double()
        out = 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
        return out.to(x.dtype)
