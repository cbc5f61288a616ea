"""A kernel's language is found where its code leads, not only in the sources it names.

A user's test module often calls a library's `torch.autograd.Function` (`LigerSiLUMulFunction
.apply(a, b)`, as Liger-Kernel's ops are called), whose `forward` calls a launcher in another
module, which launches a `@triton.jit` kernel. No source on the way up names Triton, so the
kernel used to be taken for PyTorch: on a CPU it ran and failed inside Triton's driver
instead of being skipped as needing a GPU.

Triton is not installed where these tests run, so the library here launches an object of a
class whose module is `triton.runtime.jit`, the module of `@triton.jit`'s `JITFunction`:
the type is what the walk recognises.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.problem import detect_language_of  # noqa: E402

LAUNCH = '''
import functools


class JITFunction:
    """Stands for triton.runtime.jit.JITFunction."""

    def __getitem__(self, grid):
        return lambda *args: None


JITFunction.__module__ = "triton.runtime.jit"
_scale_kernel = JITFunction()


def scale_forward(x):
    _scale_kernel[(1,)](x)
    return x * 2


def torch_only(x):
    return torch_helper(x)


def torch_helper(x):
    return torch_only(x) if x is None else x + 1  # calls back: the walk must end


def contiguous(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        return fn(ctx, *args)
    return wrapper
'''

FUNCTIONS = """
import torch
from torch import nn

from .launch import contiguous, scale_forward, torch_only


class ScaleFunction(torch.autograd.Function):
    @staticmethod
    @contiguous
    def forward(ctx, x):
        return scale_forward(x)


class Scale(nn.Module):
    def forward(self, x):
        return ScaleFunction.apply(x)


class Plain(nn.Module):
    def forward(self, x):
        return torch_only(x)
"""


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    package = tmp_path / "scalelib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch.py").write_text(textwrap.dedent(LAUNCH))
    (package / "functions.py").write_text(textwrap.dedent(FUNCTIONS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("scalelib.functions")
    for name in [m for m in sys.modules if m.split(".")[0] == "scalelib"]:
        del sys.modules[name]


def test_a_function_reaching_a_triton_kernel_through_an_autograd_function_is_triton(library):
    ScaleFunction = library.ScaleFunction

    def scale(x):
        return ScaleFunction.apply(x)

    assert detect_language_of(scale) == "triton"


def test_a_library_module_class_whose_forward_reaches_a_triton_kernel_is_triton(library):
    assert detect_language_of(library.Scale) == "triton"


def test_a_library_chain_that_reaches_no_compiled_kernel_stays_pytorch(library):
    # Plain -> torch_only <-> torch_helper: a cycle with nothing compiled on it.
    assert detect_language_of(library.Plain) == "pytorch"

    def plain(x):
        return torch.relu(x)

    assert detect_language_of(plain) == "pytorch"
