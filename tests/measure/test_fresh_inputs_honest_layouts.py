"""Honest kernels on input layouts a user's `inputs=` factory or a KernelBench-style
`get_inputs()` can hand over: a broadcast (expanded) input whose elements share memory, one
tensor passed twice, overlapping views of one buffer, a kernel that writes its input in place.
The timer's guards (fresh content, the layout compared after every call, the checks) must time
each of them and refuse none (measure/timing/fresh_inputs.py). Found by shrunk KernelBench
sweeps on the CPU (bench/kernelbench_sweep.py --shrink) and their variations."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch

# Imported before pytester's module snapshot: the in-process run below imports torch's
# inductor, and once the snapshot drops `test_operators` again, its next import registers its
# TORCH_LIBRARY a second time and fails every later test of the process that imports it.
import torch._inductor.test_operators  # noqa: F401

from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.fresh_inputs import FreshInputs, fresh_inputs


def _check(got: Any, expected: Any) -> str | None:
    return None if torch.allclose(got, expected, rtol=1e-5, atol=1e-6) else "differs"


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def _timed(kernel: Any, make: Any, reference: Any = None) -> FreshInputs:
    fresh = fresh_inputs(
        torch, kernel, list(make(1)), device="cpu", make_draw=make,
        reference=reference or kernel, check=_check,
    )  # fmt: skip
    time_kernel(lambda: None, device="cpu", budget=TimingBudget(max_time_s=0.05), fresh=fresh)
    return fresh


def test_a_broadcast_input_is_timed_not_crashed() -> None:
    """A row expanded to a matrix (stride 0: every row is the same memory) cannot be refilled
    in place; the honest kernel must still be timed (on fixed content, every call checked)."""

    def make(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        row = torch.rand(1, 64, generator=gen)
        return row.expand(64, 64), torch.rand(64, 64, generator=gen)

    fresh = _timed(_add, make)
    assert fresh.mode == "fixed"
    assert "share memory" in fresh.note
    assert fresh.checked == fresh.to_dict()["calls"] > 0  # every call checked


def test_one_tensor_passed_twice_is_timed() -> None:
    def make(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.rand(32, 32, generator=torch.Generator().manual_seed(seed))
        return a, a

    fresh = _timed(torch.matmul, make)
    assert fresh.to_dict()["calls"] > 0
    assert fresh.checked > 0


def test_overlapping_views_of_one_buffer_are_timed() -> None:
    def make(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(4096 + 256, generator=torch.Generator().manual_seed(seed))
        return x[:4096], x[256:]

    fresh = _timed(lambda a, b: a * 2 + b, make)
    assert fresh.checked > 0


def test_a_kernel_writing_its_input_in_place_is_timed() -> None:
    """relu_ on the input and returned: the layout holds (same address, strides, shape)."""

    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(128, 128, generator=torch.Generator().manual_seed(seed)),)

    fresh = _timed(lambda x: x.relu_(), make, reference=torch.relu)
    assert fresh.mode == "mix"
    assert fresh.checked > 0


def test_a_kernel_that_reshapes_its_input_in_place_and_back_is_timed() -> None:
    """unsqueeze_ then squeeze_ on the input: its layout is the same again when the call
    returns, which is all the re-pointing guard may ask."""

    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(64, 64, generator=torch.Generator().manual_seed(seed)),)

    def kernel(x: torch.Tensor) -> torch.Tensor:
        x.unsqueeze_(0)
        out = x.sum(dim=1)
        x.squeeze_(0)
        return out

    fresh = _timed(kernel, make, reference=lambda x: x.sum(dim=0, keepdim=True))
    assert fresh.checked > 0


def test_the_recheck_after_timing_leaves_a_broadcast_input_as_it_is() -> None:
    """The re-check refills the timed inputs in place; a broadcast one cannot be written (the
    copy raised RuntimeError, reported as the reference's failure), so it keeps its content."""
    from pytest_kernelpro.measure.correctness_check import check_correctness, recheck_after_timing

    def make(seed: int = 0) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return [torch.rand(1, 64, generator=gen).expand(64, 64), torch.rand(64, 64, generator=gen)]

    result = check_correctness(_add, _add, make, device="cpu", trials=1)
    assert result.passed, result.failure
    timed = make(1)
    assert (
        recheck_after_timing(_add, _add, timed, lambda: make(2), device="cpu", correctness=result)
        is None
    )
    assert torch.equal(timed[1], make(2)[1])  # the other input was refilled


BROADCAST_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a + b

N = 256

def get_inputs():
    return [torch.rand(1, N).expand(N, N), torch.rand(N, N)]

def get_init_inputs():
    return []
"""


def test_a_kernelbench_problem_with_a_broadcast_input_passes_the_check(
    pytester: pytest.Pytester,
) -> None:
    """End to end through `--kernelpro-problems`: the reference as its own kernel passes."""
    problems = pytester.mkdir("problems")
    (problems / "1_BroadcastAdd.py").write_text(BROADCAST_PROBLEM)
    result = pytester.runpytest(
        "--kernelpro-problems=problems", "--kernelpro-device=cpu", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)


def test_an_empty_input_beside_a_full_one_is_timed() -> None:
    """A zero-element input (an empty batch concatenated to a full one): the kept content's
    fingerprint indexed it and raised IndexError, failing the item."""

    def make(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return torch.rand(0, 64, generator=gen), torch.rand(128, 64, generator=gen)

    fresh = _timed(lambda x, y: torch.cat([x, y]).sum(0), make)
    assert fresh.mode == "mix"
    assert fresh.checked > 0


class _Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


def test_inputs_in_a_namedtuple_beside_a_plain_tensor_are_timed_and_checked() -> None:
    """A namedtuple holding two tensors, then a third tensor: the refill finds three tensors,
    and every rebuilt call (the first reference run, a check's content, the sealed arguments)
    must put each back in its own place. The namedtuple was kept whole while its tensors were
    counted, so the third input got the first one's content (a shape error in the reference)."""

    def make(seed: int) -> tuple[Any, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        pair = _Pair(torch.rand(8, 4, generator=gen), torch.rand(4, generator=gen))
        return pair, torch.rand(8, 16, generator=gen)

    def kernel(pair: _Pair, z: torch.Tensor) -> torch.Tensor:
        return (pair.x + pair.y).sum(1, keepdim=True) * z

    for draw in (make, None):  # mixed from two draws, and with no maker (a jitter)
        fresh = fresh_inputs(
            torch, kernel, list(make(1)), device="cpu", make_draw=draw, reference=kernel,
            check=_check,
        )  # fmt: skip
        assert fresh.mode == "mix"
        time_kernel(lambda: None, device="cpu", budget=TimingBudget(max_time_s=0.05), fresh=fresh)
        assert fresh.checked > 0
        _, z = fresh.content()
        assert tuple(z.shape) == (8, 16)
