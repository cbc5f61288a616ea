"""Stage-1 classification and the guidance renderings (tools / raw / none)."""

from __future__ import annotations

import pytest
from tools_factories import km, probe, probe_ctx, report, stall_values, timeline

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.profile.model import NotCollected
from pytest_kernelpro.tools import generate_prompt_guidance, render_findings_text, run_tools
from pytest_kernelpro.tools.guidance import HEADING, RAW_HEADING
from pytest_kernelpro.tools.stage1 import classify

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"


def sol(sm: float, mem: float):  # noqa: ANN201
    return km({SM: sm, MEM: mem})


@pytest.mark.parametrize(
    ("theoretical", "sm", "mem", "cls", "measured", "confidence"),
    [
        ("memory", 20.0, 85.0, "memory", "memory", "high"),
        ("compute", 85.0, 20.0, "compute", "compute", "high"),
        ("compute", 64.85, 97.31, "compute", "memory", "low"),  # naive matmul: theory wins
        ("memory", 59.9, 59.9, "memory", "latency", "low"),  # both < 60%: latency
        ("memory", 60.0, 59.9, "memory", "compute", "low"),
        ("mixed", 30.0, 70.0, "mixed", "memory", "medium"),
        ("mixed", 30.0, 30.0, "mixed", "latency", "low"),
        ("compute", 70.0, 70.0, "compute", "memory", "low"),  # a tie reads as memory
        (None, 30.0, 70.0, "memory", "memory", "medium"),
        (None, 10.0, 10.0, "latency", "latency", "medium"),
    ],
)
def test_classify_branches(theoretical, sm, mem, cls, measured, confidence) -> None:  # noqa: ANN001
    s = classify(theoretical, sol(sm, mem))
    assert (s.cls, s.measured, s.confidence, s.theoretical) == (
        cls,
        measured,
        confidence,
        theoretical,
    )
    assert s.sm_pct == sm
    assert s.memory_pct == mem


def test_classify_missing_inputs() -> None:
    only_theory = classify("compute", None)
    assert (only_theory.cls, only_theory.confidence, only_theory.measured) == (
        "compute",
        "medium",
        None,
    )
    partial = classify("memory", km({SM: 50.0}))  # memory SOL absent
    assert partial.measured is None
    assert partial.confidence == "medium"
    nothing = classify(None, None)
    assert (nothing.cls, nothing.confidence) == (None, "none")
    assert "unknown" in nothing.describe()
    with pytest.raises(KernelproError, match="Unknown theoretical bottleneck class 'io'"):
        classify("io", None)


def test_classify_on_fixtures() -> None:
    assert probe_ctx("vec_add_kernel").stage1.confidence == "high"  # type: ignore[union-attr]
    naive = probe_ctx("naive_softmax_kernel").stage1
    assert naive is not None
    assert (naive.cls, naive.measured) == ("memory", "latency")


def _guidance_for(base: str, mode: str = "tools") -> str:
    k = probe()[base]
    c = probe_ctx(base)
    run = run_tools(k.report, c.stage1, op_category=c.op_category, min_bytes=c.min_bytes)
    return generate_prompt_guidance(k.report, run, c.stage1, mode=mode)


def test_guidance_sections_in_order() -> None:
    text = _guidance_for("naive_softmax_kernel")
    assert text.startswith(HEADING)
    order = [
        text.index(h)
        for h in (
            "Bottleneck class (Stage 1)",
            "### SASS summary",
            "### Timeline summary",
            "### Findings (by severity)",
            "### ncu metrics by category",
        )
    ]
    assert order == sorted(order)
    # Findings by severity: every critical before the first low.
    severities = [
        line.split("[")[1].split("]")[0]
        for line in text.splitlines()
        if line.startswith("#### ") and "[" in line
    ]
    ranks = ["CRITICAL", "HIGH", "MEDIUM", "LOW"]
    assert severities == sorted(severities, key=ranks.index)
    assert severities[0] == "CRITICAL"
    assert "global_coalescing" in text
    assert "63x 32-bit" in text
    assert "**Recommendations (ranked):**" in text
    assert "expected" in text
    assert "- **Warp stalls (% of active warp-cycles)**:" in text


def test_guidance_renders_timeline_and_not_collected() -> None:
    rep = report(
        stall_values(long_scoreboard=70.0),
        timeline=timeline(overhead=0.3, gaps_us=(50.0,), sync_calls=1),
    )
    rep.not_collected.append(NotCollected("sass", "cuobjdump not found"))
    text = generate_prompt_guidance(rep, run_tools(rep))
    assert "- kineto: 10 kernel launches" in text
    assert "launch overhead 30.0%" in text
    assert "largest 50.0 us before `kernel_0`" in text
    assert "### SASS summary\n- not collected: cuobjdump not found" in text
    assert "Launch overhead: 30.0%" in text


def test_guidance_raw_and_none_modes() -> None:
    raw = _guidance_for("vec_add_kernel", mode="raw")
    assert raw.startswith(RAW_HEADING)
    body = [line for line in raw.splitlines()[1:] if not line.startswith("### ")]
    assert body
    assert all(" = " in line for line in body)
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed = 90.36%" in raw
    assert "Automated" not in raw
    assert "Recommendations" not in raw
    assert "device__attribute" not in raw
    assert _guidance_for("vec_add_kernel", mode="none") == ""
    with pytest.raises(KernelproError, match="Unknown guidance mode 'all'"):
        _guidance_for("vec_add_kernel", mode="all")


def test_guidance_without_findings() -> None:
    rep = report({SM: 10.0})
    text = generate_prompt_guidance(rep, run_tools(rep))
    assert "No tool fired" in text
    assert "Not run (inputs missing)" in text


def test_render_findings_text() -> None:
    rep = report(stall_values(long_scoreboard=70.0))
    text = render_findings_text(run_tools(rep))
    assert text.splitlines()[0].startswith("[CRITICAL] k(float*) :: warp_stalls:")
    assert "    1. Stage data that is reused in shared memory" in text
    assert "not run (inputs missing):" in text
    assert render_findings_text(run_tools(report({SM: 1.0}), tools=["warp_stalls"])).startswith(
        "tools: no finding"
    )
