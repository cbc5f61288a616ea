import os
import sys
import time

import torch
import torch.nn as nn

# A daemon the classic way: fork, setsid, fork again, the parent exits: the grandchild is
# nobody's child and in no group of the worker's. It must not outlive the candidate.
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", "@@TAG@@"])
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(0.2)
print("daemon started")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
