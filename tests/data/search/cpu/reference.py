"""KernelBench-format problem for the sandbox tests: softmax(linear(x))."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)


batch, n = 16, 64


def get_inputs():
    return [torch.randn(batch, n)]


def get_init_inputs():
    return [n]
