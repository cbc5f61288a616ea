import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Literal arguments: the search builds this ahead, before the worker starts. torch writes
# extra_cflags unquoted into build.ninja, which a shell runs: the `;` starts a command.
ext = load_inline(
    name="kp_flag_attack",
    cpp_sources="int answer() { return 42; }",
    cuda_sources="__global__ void k() {}",
    functions=["answer"],
    extra_cflags=["-O2; touch @@MARKER@@ #"],
)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
