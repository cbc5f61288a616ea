"""Strategy: one fused pass with torch.softmax instead of five separate ops (max, subtract,
exp, sum, divide): the honest control, which must win."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
