"""Roofline of real references on synthetic ceilings: every number checked by hand."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pytest_kernelpro.errors import KernelproError  # noqa: E402
from pytest_kernelpro.measure.ceilings import Ceilings, resolve_peak  # noqa: E402
from pytest_kernelpro.measure.flops import OpCost  # noqa: E402
from pytest_kernelpro.measure.roofline import (  # noqa: E402
    analyze_reference,
    classify_bound,
    graph_bytes,
)

BW = 100e9  # B/s
FP32 = 1e12  # FLOP/s -> ridge 10 FLOP/B
FP64 = 0.5e12
BF16 = 2e12


def cpu_ceilings(**flops: float) -> Ceilings:
    rates = {"fp32": FP32, "fp64": FP64, "bf16": BF16} if not flops else flops
    return Ceilings(
        "cpu (synthetic)", BW, rates, "measured", "2026-01-01T00:00:00+00:00", torch.__version__, {}
    )


CEIL = cpu_ceilings()


def test_matmul_exact() -> None:
    m, k, n = 512, 256, 128
    a = analyze_reference(torch.mm, (torch.randn(m, k), torch.randn(k, n)), ceilings=CEIL)
    flops = 2 * m * n * k
    min_bytes = 4 * (m * k + k * n + m * n)
    assert a.flops == flops
    assert a.min_bytes == min_bytes
    assert a.unfused_bytes == min_bytes  # one op: nothing to fuse
    assert a.intensity == flops / min_bytes
    assert a.ridge == FP32 / BW == 10.0
    assert a.bound == "compute"  # 36.6 FLOP/B is 3.7x the ridge
    assert a.compute_time_s == flops / FP32
    assert a.memory_time_s == min_bytes / BW
    assert a.roofline_time_s == flops / FP32
    assert a.efficiency(2 * a.roofline_time_s) == 0.5
    assert a.dominant_category == "gemm"
    assert a.peak_name == "CPU FP32 (torch.matmul rate) (measured 1 TFLOP/s)"
    assert [(op.op, op.category, op.peak_key, op.count) for op in a.ops] == [
        ("aten.mm.default", "gemm", "fp32", 1)
    ]
    assert (a.flops_source, a.bytes_source) == ("counted", "counted")


def test_counts_agree_with_flop_counter_mode() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    conv = torch.nn.Conv2d(3, 16, 3, padding=1)
    x = torch.randn(2, 3, 32, 32)
    with FlopCounterMode(display=False) as counter:
        conv(x)
    a = analyze_reference(conv, (x,), ceilings=CEIL)
    assert a.flops == counter.get_total_flops() == 2 * 2 * 16 * 32 * 32 * 3 * 9
    # input, weight, bias read once, output written once
    assert a.min_bytes == 4 * (x.numel() + conv.weight.numel() + 16 + 2 * 16 * 32 * 32)


def test_softmax() -> None:
    x = torch.randn(256, 512)  # the 8192x4096 case, scaled down
    a = analyze_reference(lambda t: torch.softmax(t, -1), (x,), ceilings=CEIL)
    n = x.numel()
    assert a.flops == 5 * n  # max, subtract, exp, sum, divide
    assert a.min_bytes == 2 * 4 * n  # read once, write once
    assert a.intensity == 5 / 8
    assert a.bound == "memory"
    assert a.roofline_time_s == a.memory_time_s == 8 * n / BW
    assert a.dominant_category == "softmax"


@pytest.mark.parametrize(
    ("name", "fn", "n_inputs", "flops_per_el"),
    [("add", torch.add, 2, 1), ("relu", torch.relu, 1, 1), ("gelu", F.gelu, 1, 1)],
)
def test_elementwise(name: str, fn: Any, n_inputs: int, flops_per_el: int) -> None:
    shape = (64, 1000)
    inputs = tuple(torch.randn(shape) for _ in range(n_inputs))
    a = analyze_reference(fn, inputs, ceilings=CEIL)
    n = 64 * 1000
    assert a.flops == flops_per_el * n
    assert a.min_bytes == 4 * n * (n_inputs + 1)
    assert a.bound == "memory"
    assert a.roofline_time_s == 4 * n * (n_inputs + 1) / BW
    assert a.dominant_category == "elementwise"


def test_broadcast_bias_read_once() -> None:
    x, bias = torch.randn(64, 128), torch.randn(128)
    a = analyze_reference(lambda t, b: t + b, (x, bias), ceilings=CEIL)
    assert a.min_bytes == 4 * (64 * 128 * 2 + 128)


def test_composite_unfused_exceeds_min_and_module_parameters_count() -> None:
    m, k, n = 256, 512, 128
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.ReLU())
    x = torch.randn(m, k)
    a = analyze_reference(model, (x,), ceilings=CEIL)
    assert a.flops == 2 * m * n * k + m * n  # addmm (torch's count) + relu
    assert a.min_bytes == 4 * (m * k + k * n + n + m * n)  # x, W, b, output
    # unfused: addmm reads x, W, b and writes h; relu reads h and writes y
    assert a.unfused_bytes == 4 * (m * k + k * n + n + m * n) + 4 * 2 * m * n
    assert a.unfused_bytes > a.min_bytes
    assert {op.category for op in a.ops} == {"gemm", "elementwise"}
    assert a.dominant_category == "gemm"
    # the bound method and a closure that captures the weights count the same bytes
    assert analyze_reference(model.forward, (x,), ceilings=CEIL).min_bytes == a.min_bytes
    linear = model[0]
    closure = analyze_reference(lambda t: torch.relu(linear(t)), (x,), ceilings=CEIL)
    assert closure.min_bytes == a.min_bytes


def test_aliased_inputs_not_double_counted() -> None:
    x = torch.randn(64, 64)
    assert graph_bytes([x, x.t(), x[:32]]) == 4 * 64 * 64
    a = analyze_reference(lambda p, q: p + q, (x, x.t()), ceilings=CEIL)
    assert a.min_bytes == 4 * 64 * 64 * 2  # x once, the output once


def test_marker_override_wins() -> None:
    x = torch.randn(128, 128)
    a = analyze_reference(torch.relu, (x,), ceilings=CEIL, flops=1e9, bytes=2e6)
    assert (a.flops, a.min_bytes) == (1e9, 2e6)
    assert (a.flops_source, a.bytes_source) == ("marker", "marker")
    assert a.unfused_bytes == 2 * 4 * x.numel()  # still the counted op bytes
    assert a.intensity == 1e9 / 2e6
    assert a.roofline_time_s == max(1e9 / FP32, 2e6 / BW)
    assert a.bound == "compute"  # 500 FLOP/B vs a ridge of 10


def test_hook_override_wins_and_sees_every_op() -> None:
    seen: list[str] = []

    def hook(op: str, args: tuple, kwargs: dict, out: Any) -> OpCost | None:
        seen.append(op)
        if op == "aten.mm.default":
            return OpCost(op, "gemm", 7e9, 1234.0, "float32", "fp32")
        return None

    a_, b_ = torch.randn(64, 32), torch.randn(32, 16)
    a = analyze_reference(
        lambda p, q: torch.relu(p @ q), (a_, b_), ceilings=CEIL, op_cost_hook=hook
    )
    assert seen == ["aten.mm.default", "aten.relu.default"]
    mm = next(op for op in a.ops if op.op == "aten.mm.default")
    assert (mm.flops, mm.bytes_unfused) == (7e9, 1234.0)
    assert a.flops == 7e9 + 64 * 16
    assert a.flops_source == "hook"


def test_hook_failures_are_the_hooks() -> None:
    def broken(op: str, args: tuple, kwargs: dict, out: Any) -> OpCost | None:
        raise ValueError("my formula")

    with pytest.raises(KernelproError, match="op-cost hook failed: ValueError\\('my formula'\\)"):
        analyze_reference(torch.relu, (torch.randn(4),), ceilings=CEIL, op_cost_hook=broken)
    with pytest.raises(KernelproError, match="returned float for aten.relu.default"):
        analyze_reference(torch.relu, (torch.randn(4),), ceilings=CEIL, op_cost_hook=lambda *a: 1.0)


def test_reference_error_is_reported() -> None:
    with pytest.raises(KernelproError, match="reference raised RuntimeError"):
        analyze_reference(torch.mm, (torch.randn(3, 4), torch.randn(5, 6)), ceilings=CEIL)


@pytest.mark.parametrize(
    ("intensity", "expected"),
    [(4.999, "memory"), (5.0, "mixed"), (10.0, "mixed"), (20.0, "mixed"), (20.001, "compute")],
)
def test_bound_band_edges(intensity: float, expected: str) -> None:
    assert classify_bound(intensity, 10.0) == expected


def test_bound_band_is_configurable() -> None:
    assert classify_bound(3.0, 10.0, (0.25, 4.0)) == "mixed"
    assert classify_bound(2.0, 10.0, (0.25, 4.0)) == "memory"
    # softmax: 0.625 FLOP/B against a ridge of 10 -> ratio 0.0625
    x = torch.randn(32, 64)
    wide = analyze_reference(
        lambda t: torch.softmax(t, -1), (x,), ceilings=CEIL, bound_band=(0.05, 0.06)
    )
    assert wide.bound == "compute"
    with pytest.raises(KernelproError, match="bound band"):
        classify_bound(1.0, 1.0, (2.0, 1.0))


def test_mixed_dtypes_use_the_harmonic_peak() -> None:
    a_, b_ = torch.randn(64, 64), torch.randn(64, 64)
    a = analyze_reference(lambda p, q: (p @ q).double().exp(), (a_, b_), ceilings=CEIL)
    mm_flops, exp_flops = 2 * 64**3, 64 * 64
    assert a.flops == mm_flops + exp_flops
    assert a.compute_time_s == pytest.approx(mm_flops / FP32 + exp_flops / FP64, rel=1e-12)
    assert a.peak_flops == pytest.approx(a.flops / (mm_flops / FP32 + exp_flops / FP64), rel=1e-12)
    assert a.peak_name.startswith("mixed, effective")
    assert a.peak_mix["fp32"] == pytest.approx(mm_flops / a.flops)


def test_bf16_on_cpu_uses_bf16_rate_and_missing_keys_fall_back() -> None:
    p, q = torch.randn(32, 32).bfloat16(), torch.randn(32, 32).bfloat16()
    a = analyze_reference(torch.mm, (p, q), ceilings=CEIL)
    assert a.ops[0].peak_key == "bf16"
    assert a.peak_flops == BF16
    only_fp32 = cpu_ceilings(fp32=FP32)
    b = analyze_reference(torch.mm, (p, q), ceilings=only_fp32)
    assert b.peak_flops == FP32
    assert any("no 'bf16' ceiling" in note for note in b.notes)


def test_resolve_peak_on_gpu_ceilings() -> None:
    gpu = Ceilings(
        "NVIDIA H200", 4.3e12, {"tf32_tensor": 400e12, "fp32": 50e12, "fp64_tensor": 60e12},
        "measured", "2026-01-01T00:00:00+00:00", "2.11", {},
    )  # fmt: skip
    assert resolve_peak(gpu, "tf32_tensor") == ("tf32_tensor", 400e12, None)
    used, rate, note = resolve_peak(gpu, "fp64")
    assert (used, rate) == ("fp64_tensor", 60e12)
    assert note
    assert "no 'fp64' ceiling" in note
    with pytest.raises(KernelproError, match="no 'fp8_tensor' rate nor a stand-in"):
        resolve_peak(
            Ceilings("NVIDIA X", 1e12, {"fp64": 1e12}, "measured", "t", "2.11", {}), "fp8_tensor"
        )


def test_attention_uses_sdpa_formula() -> None:
    q, k, v = (torch.randn(2, 4, 64, 32) for _ in range(3))
    a = analyze_reference(F.scaled_dot_product_attention, (q, k, v), ceilings=CEIL)
    assert a.flops == 2 * 2 * 4 * 64 * 64 * (32 + 32)
    assert a.dominant_category == "attention"


def test_nothing_recorded_is_noted_and_serializable() -> None:
    x = torch.randn(16)
    a = analyze_reference(lambda t: t, (x,), ceilings=CEIL)
    assert a.ops == ()
    assert a.flops == 0
    assert any("no aten op recorded" in note for note in a.notes)
    data = json.loads(json.dumps(a.to_dict()))
    assert data["flops"] == 0
    assert data["bound"] == "memory"
    zero_bytes = analyze_reference(torch.relu, (x,), ceilings=CEIL, bytes=0)
    assert math.isinf(zero_bytes.intensity)
    assert zero_bytes.to_dict()["intensity"] is None


def test_efficiency_rejects_bad_times() -> None:
    a = analyze_reference(torch.relu, (torch.randn(8),), ceilings=CEIL)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(KernelproError, match="measured time"):
            a.efficiency(bad)


def test_marker_values_are_validated() -> None:
    with pytest.raises(KernelproError, match="marker flops=-1"):
        analyze_reference(torch.relu, (torch.randn(8),), ceilings=CEIL, flops=-1)


def test_float64_reference_of_float32_work_is_priced_at_the_float32_rate() -> None:
    """An accuracy-minded reference upcasts; the kernel's work stays in the inputs' dtype."""
    import torch

    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.roofline import analyze_reference

    ceilings = Ceilings.from_dict(
        {
            "device": "t",
            "bandwidth_Bps": 100e9,
            "flops": {"fp32": 1e12, "fp64": 0.5e12},
            "source": "measured",
            "measured_at": "x",
            "torch_version": "x",
            "details": {},
        }
    )
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    upcast = analyze_reference(
        lambda x, y: (x.double() @ y.double()).float(), (a, b), ceilings=ceilings
    )
    assert upcast.compute_time_s == pytest.approx(2 * 64**3 / 1e12)
    assert any("priced at the float32 rate" in n for n in upcast.notes)
    native = analyze_reference(torch.mm, (a.double(), b.double()), ceilings=ceilings)
    assert native.compute_time_s == pytest.approx(2 * 64**3 / 0.5e12)
