"""What the cheat modules share: the problem they all solve (a 4096^3 fp32 GEMM then tanh:
milliseconds of device work, far above any sync latency), its reference and the marker."""

import pytest
import torch

N = 4096


def gemm_inputs(device):
    return (torch.randn(N, N, device=device), torch.randn(N, N, device=device))


def ref(x, y):
    return torch.tanh(x @ y)


def kp(**kw):
    """The marker of a CUDA kernel of this problem (skipped on a CPU-only machine)."""
    return pytest.mark.kernelpro(reference=ref, inputs=gemm_inputs, device="cuda", **kw)
