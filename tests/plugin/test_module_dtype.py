"""`dtype=` casts an nn.Module kernel and its reference after they are built.

Modules are built in fp32; a layer run in bf16 (every LLM layer) needs its parameters in bf16
too, or an fp32 weight promotes the reference's output to fp32 and the check fails on the
dtype. Found with Liger-Kernel's LigerRMSNorm against a Llama-style RMSNorm reference.
"""

from __future__ import annotations

import pytest

MODULES = """
import pytest, torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class FusedRMSNorm(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale).to(x.dtype)


def tokens(device, generator=None):
    return (torch.randn(16, 64, device=device, generator=generator).to(torch.bfloat16),)


@pytest.mark.kernelpro(reference=RMSNorm, inputs=tokens, init_inputs=(64,))
class AsBuilt(FusedRMSNorm):
    pass


@pytest.mark.kernelpro(reference=RMSNorm, inputs=tokens, init_inputs=(64,), dtype=DTYPE)
class InBf16(FusedRMSNorm):
    pass
"""


def test_modules_cast_to_the_marker_dtype_check_in_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_norms=MODULES.replace("DTYPE", "torch.bfloat16"))
    result = pytester.runpytest("--kernelpro-only", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AsBuilt*kernel returned shape (16, 64) dtype bfloat16; reference returned "
            "(16, 64) float32*",
            "PASSED test_norms.py::InBf16",
        ]
    )


def test_the_dtype_may_be_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_norms=MODULES.replace("DTYPE", "'bfloat16'"))
    result = pytester.runpytest("--kernelpro-only", "-p", "no:cacheprovider", "-k", "InBf16")
    result.assert_outcomes(passed=1)


def test_a_dtype_that_is_not_a_floating_torch_dtype_is_that_kernels_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_norms=MODULES.replace("DTYPE", "torch.int32"))
    result = pytester.runpytest("--kernelpro-only", "-p", "no:cacheprovider", "-k", "InBf16")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*dtype=torch.int32 is invalid; dtype must be a floating torch*"])


def test_dtype_on_a_function_kernel_says_to_make_the_inputs_in_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_fn="""
import pytest, torch

@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=lambda d: (torch.ones(4),),
                       dtype=torch.bfloat16)
def double(x):
    return x + x
"""
    )
    result = pytester.runpytest("--kernelpro-only", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*dtype='bfloat16' casts nn.Module kernels*make its inputs in*"])
