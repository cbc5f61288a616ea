"""KernelBench-format problem for the memory and cost measurements: a row softmax whose size
the users set by replacing the line `rows, cols = 16, 64`."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


rows, cols = 16, 64


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
