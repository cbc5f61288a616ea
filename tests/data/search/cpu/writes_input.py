import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        x.copy_(torch.softmax(self.lin(x), dim=-1))  # result written over the input
        return x
