import sys

import torch
import torch.nn as nn

# Megabytes of output on both streams: the session keeps a bounded tail.
line = "x" * 1023 + "\n"
for _ in range(@@MB@@ * 1024):
    sys.stdout.write(line)
for _ in range(1024):
    sys.stderr.write(line)
print("FLOOD-END")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
