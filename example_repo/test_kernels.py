"""The repository's kernels, each marked so pytest checks, times and gates it.

PyTorch kernels run on the CPU and the GPU; Triton and CUDA kernels need a GPU and are
skipped, with the reason, on a machine without one.
"""

from __future__ import annotations

import pytest
import torch
from kernels import cuda_kernels, torch_kernels, triton_kernels


def _big(device: str) -> bool:
    return device.startswith("cuda")


# --- PyTorch kernels ------------------------------------------------------------------------


def bias_gelu_inputs(device: str, shape: tuple[int, int]):
    rows, cols = shape
    return torch.randn(rows, cols, device=device), torch.randn(cols, device=device)


@pytest.mark.kernelpro(
    reference=lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh"),
    inputs=bias_gelu_inputs,
    shapes=[(512, 1024), (2048, 1024)],
    rtol=1e-5,
    atol=1e-5,
)
def bias_gelu(x, bias):
    return torch_kernels.bias_gelu(x, bias)


def softmax_inputs(device: str):
    rows, cols = (8192, 4096) if _big(device) else (256, 1024)
    return (torch.randn(rows, cols, device=device),)


@pytest.mark.kernelpro(reference=lambda x: torch.softmax(x, -1), inputs=softmax_inputs)
def softmax_rows(x):
    return torch_kernels.softmax_rows(x)


def rmsnorm_inputs(device: str):
    rows = 16384 if _big(device) else 512
    return (torch.randn(rows, 1024, device=device),)


@pytest.mark.kernelpro(
    reference=torch_kernels.RMSNormReference, inputs=rmsnorm_inputs, rtol=1e-5, atol=1e-5
)
class RMSNorm(torch_kernels.RMSNorm):
    """The module under test (the class in kernels/ is reused as is)."""


def matmul_inputs(device: str):
    n = 4096 if _big(device) else 256
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)


@pytest.mark.kernelpro(reference=torch.mm, inputs=matmul_inputs, rtol=2e-3, atol=2e-3)
def matmul(a, b):
    return a @ b


# --- Triton kernels (GPU) --------------------------------------------------------------------


def triton_softmax_inputs(device: str):
    return (torch.randn(8192, 4096, device=device),)


@pytest.mark.kernelpro(
    reference=lambda x: torch.softmax(x, -1), inputs=triton_softmax_inputs, language="triton"
)
def triton_softmax(x):
    return triton_kernels.softmax(x)


def add_inputs(device: str):
    n = 1 << 26
    return torch.randn(n, device=device), torch.randn(n, device=device)


@pytest.mark.kernelpro(reference=torch.add, inputs=add_inputs, language="triton", min_roofline=0.5)
def triton_add(x, y):
    return triton_kernels.add(x, y)


# --- CUDA kernels via load_inline (GPU) ------------------------------------------------------


def saxpy_inputs(device: str):
    n = 1 << 26
    return 2.5, torch.randn(n, device=device), torch.randn(n, device=device)


@pytest.mark.kernelpro(
    reference=lambda a, x, y: a * x + y, inputs=saxpy_inputs, language="cuda", min_roofline=0.5
)
def cuda_saxpy(a, x, y):
    return cuda_kernels.saxpy(a, x, y)


def row_rms_inputs(device: str):
    return (torch.randn(16384, 1024, device=device),)


@pytest.mark.kernelpro(
    reference=lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    inputs=row_rms_inputs,
    language="cuda",
)
def cuda_row_rms(x):
    return cuda_kernels.row_rms(x)
