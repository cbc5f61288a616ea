"""A module that rebinds the plugin's kept clock by module attribute at import: its own
kernel must be refused, naming this module; kernels of other modules are timed on the
originals and pass (not blamed)."""

import time

import torch
from cheat_common import kp

import pytest_kernelpro.measure.bound as bound

_real = time.perf_counter


def slow_clock():
    return _real() / 5.0


bound.perf_counter = slow_clock


@kp()
def cheat_import_patcher(x, y):
    return torch.tanh(x @ y)
