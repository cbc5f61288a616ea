"""Only physics makes a time impossible (measure/roofline.py): an exact algebraic rewrite that
does far less arithmetic than its reference passes `--kernelpro-check` against a baseline on
trusted ceilings, reported as "does less arithmetic than the reference"; a kernel that moves
its own inputs faster than the bandwidth allows still fails.

The problem is KernelBench level 2 `14_Gemm_Divide_Sum_Scaling` at a small size, written
here: the reference `(x @ W.T / 2).sum(1, keepdim=True) * scale` is the rewrite
`x @ W.sum(0)[:, None] / 2 * scale` (the sum over the GEMM's output columns moved onto the
weight), 2*B*N*K FLOPs against about N*K + 2*B*K. On the CPU before this rule, the
rewrite at 2048x2048 failed the user's check as "impossible time" (404 GFLOP/s on the
reference's FLOP count against a trusted 191 GFLOP/s ceiling).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from conftest import FLUSHED_ENV, records_by_name

from pytest_kernelpro.measure.roofline import (
    FEWER_FLOPS,
    analyze_reference,
    impossible_failure,
    price_measured,
)

GEMM_DIVIDE_SUM_SCALING = """
import pytest, torch

BATCH, IN, HIDDEN, SCALE = 64, 512, 512, 1.5


class Model(torch.nn.Module):
    \"\"\"KernelBench level 2, 14_Gemm_Divide_Sum_Scaling: GEMM, divide, sum, scale.\"\"\"

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(HIDDEN, IN))
        self.scaling_factor = SCALE

    def forward(self, x):
        x = torch.matmul(x, self.weight.T)
        x = x / 2
        x = torch.sum(x, dim=1, keepdim=True)
        return x * self.scaling_factor


REFERENCE = Model()


class Rewrite(torch.nn.Module):
    \"\"\"The same function, the column sum moved onto the weight: x @ W.sum(0).\"\"\"

    def __init__(self):
        super().__init__()
        self.weight = REFERENCE.weight
        self.scaling_factor = SCALE

    def forward(self, x):
        return x @ self.weight.sum(0)[:, None] / 2 * self.scaling_factor


def inputs(device):
    return (torch.randn(BATCH, IN, device=device),)


@pytest.mark.kernelpro(reference=REFERENCE, inputs=inputs)
def gemm_divide_sum_scaling(x):
    return Rewrite()(x)
"""

# Trusted CPU ceilings (the best of 3 probes, one on a quiet machine) with a compute peak no
# 64x512x512 GEMM reaches in the injected 1 ms: the rewrite beats it on the reference's FLOPs.
# The bandwidth is far above what its 128 KiB of input needs in that time.
TRUSTED_LOW_COMPUTE = {
    "device": "cpu (test, trusted)",
    "bandwidth_Bps": 100e9,
    "flops": {"fp32": 1e9, "fp64": 0.5e9, "bf16": 1e9},
    "source": "measured",
    "measured_at": "2026-12-05T00:00:00",
    "torch_version": "test",
    "details": {"probe_passes": 3, "quiet_probes": 1},
}


@pytest.fixture
def rewrite_project(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> pytest.Pytester:
    (kp_project.path / "ceilings.json").write_text(json.dumps(TRUSTED_LOW_COMPUTE))
    monkeypatch.setenv(FLUSHED_ENV, "1")  # inputs read from memory: the byte rule applies
    kp_project.makepyfile(test_rewrite=GEMM_DIVIDE_SUM_SCALING)
    return kp_project


def test_the_exact_algebraic_rewrite_passes_the_check_with_a_baseline(
    rewrite_project: pytest.Pytester,
) -> None:
    rewrite_project.runpytest("--kernelpro-save-baseline").assert_outcomes(passed=1)
    assert (
        "gemm_divide_sum_scaling" in (rewrite_project.path / "kernelpro-baseline.yaml").read_text()
    )
    result = rewrite_project.runpytest("--kernelpro-check")
    result.assert_outcomes(passed=1)
    record = records_by_name(rewrite_project)["gemm_divide_sum_scaling"]
    assert record["extra"]["ceilings_trusted"] is True
    assert record["gate"]["status"] not in ("regressed", "suspect")
    used = record["peak_used"]
    assert used["problem"] == "flops"
    assert FEWER_FLOPS in used["note"]
    assert record["efficiency"] > 1.0  # its % of roofline on the reference's FLOPs, shown as such
    result.stdout.fnmatch_lines(["*gemm_divide_sum_scaling*fewer FLOPs than the reference*"])
    assert "impossible time" not in result.stdout.str()


def test_the_same_kernel_moving_its_inputs_faster_than_the_bandwidth_is_impossible(
    rewrite_project: pytest.Pytester,
) -> None:
    """The rule still holds where physics says so: the same rewrite on a bandwidth ceiling
    its 128 KiB of input cannot cross in the injected 1 ms."""
    slow_memory = {**TRUSTED_LOW_COMPUTE, "bandwidth_Bps": 1e6}
    (rewrite_project.path / "ceilings.json").write_text(json.dumps(slow_memory))
    result = rewrite_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gemm_divide_sum_scaling: impossible time*compulsory bytes*"])


def test_the_rewrite_timed_for_real_is_never_impossible_on_the_references_flops() -> None:
    """Without the plugin's timer: the rewrite's real median on this machine, priced on the
    reference's roofline with a trusted compute ceiling it beats, is reported, not failed."""
    import time

    from pytest_kernelpro.measure.ceilings import Ceilings

    weight = torch.randn(512, 512)
    x = torch.randn(64, 512)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return torch.sum(torch.matmul(x, weight.T) / 2, dim=1, keepdim=True) * 1.5

    def rewrite(x: torch.Tensor) -> torch.Tensor:
        return x @ weight.sum(0)[:, None] / 2 * 1.5

    torch.testing.assert_close(rewrite(x), reference(x), rtol=1e-4, atol=1e-3)
    # A compute peak of 10 MFLOP/s: the reference's 33.6 MFLOP take 3.4 s at it, which the
    # rewrite beats on any machine, however loaded (one run took 44 ms a call at load 13).
    slow = {**TRUSTED_LOW_COMPUTE, "flops": {"fp32": 1e7, "fp64": 0.5e7, "bf16": 1e7}}
    ceilings = Ceilings.from_dict(slow)
    analysis = analyze_reference(reference, (x,), ceilings=ceilings)
    assert analysis.flops == pytest.approx(2 * 64 * 512 * 512, rel=0.05)
    assert analysis.compulsory_bytes == 64 * 512 * 4 + 64 * 4  # x read, the output written
    times = []
    for _ in range(20):
        start = time.perf_counter()
        rewrite(x)
        times.append(time.perf_counter() - start)
    median = sorted(times)[len(times) // 2]
    priced = price_measured(analysis.to_dict(), median)
    assert priced is not None
    assert priced.problem == "flops"
    timing = type("Timing", (), {"flushed_l2": True, "flush_reason": "on"})()
    assert (
        impossible_failure(asdict(priced), ceilings=ceilings, median_s=median, timing=timing)
        is None
    )


def test_an_op_without_a_flop_formula_is_named_unpriced_not_counted_zero() -> None:
    """The CPU LSTM runs as aten.mkldnn_rnn_layer, which no formula prices."""
    from pytest_kernelpro.measure.ceilings import Ceilings

    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    analysis = analyze_reference(
        lstm, (torch.randn(2, 5, 8),), ceilings=Ceilings.from_dict(TRUSTED_LOW_COMPUTE)
    )
    assert "aten.mkldnn_rnn_layer.default" in analysis.unpriced_ops
    assert any(n.startswith("unpriced: aten.mkldnn_rnn_layer.default") for n in analysis.notes)
    assert analysis.to_dict()["unpriced_ops"] == list(analysis.unpriced_ops)
    # The marker's flops= prices the whole reference: nothing is left unpriced.
    priced = analyze_reference(
        lstm, (torch.randn(2, 5, 8),), ceilings=Ceilings.from_dict(TRUSTED_LOW_COMPUTE), flops=1e6
    )
    assert priced.unpriced_ops == ()


# The rewrite's compulsory bytes: x (64x512 fp32) read once, the 64x1 output written once.
REWRITE_COMPULSORY_BYTES = 64 * 512 * 4 + 64 * 4


def test_an_honest_cpu_kernel_a_little_above_the_cpu_bandwidth_ceiling_is_not_impossible(
    rewrite_project: pytest.Pytester,
) -> None:
    """The optimizer's honest winner failed a user's check as "impossible" at just over 1.1x
    a trusted CPU copy ceiling (honest kernels reach 1.2x it: measure/roofline.py). At 1.5x
    the CPU's ceiling the time is shown above the bandwidth ceiling, never failed."""
    at_one_and_a_half = REWRITE_COMPULSORY_BYTES / 1e-3 / 1.5  # the injected median is ~1 ms
    ceilings = {**TRUSTED_LOW_COMPUTE, "bandwidth_Bps": at_one_and_a_half}
    (rewrite_project.path / "ceilings.json").write_text(json.dumps(ceilings))
    result = rewrite_project.runpytest()
    result.assert_outcomes(passed=1)
    record = records_by_name(rewrite_project)["gemm_divide_sum_scaling"]
    assert record["extra"]["ceilings_trusted"] is True
    assert "bytes" in record["peak_used"]["problem"].split("+")
    assert 1.3 < record["peak_used"]["bandwidth_ratio"] < 1.7
    assert (
        "a CPU copy probe leaves (honest kernels reach 1.4x it), so not impossible"
        in (record["peak_used"]["note"])
    )
    assert "stayed in cache" not in record["peak_used"]["note"]  # no accusation below 2x
    assert "impossible time" not in result.stdout.str()


def test_the_same_ratio_on_a_gpu_or_a_cached_result_on_the_cpu_is_impossible() -> None:
    """The margins apart: 1.5x the ceiling is impossible on a GPU (10% margin), and 2.5x on
    the CPU (a result left in cache ran at 4.3x: beyond the CPU's 100% margin)."""
    from pytest_kernelpro.measure.ceilings import Ceilings

    x = torch.randn(64, 512)
    flushed = type("Timing", (), {"flushed_l2": True, "flush_reason": "on"})()

    def verdict(device: str, ratio: float) -> str | None:
        median = 1e-3
        bandwidth = REWRITE_COMPULSORY_BYTES / median / ratio
        ceilings = Ceilings.from_dict(
            {**TRUSTED_LOW_COMPUTE, "device": device, "bandwidth_Bps": bandwidth}
        )
        analysis = analyze_reference(lambda x: x.sum(1, keepdim=True), (x,), ceilings=ceilings)
        priced = price_measured(analysis.to_dict(), median)
        assert priced is not None
        assert priced.bandwidth_ratio == pytest.approx(ratio, rel=1e-6)
        return impossible_failure(
            asdict(priced), ceilings=ceilings, median_s=median, timing=flushed
        )

    assert verdict("cpu (test, trusted)", 1.5) is None
    assert verdict("cpu (test, trusted)", 1.95) is None
    cached = verdict("cpu (test, trusted)", 2.5)
    assert cached is not None
    assert "beyond the bandwidth ceiling, at 2.50x it" in cached
    gpu = verdict("NVIDIA H200 (test)", 1.5)
    assert gpu is not None
    assert "by more than its 10% margin" in gpu
    # Untrusted ceilings never fail a time, whatever the ratio.
    untrusted = Ceilings.from_dict(
        {**TRUSTED_LOW_COMPUTE, "bandwidth_Bps": REWRITE_COMPULSORY_BYTES / 1e-3 / 10,
         "details": {"probe_passes": 3, "quiet_probes": 0}}
    )  # fmt: skip
    analysis = analyze_reference(lambda x: x.sum(1, keepdim=True), (x,), ceilings=untrusted)
    priced = price_measured(analysis.to_dict(), 1e-3)
    assert priced is not None
    assert (
        impossible_failure(asdict(priced), ceilings=untrusted, median_s=1e-3, timing=flushed)
        is None
    )
