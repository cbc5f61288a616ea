"""Strategy: return a torch.Tensor subclass (a lazy tensor would compute when read: a cheat)."""

import torch
from torch import nn


class Lazy(torch.Tensor):
    pass


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1).as_subclass(Lazy)
