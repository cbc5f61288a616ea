import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        y = torch.addmm(self.lin.bias, x, self.lin.weight.t())
        y = y - y.max(dim=-1, keepdim=True).values
        e = y.exp()
        return e / e.sum(dim=-1, keepdim=True)
