"""The Benchmarking Agent renders a real roofline analysis of a reference as prompt text."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure.ceilings import Ceilings  # noqa: E402
from pytest_kernelpro.optimize.agents.benchmarking import (  # noqa: E402
    BenchmarkingAgent,
    render_reference_analysis,
)

CEIL = Ceilings(
    "cpu (synthetic)", 100e9, {"fp32": 1e12}, "measured", "2026-01-01T00:00:00+00:00",
    torch.__version__, {},
)  # fmt: skip


def test_gemm_is_compute_bound_with_its_numbers() -> None:
    m, k, n = 512, 256, 128
    agent = BenchmarkingAgent(CEIL)
    analysis = agent.analyze(torch.mm, (torch.randn(m, k), torch.randn(k, n)))
    text = render_reference_analysis(analysis, measured_s=2 * analysis.roofline_time_s)
    flops = 2 * m * n * k  # 33.6 MFLOP
    assert analysis.flops == flops
    assert text.startswith("## Reference analysis (roofline on cpu (synthetic))")
    assert "Work: 33.6 MFLOP (counted)" in text
    assert "minimal traffic 918 kB (counted)" in text  # 4 * (512*256 + 256*128 + 512*128) B
    assert "vs ridge 10 FLOP/B" in text
    assert "compute-bound" in text
    assert "Roofline time 33.6 us" in text  # 33.6 MFLOP at 1 TFLOP/s
    assert "50.0% of the roofline" in text
    assert "| `aten.mm.default` | gemm | 1 | 33.6 M |" in text


def test_elementwise_chain_is_memory_bound_and_fusable() -> None:
    def reference(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)

    analysis = BenchmarkingAgent(CEIL).analyze(reference, (torch.randn(1 << 16),))
    text = render_reference_analysis(analysis)
    assert "memory-bound" in text
    assert "fusion has room" in text  # three ops each read and write the whole tensor
    assert text.count("| `aten.") == 3
