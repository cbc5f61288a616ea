"""A module that rebinds the plugin's kept clock by module attribute at import: its own
kernel must be refused, naming this module; kernels of other modules are timed on the
originals and pass (not blamed)."""

import time

import pytest
import torch

import pytest_kernelpro.measure.bound as bound

_real = time.perf_counter


def slow_clock():
    return _real() / 5.0


bound.perf_counter = slow_clock


def gemm_inputs(device):
    return (torch.randn(4096, 4096, device=device), torch.randn(4096, 4096, device=device))


def ref(x, y):
    return torch.tanh(x @ y)


@pytest.mark.kernelpro(reference=ref, inputs=gemm_inputs, device="cuda")
def cheat_import_patcher(x, y):
    return torch.tanh(x @ y)
