"""ToolRegistry, run_tools policies, entry-point discovery, and the base contract."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest
from tools_factories import ctx, report, stage, stall_values, timeline

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.tools import (
    AFFINITIES,
    Finding,
    MetricRequest,
    ProfilingTool,
    Recommendation,
    ToolContext,
    ToolRegistry,
    run_tools,
)
from pytest_kernelpro.tools import registry as registry_module
from pytest_kernelpro.tools.registry import affinity_allows
from pytest_kernelpro.tools.signals import stall_metric
from pytest_kernelpro.tools.stalls import WarpStallTool


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the default registry for a test that changes it; the original comes back."""
    monkeypatch.setattr(registry_module, "_default", registry_module.default_registry().copy())


def test_builtin_tools() -> None:
    names = ToolRegistry.names()
    assert len(names) >= 15
    for name in names:
        cls = ToolRegistry.get(name)
        assert cls.name == name
        assert cls.description
        assert cls.affinity in AFFINITIES
    assert {
        "warp_stalls",
        "barrier_stalls",
        "register_spills",
        "wgmma_vs_hmma",
        "tensor_core_underuse",
        "global_coalescing",
    } <= set(names)


def test_unknown_tool_names_the_registered_ones() -> None:
    with pytest.raises(KernelproError, match="Unknown micro-profiling tool 'nope'.*warp_stalls"):
        ToolRegistry.get("nope")


class _Echo(ProfilingTool):
    name = "echo_test_tool"
    description = "fires when metric x > LIMIT"
    affinity = "always"
    required_metrics = (MetricRequest("x", "x"),)
    LIMIT = 1.0

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        if (ctx.value("x") or 0.0) <= self.LIMIT:
            return None
        return self.make_finding(
            ctx,
            severity="high",
            title="x is big",
            root_cause="x",
            recommendations=[Recommendation("make x small", 1.2, 2.0)],
        )


def test_register_and_run_custom_tool(clean_registry: None) -> None:
    assert ToolRegistry.register(_Echo) is _Echo
    ToolRegistry.register(_Echo)  # registering the same class again is harmless
    run = run_tools(report({"x": 2.0}), tools=["echo_test_tool"])
    assert [f.title for f in run.findings] == ["x is big"]
    run = run_tools(
        report({"x": 2.0}), tools=["echo_test_tool"], thresholds={"echo_test_tool": {"LIMIT": 3.0}}
    )
    assert run.findings == []
    assert run.results[0].triggered is False


def test_register_rejects_bad_tools(clean_registry: None) -> None:
    ToolRegistry.register(_Echo)

    class Clash(_Echo):
        pass

    with pytest.raises(KernelproError, match="already registered"):
        ToolRegistry.register(Clash)

    class Abstract(ProfilingTool):
        name = "abstract_tool"

    with pytest.raises(KernelproError, match="abstract"):
        ToolRegistry.register(Abstract)  # type: ignore[type-abstract]

    class BadAffinity(_Echo):
        name = "bad_affinity_tool"
        affinity = "gpu"  # type: ignore[assignment]

    with pytest.raises(KernelproError, match="affinity 'gpu'"):
        ToolRegistry.register(BadAffinity)
    with pytest.raises(KernelproError, match="ProfilingTool subclass"):
        ToolRegistry.register(dict)  # type: ignore[arg-type]


def test_threshold_override_and_errors() -> None:
    tool = WarpStallTool(thresholds={"trigger_pct": 30, "CRITICAL_PCT": 50.0})
    assert tool.thresholds["TRIGGER_PCT"] == 30.0
    assert WarpStallTool.TRIGGER_PCT == 40.0
    c = ctx(stall_values(long_scoreboard=35.0))
    assert tool.trigger(c)
    assert not WarpStallTool().trigger(c)
    with pytest.raises(
        KernelproError,
        match=r"Unknown threshold 'TRIGER_PCT' for tool 'warp_stalls'; valid names: BANK_CONFLICT_LEAD_PCT, CRITICAL_PCT, EXCESS_BYTES_RATIO, ISSUE_HIDDEN_PCT, STREAM_LOW_DRAM_PCT, STREAM_MEDIUM_DRAM_PCT, STREAM_MIN_DRAM_PCT, STREAM_REUSE_RATIO, TRIGGER_PCT",
    ):
        WarpStallTool(thresholds={"TRIGER_PCT": 30})
    with pytest.raises(KernelproError, match="must be a number"):
        WarpStallTool(thresholds={"TRIGGER_PCT": "30"})  # type: ignore[dict-item]
    with pytest.raises(KernelproError, match="unknown or unselected tools: nope"):
        run_tools(report({"x": 1.0}), thresholds={"nope": {"A": 1}})


def test_missing_metrics_are_listed() -> None:
    run = run_tools(report({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 50.0}))
    skipped = {s.tool: s for s in run.skipped}
    assert skipped["warp_stalls"].reason == "missing_metrics"
    assert any(
        m.startswith(stall_metric("long_scoreboard")) for m in skipped["warp_stalls"].missing
    )
    assert skipped["occupancy"].missing == (
        "sm__maximum_warps_per_active_cycle_pct",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
    )
    assert skipped["launch_overhead"].missing == ("timeline",)
    assert skipped["l2_locality"].missing == (
        "min_bytes",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
    )
    no_ncu = run_tools(report(None))
    assert {s.missing for s in no_ncu.skipped if s.tool == "warp_stalls"} == {("metrics",)}


@pytest.mark.parametrize(
    ("affinity", "cls", "runs"),
    [
        ("memory", "memory", True),
        ("memory", "compute", False),
        ("compute", "memory", False),
        ("compute", "compute", True),
        ("memory", "mixed", True),
        ("compute", "latency", True),
        ("compute", None, True),
        ("latency", "compute", True),
        ("timeline", "memory", True),
        ("always", "compute", True),
    ],
)
def test_affinity_filter(affinity: str, cls: str | None, runs: bool) -> None:
    assert affinity_allows(affinity, cls) is runs


def test_run_tools_skips_by_affinity() -> None:
    values = {"sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 50.0}
    memory = {
        s.tool: s.reason
        for s in run_tools(report(values), stage("memory"), op_category="gemm").skipped
    }
    assert memory["tensor_core_underuse"] == "affinity"
    assert memory["wgmma_vs_hmma"] == "affinity"
    compute = {s.tool: s.reason for s in run_tools(report(values), stage("compute")).skipped}
    assert compute["global_coalescing"] == "affinity"
    assert compute["vectorization"] == "affinity"
    assert "warp_stalls" not in {t for t, r in compute.items() if r == "affinity"}


def test_tool_error_is_recorded_and_warned(clean_registry: None) -> None:
    class Broken(_Echo):
        name = "broken_test_tool"

        def evaluate(self, ctx: ToolContext) -> Finding | None:
            raise ZeroDivisionError("boom")

    ToolRegistry.register(Broken)
    with pytest.warns(KernelproWarning, match="broken_test_tool.*ZeroDivisionError: boom"):
        run = run_tools(report({"x": 2.0}), tools=["broken_test_tool", "warp_stalls"])
    assert [(s.tool, s.reason) for s in run.skipped if s.reason == "error"] == [
        ("broken_test_tool", "error")
    ]


def test_near_roofline_and_library_caps() -> None:
    values = stall_values(long_scoreboard=70.0)
    assert run_tools(report(values), tools=["warp_stalls"]).findings[0].severity == "critical"
    capped = run_tools(report(values), tools=["warp_stalls"], roofline_fraction=0.9).findings[0]
    assert capped.severity == "low"
    assert "90.0% of its roofline" in capped.notes[0]
    assert all(r.high <= 1 / 0.9 + 1e-9 for r in capped.recommendations)
    # MIO-throttle stalls: the warp_stalls tool itself does not look at DRAM for them (it does
    # for long scoreboard, see test_tools_streaming.py), so only the registry policy caps.
    mio = stall_values(mio_throttle=70.0)
    dram = {**mio, "dram__throughput.avg.pct_of_peak_sustained_elapsed": 79.9}
    assert run_tools(report(dram), tools=["warp_stalls"]).findings[0].severity == "critical"
    dram["dram__throughput.avg.pct_of_peak_sustained_elapsed"] = 80.0
    assert run_tools(report(dram), tools=["warp_stalls"]).findings[0].severity == "low"
    # The item's roofline efficiency does not hide a kernel at its DRAM roof: the highest
    # saturation wins (an unfused softmax at 17.9% of its roofline, one kernel at 82.1% DRAM).
    dram["dram__throughput.avg.pct_of_peak_sustained_elapsed"] = 82.1
    item = run_tools(report(dram), tools=["warp_stalls"], roofline_fraction=0.179).findings[0]
    assert item.severity == "low"
    assert "82.1% of its DRAM bandwidth peak" in item.notes[0]
    dram["dram__throughput.avg.pct_of_peak_sustained_elapsed"] = 50.0
    item = run_tools(report(dram), tools=["warp_stalls"], roofline_fraction=0.179).findings[0]
    assert item.severity == "critical"
    lib = run_tools(
        report(values, name="void cutlass::Kernel2<cutlass_80_simt_sgemm>(T1::Params)"),
        tools=["warp_stalls"],
    )
    assert lib.findings[0].severity == "medium"
    assert "library kernel" in lib.findings[0].notes[0]
    assert (
        run_tools(
            report(values, name="cutlass"), tools=["warp_stalls"], library_max_severity="high"
        )
        .findings[0]
        .severity
        == "high"
    )


def test_item_scope_tools_run_once_and_stage1_mapping() -> None:
    values = stall_values(long_scoreboard=70.0)
    rep = report(values, timeline=timeline(overhead=0.5))
    run = run_tools(rep, {"k(float*)": stage("memory")})
    overhead = [f for f in run.findings if f.tool == "launch_overhead"]
    assert len(overhead) == 1
    assert overhead[0].kernel == "(item)"
    assert run.stage1["k(float*)"].cls == "memory"
    data = json.loads(json.dumps(run.to_dict()))
    assert data["counts"]["high"] == sum(1 for f in run.findings if f.severity == "high")
    assert data["findings"][0]["severity"] == run.worst()
    assert data["findings"][0]["recommendations"][0]["rank"] == 1


def _write_dist(root: Path) -> None:
    (root / "kp_private_tools.py").write_text(
        textwrap.dedent(
            """
            from pytest_kernelpro.tools import ProfilingTool, ToolContext, Finding, MetricRequest

            class MoeImbalanceTool(ProfilingTool):
                name = "moe_imbalance"
                description = "private: expert load imbalance"
                affinity = "always"
                required_metrics = (MetricRequest("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm"),)
                IMBALANCE = 1.5

                def evaluate(self, ctx: ToolContext) -> Finding:
                    return self.make_finding(ctx, severity="medium", title="private", root_cause="team heuristic")
            """
        )
    )
    (root / "kp_private_mod.py").write_text(
        textwrap.dedent(
            """
            from pytest_kernelpro.tools import ProfilingTool, ToolRegistry

            @ToolRegistry.register
            class ModuleTool(ProfilingTool):
                name = "module_tool"
                description = "registered by import"
                def evaluate(self, ctx): return None
            """
        )
    )
    dist = root / "kp_private_tools-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-private-tools\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[pytest_kernelpro.tools]\n"
        "moe = kp_private_tools:MoeImbalanceTool\n"
        "mod = kp_private_mod\n"
        "broken = kp_no_such_module:Tool\n"
    )


def test_entry_point_discovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry: None
) -> None:
    _write_dist(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(KernelproWarning, match="entry point 'broken'.*kp_no_such_module"):
        loaded = ToolRegistry.load_entry_points(force=True)
    assert loaded == ["module_tool", "moe_imbalance"]
    assert ToolRegistry.get("moe_imbalance").IMBALANCE == 1.5  # type: ignore[attr-defined]
    run = run_tools(
        report({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 50.0}), tools=["moe_imbalance"]
    )
    assert [(f.tool, f.severity) for f in run.findings] == [("moe_imbalance", "medium")]


class _Req(ProfilingTool):
    name = "req_test"
    required_metrics: ClassVar = (
        MetricRequest("a", "a", alternatives=("b",)),
        MetricRequest("c", "c", required=False),
    )

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        return None


def test_metric_request_alternatives_and_context() -> None:
    assert _Req().missing_inputs(ctx({"c": 1.0})) == ["a (or b)"]
    assert _Req().missing_inputs(ctx({"b": 1.0})) == []
    c = ctx({"b": 2.0, "a": float("nan")})
    assert c.resolve(MetricRequest("a", "a", alternatives=("b",))) == ("b", 2.0)
    assert c.value("zzz", 7.0) == 7.0
    with pytest.raises(KernelproError, match="Unknown tool input 'gpu'"):
        c.has_input("gpu")


@pytest.mark.parametrize(
    ("arch", "metrics", "cc"),
    [
        ("sm_90a", {}, (9, 0)),
        ("sm_80", {}, (8, 0)),
        ("sm_100a", {}, (10, 0)),
        ("compute_89", {}, (8, 9)),
        (
            None,
            {
                "device__attribute_compute_capability_major": 9.0,
                "device__attribute_compute_capability_minor": 0.0,
            },
            (9, 0),
        ),
        (None, {}, None),
    ],
)
def test_compute_capability(
    arch: str | None, metrics: dict[str, float], cc: tuple[int, int] | None
) -> None:
    assert ctx(metrics, arch=arch).compute_capability == cc


def test_finding_and_recommendation_validation() -> None:
    with pytest.raises(KernelproError, match="Unknown severity 'urgent'"):
        Finding("t", "k", "urgent", "x", "y")
    with pytest.raises(KernelproError, match="invalid"):
        Recommendation("a", 2.0, 1.5)
    rec = Recommendation("a", 1.3, 1.5)
    assert rec.expected == "1.3-1.5x"
    assert rec.capped(1.2).expected == "1.2x"
    assert Recommendation("b", 2.0, 12.0).expected == "2-12x"
    assert rec.capped(0.5).high == 1.0


def test_library_recognition() -> None:
    assert ctx({}, name="nvjet_sm90_tst_256x128").library_match == "nvjet"
    assert ctx({}, name="void at::native::vectorized_elementwise_kernel<4>").library_match == "at::"
    assert ctx({}, name="my_gemm_kernel(float*)").library_match is None


def test_affinity_mode_both_adds_the_measured_class_tools() -> None:
    from tools_factories import probe, probe_ctx

    k, c = probe()["wmma_matmul_kernel"], probe_ctx("wmma_matmul_kernel")
    assert c.stage1 is not None
    assert (c.stage1.cls, c.stage1.measured) == ("compute", "memory")
    final = run_tools(k.report, c.stage1, op_category="gemm")
    both = run_tools(k.report, c.stage1, op_category="gemm", affinity_mode="both")
    assert "global_coalescing" not in {f.tool for f in final.findings}
    coalescing = [f for f in both.findings if f.tool == "global_coalescing"]
    assert [f.severity for f in coalescing] == ["high"]
    assert {f.tool for f in final.findings} < {f.tool for f in both.findings}
    with pytest.raises(KernelproError, match="Unknown affinity_mode 'all'"):
        run_tools(k.report, c.stage1, affinity_mode="all")


def test_evaluate_is_the_contract_and_trigger_analyze_derive_from_it() -> None:
    assert _Echo().evaluate(ctx({"x": 0.5})) is None
    finding = _Echo().evaluate(ctx({"x": 2.0}))
    assert finding is not None
    assert finding.title == "x is big"
    assert _Echo().trigger(ctx({"x": 2.0})) is True
    assert _Echo().analyze(ctx({"x": 2.0})).title == "x is big"
    with pytest.raises(KernelproError, match="analyze\\(\\) called on kernel"):
        _Echo().analyze(ctx({"x": 0.5}))

    class OnlyTrigger(ProfilingTool):
        name = "only_trigger_tool"

        def trigger(self, ctx: ToolContext) -> bool:
            return True

    with pytest.raises(KernelproError, match="abstract: implement evaluate"):
        ToolRegistry().register(OnlyTrigger)  # type: ignore[type-abstract]


def test_the_documented_tool_example_runs(clean_registry: None) -> None:
    """The user tool shown in docs/extending.md registers and fires as written there."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
    text = doc.read_text(encoding="utf-8")
    start = text.index("from pytest_kernelpro.tools import Finding, MetricRequest")
    code = text[start : text.index("```", start)]
    exec(compile(code, "docs/extending.md", "exec"), {})
    run = run_tools(report({"lts__t_sector_hit_rate.pct": 30.0}), tools=["l2_misses"])
    assert [(f.tool, f.severity, f.title) for f in run.findings] == [
        ("l2_misses", "medium", "L2 hit rate 30%")
    ]
    assert (
        run_tools(report({"lts__t_sector_hit_rate.pct": 80.0}), tools=["l2_misses"]).findings == []
    )
