"""Strategy: torch's fused GELU (tanh approximation) after the bias add: two kernels instead
of the nine elementwise ops written out."""

import torch
import torch.nn.functional as F
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + bias, approximate="tanh")
