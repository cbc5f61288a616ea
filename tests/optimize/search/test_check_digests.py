"""A checked call's output is digested (read whole, `checks.digest`) only where a later call
compares it: the correctness trials', against which each later trial's output is held (a
cache returns an earlier output). The second shape's call and the call after timing join no
such list: their outputs are not digested, and a caching candidate is still caught."""

from __future__ import annotations

from typing import Any

import pytest
from harness_runs import run_in_process

from pytest_kernelpro.optimize.sandbox import checks

torch = pytest.importorskip("torch")

REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""

HONEST = """import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""

# Right on its first call, then the first output again for any input of the same shape.
CACHING = """import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        if not hasattr(self, "kept"):
            self.kept = torch.softmax(x, dim=-1)
        return self.kept.clone() if self.kept.shape == x.shape else torch.softmax(x, dim=-1)
"""


def _run(candidate: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[int]]:
    digested: list[int] = []
    real = checks.digest

    def counting(value: Any) -> bytes:
        digested.append(int(value.shape[0]))
        return real(value)

    monkeypatch.setattr(checks, "digest", counting)
    result, _ = run_in_process(REFERENCE, candidate, seed=42)
    return result, digested


def test_only_the_trials_outputs_are_digested(monkeypatch: pytest.MonkeyPatch) -> None:
    result, digested = _run(HONEST, monkeypatch)
    assert result["status"] == "correct", result.get("reason")
    assert result["correctness"]["shape_check"] == ["batch 8 instead of 16"]  # it ran
    assert digested == [16, 16, 16]  # the three trials; not the batch of 8, not after timing


def test_a_cache_is_still_caught_by_the_trials_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    result, digested = _run(CACHING, monkeypatch)
    assert result["status"] == "cheat", result
    assert "same output for different inputs" in result["reason"], result["reason"]
    assert digested == [16, 16]  # trial 2 returned trial 1's output
