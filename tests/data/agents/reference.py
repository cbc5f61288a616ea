"""KernelBench-format problem for the agent tests: relu(x @ w + b)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


batch, n = 8, 32


def get_inputs():
    return [torch.randn(batch, n)]


def get_init_inputs():
    return [n]
