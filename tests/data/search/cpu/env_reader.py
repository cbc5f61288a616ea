import os

import torch
import torch.nn as nn

# What a candidate can see of the environment it runs in.
for name in sorted(os.environ):
    print(f"ENV {name}={os.environ[name]}")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
