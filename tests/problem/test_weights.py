"""problem/build.py: the reference's weights reach the kernel module by name, else by
position and shape; otherwise nothing is loaded and the reason names both layouts."""

from __future__ import annotations

import torch
from torch import nn

from pytest_kernelpro.problem.build import share_weights


class Ref(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8))
        self.bias = nn.Parameter(torch.randn(8))


class Renamed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.zeros(8))
        self.shift = nn.Parameter(torch.zeros(8))


class Other(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.zeros(4))


def test_by_name() -> None:
    ref, new = Ref(), Ref()
    assert share_weights(ref, new) == (True, "copied by name")
    assert torch.equal(new.bias, ref.bias)


def test_by_position_and_shape_when_the_names_differ() -> None:
    ref, new = Ref(), Renamed()
    assert share_weights(ref, new) == (True, "copied by position and shape")
    assert torch.equal(new.gain, ref.weight)
    assert torch.equal(new.shift, ref.bias)


def test_not_copied_when_the_layouts_differ() -> None:
    ref, new = Ref(), Other()
    copied, why = share_weights(ref, new)
    assert not copied
    assert why == (
        "not copied: the reference's state_dict (weight (8,), bias (8,)) matches the kernel's "
        "(gain (4,)) neither by name nor by position and shape"
    )
    assert torch.equal(new.gain, torch.zeros(4))
    assert share_weights(nn.Identity(), Other()) == (False, "the reference has no parameters")
    assert share_weights(lambda x: x, Other()) == (False, "not modules")
