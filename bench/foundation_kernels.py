"""Kernels for the foundation benchmark (bench/foundation_h200.py), of different kinds.

Each entry: kernel(*inputs), reference(*inputs), inputs(device), kind. The same definitions
are marked as kernel items (through a generated test module) and timed with do_bench, so
both measure exactly the same launches.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

# The example repository's Triton kernels; KP_REPO_ROOT is set when this file is copied.
_REPO = Path(os.environ.get("KP_REPO_ROOT") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(_REPO / "example_repo"))

# KP_BENCH_SMALL=1 shrinks every size (a CPU dry run of the pipeline, not a measurement).
SHRINK = 64 if os.environ.get("KP_BENCH_SMALL") else 1


def n(size: int) -> int:
    return max(size // SHRINK, 64)


def copy_inputs(device):
    return (torch.randn(n(1 << 28), device=device),)  # 1 GiB fp32


def add_inputs(device):
    return torch.randn(n(1 << 27), device=device), torch.randn(n(1 << 27), device=device)


def softmax_inputs(device):
    return (torch.randn(n(8192), 4096, device=device),)


def layernorm_inputs(device):
    return (torch.randn(n(8192), 4096, device=device),)


def sgemm_inputs(device):
    return torch.randn(n(4096), 4096, device=device), torch.randn(4096, n(4096), device=device)


def bf16_gemm_inputs(device):
    return (
        torch.randn(n(8192), 8192, device=device, dtype=torch.bfloat16),
        torch.randn(8192, n(8192), device=device, dtype=torch.bfloat16),
    )


def tiny_inputs(device):
    return torch.randn(4096, device=device), torch.randn(4096, device=device)


def triton_softmax(x):
    from kernels import triton_kernels

    return triton_kernels.softmax(x)


def layer_norm(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:])


KERNELS = {
    # name: (kernel, reference, inputs, kind, marker extras)
    "copy_1gib": (
        lambda x: x.clone(),
        lambda x: x.clone(),
        copy_inputs,
        "memory-bound streaming",
        {},
    ),
    "add_512mib": (torch.add, torch.add, add_inputs, "memory-bound streaming", {}),
    "softmax_8192x4096": (
        lambda x: torch.softmax(x, -1),
        lambda x: torch.softmax(x, -1),
        softmax_inputs,
        "memory-bound reduction",
        {},
    ),
    "layernorm_8192x4096": (
        layer_norm,
        layer_norm,
        layernorm_inputs,
        "memory-bound norm",
        {"rtol": 1e-4, "atol": 1e-4},
    ),
    "sgemm_fp32_4096": (
        torch.mm,
        torch.mm,
        sgemm_inputs,
        "compute-bound CUDA-core (FFMA)",
        {"rtol": 1e-3, "atol": 1e-2},
    ),
    "bf16_gemm_8192": (torch.mm, torch.mm, bf16_gemm_inputs, "compute-bound tensor-core", {}),
    "triton_softmax_8192x4096": (
        triton_softmax,
        lambda x: torch.softmax(x, -1),
        softmax_inputs,
        "memory-bound Triton",
        {"language": "triton"},
    ),
    "tiny_add_4096": (torch.add, torch.add, tiny_inputs, "launch-bound", {}),
}


def test_module_source() -> str:
    """A test module that marks every kernel above (written next to a copy of this file)."""
    lines = ["import pytest", "from foundation_kernels import KERNELS", ""]
    for name in KERNELS:
        lines += [
            f"@pytest.mark.kernelpro(reference=KERNELS[{name!r}][1], inputs=KERNELS[{name!r}][2], **KERNELS[{name!r}][4])",
            f"def {name}(*args):",
            f"    return KERNELS[{name!r}][0](*args)",
            "",
        ]
    return "\n".join(lines)
