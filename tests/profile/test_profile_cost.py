"""What a candidate's profile costs, and what it no longer pays for every candidate: the ncu
metric catalog is asked once in the search's process and handed to each candidate's child
(each child is a new process, which asked again before), and every profile says how long
each part took (`phases`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_kernelpro.analysis import RooflineFacts
from pytest_kernelpro.optimize.candidate_profile.evaluator import (
    CandidateProfiler,
    ProfilingEvaluator,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.profile.ncu import NcuRequest, query_catalog, run_ncu

DATA = Path(__file__).resolve().parents[1] / "data" / "profile"
TARGET = ("python", "-m", "pytest_kernelpro.profile.target", "spec.json")


def counting_ncu(folder: Path) -> tuple[str, Path]:
    """A stand-in ncu that answers --query-metrics from the H200 capture and counts it."""
    queries = folder / "queries.txt"
    path = folder / "ncu"
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "if '--query-metrics' in sys.argv:\n"
        f"    with open({str(queries)!r}, 'a') as out:\n"
        "        out.write('q\\n')\n"
        f"    print(open({str(DATA / 'ncu_query_metrics.txt')!r}).read())\n"
        "    sys.exit(0)\n"
        f"print(open({str(DATA / 'ncu_raw.csv')!r}).read())\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return str(path), queries


def test_the_metric_catalog_is_asked_once_per_process(tmp_path: Path) -> None:
    ncu, queries = counting_ncu(tmp_path)
    request = NcuRequest(target_command=TARGET, metrics=("dram__bytes_read.sum", "sm__gone.sum"))
    first = run_ncu(request, ncu_path=ncu)
    second = run_ncu(request, ncu_path=ncu)
    assert queries.read_text() == "q\n"  # one query for both runs
    assert first.dropped_metrics == second.dropped_metrics == ("sm__gone.sum",)
    assert first.attempts == second.attempts == 1
    assert len(second.kernels) == 51
    assert query_catalog(ncu) is query_catalog(ncu)


def test_the_profiler_asks_for_the_catalog_in_its_own_process(tmp_path: Path) -> None:
    ncu, queries = counting_ncu(tmp_path)
    facts = RooflineFacts(bound="memory")
    on_gpu = CandidateProfiler("", facts, device="cuda", ncu_path=ncu)
    catalog = on_gpu._ncu_catalog()
    assert catalog is not None
    assert "dram__bytes_read" in catalog
    assert on_gpu._ncu_catalog() is catalog
    assert queries.read_text() == "q\n"
    # A CPU profile has no ncu to ask.
    assert CandidateProfiler("", facts, device="cpu", ncu_path=ncu)._ncu_catalog() is None


REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
"""
GOOD = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x + x\n"


@pytest.mark.slow
def test_every_profile_says_what_each_of_its_parts_cost() -> None:
    facts = RooflineFacts(bound="memory", min_bytes=8192.0, flops=1024.0, roofline_time_s=1e-6)
    profiler = CandidateProfiler(REFERENCE, facts, device="cpu", timeout_s=120)

    class Correct:
        def evaluate(self, candidate: Candidate) -> Evaluation:
            return Evaluation(status="correct", speedup=1.0, metrics={"candidate_median_s": 2e-6})

    evaluator = ProfilingEvaluator(Correct(), profiler, feedback="tools")
    evaluation = evaluator.evaluate(Candidate(code=GOOD, strategy="x + x"))
    phases = evaluation.metrics["profile"]["phases"]
    # The child's build (imports, the model) and its analysis always run; on a CPU the
    # timeline and ncu are not collected, so they have no part.
    assert {"build", "static", "analysis"} <= set(phases)
    assert "ncu" not in phases
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["build"] <= evaluation.metrics["profile"]["profile_s"]
    (record,) = evaluator.records
    assert record.phases == phases
    assert record.compile_cache == "cold"  # no evaluation kept caches for it


def test_a_catalog_handed_over_is_used_without_asking_ncu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.profile import collect

    ncu, queries = counting_ncu(tmp_path)
    monkeypatch.setattr(collect, "_gpu_problem", lambda device: None)  # as on the GPU
    phases: dict[str, float] = {}
    report = collect.profile_kernel_item(
        ProblemLocator(str(tmp_path / "absent.py"), "kernel"),
        device="cuda",
        metrics=("dram__bytes_read.sum", "sm__gone.sum"),
        ncu_path=ncu,
        ncu_catalog=["dram__bytes_read", "gpu__time_duration"],
        phases=phases,
        timeline_in_process=True,
    )
    assert not queries.exists()  # the child did not start ncu to ask
    dropped = [n.why for n in report.not_collected if n.what == "ncu-metrics"]
    assert dropped
    assert "sm__gone.sum" in dropped[0]
    assert report.kernels  # one per distinct kernel of the capture's 51 launches
    assert report.arch == "sm_90"
    assert phases["ncu_query"] == 0.0
    assert phases["ncu_attempts"] == 1.0
    assert set(phases) >= {"static", "timeline", "ncu"}
