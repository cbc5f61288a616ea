"""Strategy: softmax over chunks of 128 rows so each chunk stays in L2 (slower: 64 launches
of a small kernel cost more than the L2 hits save)."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], 128):
            out[start : start + 128] = torch.softmax(x[start : start + 128], dim=-1)
        return out
