import os

import torch
import torch.nn as nn

for path in ("@@TARGET@@", "@@BASELINE@@"):
    try:
        with open(path, "a") as handle:
            handle.write("ESCAPED written by a candidate\n")
        print(f"ESCAPED wrote {path}")
    except OSError as exc:
        print(f"blocked write to {path}: {exc.strerror}")
try:
    os.unlink("@@TARGET@@")
    print("ESCAPED deleted the target")
except OSError as exc:
    print(f"blocked unlink: {exc.strerror}")
open("scratch-file.txt", "w").write("the scratch directory is writable\n")
print("wrote scratch-file.txt")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
