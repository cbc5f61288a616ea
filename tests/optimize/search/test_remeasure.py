"""The final re-measurement with real worker processes on the CPU (each imports torch)."""

from __future__ import annotations

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox.remeasure import remeasure

pytestmark = pytest.mark.slow

REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.lin(x))


def get_inputs():
    return [torch.randn(256, 64)]


def get_init_inputs():
    return []
"""
RENAMED = """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(64, 64))
        self.b = nn.Parameter(torch.empty(64))

    def forward(self, x):
        print("done 0")  # output cannot forge the protocol
        return torch.relu(x @ self.w.t() + self.b)
"""
WRONG = "class ModelNew(Model):\n    def forward(self, x):\n        return x\n"
TIMING = {"max_time_s": 0.03, "warmup_ms": 1, "min_samples": 5, "flush_l2": False}


def test_interleaved_rounds_pool_samples_and_failures_are_named():
    result = remeasure(
        REFERENCE,
        [
            ("reference", "ModelNew = Model\n"),
            ("renamed", RENAMED),
            ("wrong", WRONG),
            ("crash", "raise RuntimeError('nope')\n"),
        ],
        device="cpu",
        rounds=3,
        timing=TIMING,
        timeout_s=240,
    )
    assert set(result.samples) == {"reference", "renamed"}
    assert all(len(v) >= 15 for v in result.samples.values())  # 3 rounds x >= 5 samples
    assert result.order == [
        ["reference", "renamed"],
        ["renamed", "reference"],
        ["reference", "renamed"],
    ]
    assert result.errors["wrong"].startswith("wrong result when re-measured: output: ")
    # The gate's rule, calibrated on the reference's own error against its float64 truth.
    assert "farther from the float64 truth than 8x the reference" in result.errors["wrong"]
    assert result.errors["crash"] == "RuntimeError: nope"


def test_one_at_a_time_each_turn_runs_in_a_worker_of_its_own():
    """Where the GPU holds one worker: the contenders alternate as in interleaved rounds,
    each turn a worker started for it, and a wrong contender is named as before. (Without a
    budget: a budget's rounds stop once they overran it, which a loaded machine's turns
    could do with the tiny budget a test affords.)"""
    result = remeasure(
        REFERENCE,
        [("reference", "ModelNew = Model\n"), ("renamed", RENAMED), ("wrong", WRONG)],
        device="cpu",
        rounds=2,
        timing=TIMING,
        timeout_s=240,
        one_at_a_time=True,
    )
    assert set(result.samples) == {"reference", "renamed"}
    # A turn in each round, each with the timing's least samples.
    assert all(len(result.round_samples[label]) == 2 for label in result.samples), result
    assert all(n >= TIMING["min_samples"] for n in result.round_samples["renamed"])
    assert result.order == [["reference", "renamed", "wrong"], ["renamed", "wrong", "reference"]]
    assert result.errors["wrong"].startswith("wrong result when re-measured: output: ")
    cost = result.cost()
    assert cost["one_at_a_time"] is True
    # Five turns started (the wrong one's first turn ends it), kept apart from the rounds'
    # timing: each a Python importing torch.
    assert cost["turn_start_s"] > 0
    assert cost["rounds"] == 2


def test_bad_arguments():
    with pytest.raises(KernelproError, match="rounds"):
        remeasure(REFERENCE, [("a", "")], rounds=0)
    with pytest.raises(KernelproError, match="unique"):
        remeasure(REFERENCE, [("a", ""), ("a", "")])


def test_a_budget_plans_every_round_and_the_cost_is_reported():
    result = remeasure(
        REFERENCE,
        [("reference", "ModelNew = Model\n"), ("renamed", RENAMED)],
        device="cpu",
        rounds=2,
        timing=TIMING,
        timeout_s=240,
        # Far more than the rounds need (TIMING caps each contender's round at 30 ms): a
        # budget near the rounds' own wall time made a loaded CPU stop after round 1.
        budget_s=60.0,
    )
    assert result.errors == {}
    plan = result.plan
    assert plan is not None
    assert (plan.contenders, plan.rounds, plan.budget_s) == (2, 2, 60.0)
    assert result.rounds == 2
    assert result.stopped == ""
    for label in ("reference", "renamed"):
        counts = result.round_samples[label]
        assert len(counts) == 2
        assert sum(counts) == len(result.samples[label])
        # The CPU timer gives min_samples up to its budget after a floor of 5 samples.
        assert all(5 <= n <= plan.max_samples for n in counts)
    cost = result.cost()
    assert cost["samples"] == {k: len(v) for k, v in result.samples.items()}
    assert cost["plan"]["budget_s"] == 60.0
    assert cost["wall_s"] >= cost["start_s"] + cost["rounds_s"] > 0


SLEEPY = RENAMED.replace('print("done 0")', "__import__('time').sleep(0.05)")


def test_rounds_stop_once_they_overrun_the_budget():
    # Each round of the sleeping contender takes at least 5 x 50 ms, far over 2 x 10 ms.
    result = remeasure(
        REFERENCE,
        [("sleepy", SLEEPY)],
        device="cpu",
        rounds=4,
        timing=TIMING,
        timeout_s=240,
        budget_s=0.01,
    )
    assert result.errors == {}
    assert result.rounds == 1
    assert result.stopped.startswith("stopped after 1 of 4 rounds: they took ")
    assert len(result.round_samples["sleepy"]) == 1


def test_each_contender_gets_an_equal_share_of_the_free_device_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the H200 a memo of every output (fresh content: a new 128 MiB entry a call) filled
    the device while contenders were timed side by side, and the honest contender failed
    with out-of-memory. Each worker now caps its own allocations at an equal share of the
    memory free when the re-measurement starts (torch.cuda's mem_get_info stood in here)."""
    import torch

    from pytest_kernelpro.optimize.sandbox import remeasure as module

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * gib, 140 * gib))
    share = module._device_memory_share("cuda:0", 2)
    assert share == pytest.approx(module.CONTENDERS_MEMORY_SHARE * 100 / 140 / 2)
    assert share * 2 * 140 * gib < 100 * gib  # together they leave the session room
    assert module._device_memory_share("cpu", 2) is None

    def unreadable(device: object = None) -> tuple[int, int]:
        raise RuntimeError("no CUDA GPUs are available")

    monkeypatch.setattr(torch.cuda, "mem_get_info", unreadable)
    assert module._device_memory_share("cuda", 3) is None


@pytest.mark.parametrize(("device", "index"), [("cuda", 0), ("cuda:1", 1)])
def test_the_memory_cap_names_a_device_index_for_a_bare_cuda_device(
    monkeypatch: pytest.MonkeyPatch, device: str, index: int
) -> None:
    """On an H100 every re-measurement worker died before its first call: `auto` resolves to
    "cuda", and torch's per-process memory cap refuses a device without an index
    (ValueError from `torch._utils._get_device_index`). The stand-in applies that same torch
    rule to what the cap is given; the current device is 0 here."""
    import torch
    from torch._utils import _get_device_index

    from pytest_kernelpro.optimize.sandbox import remeasure as module

    given: list[tuple[float, int]] = []

    def set_fraction(fraction: float, device: object = None) -> None:
        given.append((fraction, _get_device_index(device)))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    module.cap_device_memory(torch, 0.25, device)
    assert given == [(0.25, index)]
    with pytest.raises(ValueError, match="specified index"):
        set_fraction(0.25, device="cuda")  # the call the worker made before


SOFTMAX_23 = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(4096, 393216)]


def get_init_inputs():
    return []
"""


def test_the_contender_workers_that_fit_follow_the_evaluations_timing_estimate() -> None:
    """23_Softmax (6 GiB of input, 6 GiB of output, found on the meta device): a worker is
    estimated as the evaluation's worker in its timing phase, 1.4 x (4 inputs + 2.25
    outputs) + a CUDA context = 53.5 GiB. The H200's 126 GiB free hold two, an H100's 78
    GiB one; an unreadable device bounds nothing."""
    from pytest_kernelpro.optimize.sandbox import remeasure as module

    gib = 1 << 30
    h200 = module.workers_that_fit(SOFTMAX_23, "cuda", lambda d: (126 * gib, 140 * gib))
    assert h200 is not None
    assert h200.worker_bytes == int(1.4 * (4 * 6 + 2.25 * 6) * gib) + gib
    assert h200.workers == 2
    assert "2 re-measurement worker(s) of about 53.5 GiB" in h200.describe()
    h100 = module.workers_that_fit(SOFTMAX_23, "cuda:0", lambda d: (78 * gib, 80 * gib))
    assert h100 is not None
    assert h100.workers == 1
    assert module.workers_that_fit(SOFTMAX_23, "cuda", lambda d: None) is None
    assert module.workers_that_fit("class Model: ...", "cuda", lambda d: (gib, gib)) is None


def test_on_the_cpu_the_contender_workers_that_fit_are_counted_in_host_memory() -> None:
    """On a 24 GiB machine two re-measurement workers of a 16384x32768 float32 softmax (2 GiB
    of input, 2 GiB of output) beside the session ran it out of memory (the kernel killed
    one): a CPU worker is estimated as the evaluation's worker in its timing phase, 1.4 x
    (4 inputs + 2.25 outputs) + its interpreter and heap slack (512 MiB), against the
    host's available memory."""
    from pytest_kernelpro.optimize.sandbox import remeasure as module

    gib = 1 << 30
    large = SOFTMAX_23.replace("torch.rand(4096, 393216)", "torch.rand(16384, 32768)")
    worker = int(1.4 * (4 * 2 + 2.25 * 2) * gib) + gib // 2
    room = module.workers_that_fit(large, "cpu", lambda d: (19 * gib, 24 * gib))
    assert room is not None
    assert (room.worker_bytes, room.workers, room.where) == (worker, 0, "in host memory")
    assert room.describe().endswith("fit in 90% of the 19.0 GiB free in host memory")
    plenty = module.workers_that_fit(large, "cpu", lambda d: (200 * gib, 256 * gib))
    assert plenty is not None
    assert plenty.workers == int(0.9 * 200 * gib // worker) == 10  # 180 GiB / 18 GiB
    assert module.workers_that_fit(large, "cpu", lambda d: None) is None


def test_the_host_memory_read_is_this_machines() -> None:
    from pytest_kernelpro.optimize.sandbox import remeasure as module

    found = module.host_memory("cpu")
    if found is None:
        pytest.skip("no /proc/meminfo here")
    available, total = found
    assert 0 < available <= total


def test_the_searchs_truth_calibrates_every_worker_which_finds_none_of_its_own():
    """Given the truth the search's first judge found (its numbers, no tensor), a contender's
    worker makes no float64 re-run of its own: a wrong contender is refused by the tolerance
    that truth calibrates (the message of a later call's check, not of the first call's
    comparison with the truth), and the reference passes."""
    import sys

    from pytest_kernelpro.optimize.sandbox import judge, measurement

    task = {"reference": REFERENCE, "device": "cpu", "seed": 42}
    try:
        ref = judge._Reference(task)
        ref.output(judge.required_outputs(task)[0][1])  # the first checked call's: its truth
        known = ref.known_truth()
    finally:
        sys.modules.pop("kernelpro_reference", None)
    assert known is not None
    result = remeasure(
        REFERENCE,
        [("reference", "ModelNew = Model\n"), ("wrong", WRONG)],
        device="cpu",
        rounds=1,
        timing=TIMING,
        timeout_s=240,
        truth=measurement.worker_named(known),
    )
    assert set(result.samples) == {"reference"}
    assert result.errors["wrong"].startswith("wrong result when re-measured: output: ")
    assert "float64 truth" not in result.errors["wrong"], result.errors["wrong"]
