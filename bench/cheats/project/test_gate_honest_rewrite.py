"""An exact algebraic rewrite, which must pass (reported as doing less arithmetic than the
reference), in a module of its own: the gate refuses every kernel of a module that rebinds a
clock (test_gate_cheats_fresh.py does)."""

import pytest
import torch


def scale_inputs(device):
    # KernelBench level 2 14_Gemm_Divide_Sum_Scaling at batch 128: x (128, 8192), W (8192, 8192)
    return (torch.randn(128, 8192, device=device), torch.randn(8192, 8192, device=device))


def gemm_divide_sum_scale(x, w):
    return ((x @ w.T) / 2).sum(dim=1, keepdim=True) * 1.5


@pytest.mark.kernelpro(reference=gemm_divide_sum_scale, inputs=scale_inputs, device="cuda")
def honest_rewrite(x, w):
    """sum_j (x W^T)_ij = x . colsum(W^T): the exact rewrite, 8192x fewer FLOPs."""
    return (x @ w.sum(dim=0, keepdim=True).T) * 0.75
