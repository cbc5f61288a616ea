"""PyTorch kernels: hand-fused versions of common ops (run on CPU and GPU)."""

from __future__ import annotations

import torch
from torch import nn


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(x + bias) with the tanh approximation written out."""
    y = x + bias
    return 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Numerically stable row softmax in three passes."""
    shifted = x - x.amax(dim=-1, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=-1, keepdim=True)


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, hidden: int = 1024, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSNormReference(nn.Module):
    """The same computation, in float64, as the reference."""

    def __init__(self, hidden: int = 1024, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x64 = x.double()
        out = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.double()
        return out.to(x.dtype)
