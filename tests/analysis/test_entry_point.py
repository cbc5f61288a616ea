"""One analysis entry point: `--kernelpro-profile`, the automatic profile of a regression and
the search's profiling evaluator all reach `analysis.profile_and_analyze`, which collects one
metric list (curated + what the tools declare) and analyzes it with the same tools.

The profiler itself (ncu, SASS, kineto) is replaced by the H200 profile of a real record
(`tests/data/tools/h200-example-repo`, the example repository's `--kernelpro-profile` run),
so each caller's result can be compared with `analyze_report` on that profile.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from pytest_kernelpro.analysis import (
    RooflineFacts,
    analyze_report,
    report_from_dict,
    requested_metrics,
)
from pytest_kernelpro.profile.metrics_catalog import CURATED_METRICS
from pytest_kernelpro.record import RooflinePart
from pytest_kernelpro.run.context import Profiling
from pytest_kernelpro.tools import Finding, MetricRequest, ProfilingTool, ToolContext, ToolRegistry

DATA = Path(__file__).resolve().parent.parent / "data"
RECORDS = DATA / "tools" / "h200-example-repo" / "profile_records.json"
SEARCH_CPU = DATA / "search" / "cpu"


def _record(name: str = "softmax_rows") -> dict[str, Any]:
    data = json.loads(RECORDS.read_text(encoding="utf-8"))
    return next(r for r in data["records"] if r["name"] == name)


def _facts(record: dict[str, Any]) -> RooflineFacts:
    return RooflineFacts.from_roofline(
        record["roofline"],
        median_s=record["timing"]["stats"]["median_s"],
        efficiency=record["efficiency"],
    )


class _FakeProfiler:
    """Stands in for `profile.collect.profile_kernel_item`: records what it was asked and
    returns a fresh copy of the captured H200 profile."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.calls: list[dict[str, Any]] = []

    def __call__(self, locator: Any, **kw: Any) -> Any:
        self.calls.append({"locator": locator, **kw})
        return report_from_dict(self.record["profile"])


@pytest.fixture
def fake_profiler(monkeypatch: pytest.MonkeyPatch) -> _FakeProfiler:
    fake = _FakeProfiler(_record())
    monkeypatch.setattr("pytest_kernelpro.profile.collect.profile_kernel_item", fake)
    return fake


class _Declares(ProfilingTool):
    name = "declares_a_counter"
    description = "reads a counter the curated catalog lacks"
    required_metrics = (
        MetricRequest("smsp__made_up_counter.sum", "made up", alternatives=("sm__made_up.sum",)),
        MetricRequest("launch__made_up", "launch attribute", required=False),
    )

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        return self.make_finding(ctx, severity="low", title="declared", root_cause="x")


def test_requested_metrics_is_the_curated_list_plus_what_tools_declare() -> None:
    curated = [m.name for m in CURATED_METRICS if not m.implicit]
    builtin = ToolRegistry.builtin()
    names = requested_metrics(builtin)
    assert list(names[: len(curated)]) == curated
    assert len(set(names)) == len(names)
    declared_extra = {
        n
        for cls in builtin.tool_classes()
        for r in cls.required_metrics
        if r.name not in {m.name for m in CURATED_METRICS}
        for n in r.names
        if not n.startswith(("launch__", "device__attribute"))
    }
    assert set(names) == set(curated) | declared_extra
    assert requested_metrics() == names  # the default registry: the built-in tools here
    mine = ToolRegistry([_Declares])
    assert requested_metrics(mine) == (*curated, "smsp__made_up_counter.sum", "sm__made_up.sum")


def test_profile_and_analyze_collects_the_one_list_and_runs_the_same_tools(
    fake_profiler: _FakeProfiler,
) -> None:
    from pytest_kernelpro.analysis import profile_and_analyze

    mine = ToolRegistry.builtin()
    mine.register(_Declares)
    record = fake_profiler.record
    analysis = profile_and_analyze("loc", _facts(record), registry=mine)
    (call,) = fake_profiler.calls
    assert call["metrics"] == requested_metrics(mine)
    assert "smsp__made_up_counter.sum" in call["metrics"]
    # The tool that declared the counter ran on the profile (its counter is absent there).
    skipped = {(s.tool, s.reason) for s in analysis.tool_run.skipped}
    assert ("declares_a_counter", "missing_metrics") in skipped
    # Without the extra tool: exactly what analyze_report makes of the same profile.
    plain = profile_and_analyze("loc", _facts(record))
    assert fake_profiler.calls[-1]["metrics"] == requested_metrics()
    direct = analyze_report(report_from_dict(record["profile"]), _facts(record))
    assert plain.guidance_md == direct.guidance_md
    assert plain.text == direct.text
    assert plain.tool_run.to_dict() == direct.tool_run.to_dict()


def _item(record: dict[str, Any]) -> tuple[Any, Any]:
    """A kernel item's run and the profiling setup, as the stages see them."""
    rec = SimpleNamespace(
        name=record["name"],
        roofline=msgspec.convert(record["roofline"], RooflinePart),
        median_s=record["timing"]["stats"]["median_s"],
        efficiency=record["efficiency"],
        device_kind="cuda",
        profile=None,
        guidance=None,
        extra={},
    )
    run = SimpleNamespace(
        record=rec, locator="loc", nodeid="test_k.py::k", name=record["name"], device="cuda"
    )
    profiling = Profiling(capture=None, timeout_s=60.0, auto_limit=3, auto_time_s=600.0)
    return run, profiling


def test_the_three_callers_reach_one_analysis(fake_profiler: _FakeProfiler, tmp_path: Path) -> None:
    from pytest_kernelpro.optimize.candidate_profile import child as candidate
    from pytest_kernelpro.optimize.candidate_profile.evaluator import ProfilingEvaluator
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
    from pytest_kernelpro.run import profile_stage

    record = fake_profiler.record
    expected = analyze_report(report_from_dict(record["profile"]), _facts(record))
    assert expected.guidance_md.startswith("## Automated Bottleneck Analysis")

    # 1. --kernelpro-profile: the profile stage of a kernel item.
    run, profiling = _item(record)
    profile_stage.profile(run, profiling)
    assert run.record.guidance == expected.guidance_md
    assert run.record.extra["profile_text"] == expected.text
    assert run.record.extra["tools"] == expected.tool_run.to_dict()

    # 2. The automatic profile of a regression: the gate stage's call.
    run2, profiling2 = _item(record)
    profile_stage.auto_profile(run2, profiling2)
    assert profiling2.auto_done == 1
    assert run2.record.guidance == expected.guidance_md
    assert run2.record.extra["tools"] == expected.tool_run.to_dict()

    # 3. The search: the profiling evaluator wraps the sandbox's evaluator; its profiler is
    # the candidate child program (run here in process, so the fake profiler answers).
    reference = (SEARCH_CPU / "reference.py").read_text(encoding="utf-8")
    problem = tmp_path / "candidate_problem.py"
    problem.write_text(
        candidate.combined_problem(reference, (SEARCH_CPU / "correct.py").read_text()),
        encoding="utf-8",
    )

    def child(cand: Candidate, evaluation: Evaluation) -> dict[str, Any]:
        spec = {"problem_file": str(problem), "device": "cuda", "facts": _facts(record).to_dict()}
        return json.loads(json.dumps(candidate.run(spec)))

    class Sandbox:
        def evaluate(self, cand: Candidate) -> Evaluation:
            return Evaluation(status="correct", speedup=1.0)

    evaluator = ProfilingEvaluator(Sandbox(), child)  # type: ignore[arg-type]
    evaluation = evaluator.evaluate(Candidate(code="ModelNew", strategy="optimize"))
    assert evaluation.metrics["guidance_md"] == expected.guidance_md
    assert evaluation.metrics["profile"]["text"] == expected.text
    assert [f["title"] for f in evaluation.findings] == [
        f.title for f in expected.tool_run.sorted_findings()
    ]
    # All three asked the profiler for the same one list.
    assert [c["metrics"] for c in fake_profiler.calls] == [requested_metrics()] * 3
