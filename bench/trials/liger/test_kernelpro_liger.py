"""Liger's Triton kernels as pytest-kernelpro items (a user trial on a real repository)."""

import pytest
import torch
import torch.nn.functional as F
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction
from liger_kernel.transformers.rms_norm import LigerRMSNorm
from torch import nn

HIDDEN = 4096


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(dtype)


def tokens(device, generator=None):
    return (torch.randn(8192, HIDDEN, device=device, dtype=torch.bfloat16, generator=generator),)


def gate_up(device, generator=None):
    shape = (8192, 11008)
    return (
        torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator),
        torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator),
    )


def layer_norm_inputs(device, generator=None):
    x = torch.randn(8192, HIDDEN, device=device, dtype=torch.bfloat16, generator=generator)
    w = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16, generator=generator)
    b = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16, generator=generator)
    return x, w, b


rms_norm = pytest.mark.kernelpro(
    reference=LlamaRMSNorm, inputs=tokens, init_inputs=(HIDDEN,), dtype=torch.bfloat16
)(LigerRMSNorm)


@pytest.mark.kernelpro(reference=lambda a, b: F.silu(a) * b, inputs=gate_up)
def swiglu(a, b):
    return LigerSiLUMulFunction.apply(a, b)


@pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, -1), inputs=tokens)
def softmax(x):
    return LigerSoftmaxFunction.apply(x)


@pytest.mark.kernelpro(
    reference=lambda x, w, b: F.layer_norm(x, (HIDDEN,), w, b, 1e-6), inputs=layer_norm_inputs
)
def layer_norm(x, w, b):
    return LigerLayerNormFunction.apply(x, w, b, 1e-6)
