"""Inner pytester runs keep the torch modules they first import (tests/conftest.py,
`_SnapshotKeepingTorch`): dropped, a torch module imported again in a later test registers
its operators twice and fails there, so one inner run turned the later tests of its process
red. Every other module an inner run imports is still dropped after it."""

from __future__ import annotations

import sys

import pytest

INNER = """
import sys, types

def test_imports():
    for name in {names!r}:
        sys.modules[name] = types.ModuleType(name)
"""


def test_a_torch_module_first_imported_in_an_inner_run_stays_and_others_go(
    pytester: pytest.Pytester,
) -> None:
    torch_module, other_module = "torch._kernelpro_inner_probe", "kernelpro_inner_probe"
    pytester.makepyfile(test_imports=INNER.format(names=[torch_module, other_module]))
    try:
        pytester.runpytest().assert_outcomes(passed=1)
        assert torch_module in sys.modules
        assert other_module not in sys.modules
    finally:
        sys.modules.pop(torch_module, None)
        sys.modules.pop(other_module, None)
