import torch
from torch import nn

from . import ops


class Block(nn.Module):
    def forward(self, x):
        return ops.norm_forward(x)


class TorchBlock(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Wrapper(nn.Module):
    """Calls a child given to its constructor: no code of its own names the child's class."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x) + 0


class Launcher:
    """Keeps a kernel object as an attribute and launches it."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, x):
        self.kernel[(1,)](x)
        return x


def make_block():
    return Block()
