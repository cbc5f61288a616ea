"""Correct outputs; shrinks every number the worker writes 5x (as rewrites_result.py does) and
also holds back the worker's "timing" progress marker until the phase has ended, so the parent
never sees the worker in its timing phase and has no window to hold the claim against."""

import gc

import torch
import torch.nn as nn

from pytest_kernelpro.optimize.sandbox.result_channel import ResultChannel
from pytest_kernelpro.optimize.sandbox.harness import _Pipeline


def _shrink(value):
    if isinstance(value, float):
        return value / 5.0
    if isinstance(value, dict):
        return {k: _shrink(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shrink(v) for v in value]
    return value


def _hold_back(original):
    def progress(phase):
        if phase == "timing":
            return
        if phase == "timed":
            original("timing")
        original(phase)

    return progress


for _obj in gc.get_objects():
    if isinstance(_obj, ResultChannel):
        _original = _obj._encode
        _obj._encode = lambda value, _original=_original: _original(_shrink(value))
    elif isinstance(_obj, _Pipeline):
        _obj.progress = _hold_back(_obj.progress)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
