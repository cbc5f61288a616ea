import os

import torch
import torch.nn as nn

# Fill the scratch directory (it is on the session's disk): one big file, then many.
chunk = b"\0" * (1 << 20)
written = 0
try:
    with open("big.bin", "wb") as handle:
        for _ in range(@@MB@@ * 4):
            handle.write(chunk)
            handle.flush()
            written += 1
    print("ESCAPED one file of", written, "MB")
except OSError as exc:
    print(f"one file stopped at {written} MB: {exc.strerror}")
for i in range(10_000):
    try:
        with open(f"part-{i}.bin", "wb") as handle:
            for _ in range(16):
                handle.write(chunk)
    except OSError as exc:
        print(f"part {i}: {exc.strerror}")
        break
print("ESCAPED still running after filling the disk")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
