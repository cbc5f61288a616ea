"""A module kernel and its reference, as a user writes them (tests/agents/test_golden_prompts.py)."""

import golden_impl
import torch
from torch import nn


class RMSNormReference(nn.Module):
    """The reference: RMSNorm in float64."""

    def __init__(self, hidden: int = 1024) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x64 = x.double()
        out = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight.double()
        return out.to(x.dtype)


class RMSNorm(nn.Module):
    """The current kernel."""

    def __init__(self, hidden: int = 1024) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return golden_impl.scaled_rms(x, self.weight)
