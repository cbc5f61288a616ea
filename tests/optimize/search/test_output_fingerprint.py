"""The worker's output digest (`checks.digest`, kept in place of an earlier output to catch a
candidate that returns the same bytes for different inputs) and the GPU tensors' part of it
(`checks.device_fingerprint`, made where the bytes live). The fingerprint is device-agnostic
code: these CPU runs are its stand-in for a GPU, where `digest` uses it."""

from __future__ import annotations

import pytest
import torch

from pytest_kernelpro.optimize.sandbox import checks
from pytest_kernelpro.optimize.sandbox.checks import device_fingerprint, digest


def _one_ulp_up(t: torch.Tensor, index: int) -> torch.Tensor:
    out = t.clone()
    flat = out.view(-1)
    flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf")))
    return out


def test_equal_bytes_give_equal_fingerprints_in_any_layout() -> None:
    a = torch.randn(300, 301)
    assert device_fingerprint(a) == device_fingerprint(a.clone())
    # a transposed view and its contiguous copy hold the same elements in the same order
    assert device_fingerprint(a.t()) == device_fingerprint(a.t().contiguous())


@pytest.mark.parametrize("index", [0, 7, 12345, 300 * 301 - 1])
def test_one_ulp_anywhere_changes_the_fingerprint(index: int) -> None:
    a = torch.randn(300, 301)
    assert device_fingerprint(a) != device_fingerprint(_one_ulp_up(a, index))


def test_words_and_the_bytes_after_the_last_word_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 words, then 3 bytes that fill no word; chunks of 3 words: the weights change by chunk
    monkeypatch.setattr(checks, "FINGERPRINT_CHUNK", 3)
    base = torch.arange(67, dtype=torch.uint8)
    for position in (0, 20, 63, 64, 66):
        changed = base.clone()
        changed[position] += 1
        assert device_fingerprint(changed) != device_fingerprint(base), position
    assert device_fingerprint(base) == device_fingerprint(base.clone())


def test_a_swap_of_two_words_changes_the_fingerprint() -> None:
    # a plain sum of the words would not see it: each position has its own weight
    a = torch.arange(16, dtype=torch.int64)
    swapped = a.clone()
    swapped[[3, 9]] = swapped[[9, 3]]
    assert device_fingerprint(a) != device_fingerprint(swapped)


def test_the_digest_of_a_gpu_like_leaf_is_its_dtype_shape_and_fingerprint() -> None:
    # `digest` reads a CPU tensor's bytes itself; a tensor elsewhere enters by its
    # fingerprint. Two outputs with equal bytes and another shape or dtype still differ.
    a = torch.randn(4, 6)
    assert digest(a) == digest(a.clone())
    assert digest(a) != digest(a.reshape(6, 4))
    assert digest(a) != digest(a.view(torch.int32))
    assert digest((a, 1)) != digest((a, 2))


@pytest.mark.gpu
def test_on_the_gpu_equal_bytes_agree_and_one_ulp_differs() -> None:
    a = torch.randn(1000, 1003)
    on_gpu = a.cuda()
    assert device_fingerprint(on_gpu) == device_fingerprint(on_gpu.clone())
    assert device_fingerprint(on_gpu) != device_fingerprint(_one_ulp_up(a, 777).cuda())
    assert digest(on_gpu) == digest(on_gpu.clone())
    assert digest(on_gpu) != digest(_one_ulp_up(a, 5).cuda())
