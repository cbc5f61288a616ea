"""The implementation module a golden-prompt kernel calls (tests/agents/test_golden_prompts.py)."""

import torch


def scaled_rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight, in three PyTorch ops."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
