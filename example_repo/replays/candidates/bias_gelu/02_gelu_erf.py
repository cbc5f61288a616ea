"""Strategy: the exact (erf) GELU, one fewer approximation (wrong: the reference is the tanh
approximation, which differs by up to ~1e-3)."""

import torch
import torch.nn.functional as F
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + bias)
