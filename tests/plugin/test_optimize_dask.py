"""`--kernelpro-optimize` on a local Dask cluster of two CPU worker processes
(`--kernelpro-dask=local:2`), with the replay backend: the same outcome as a search in this
process, evaluations overlapping on the two workers (from the stamps the workers record,
not from wall-clock thresholds), the cluster named in the trajectory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.loop.replay import recording_record

pytest.importorskip("distributed")

KERNELS = """
import pytest, torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=inp)
def double(x):
    y = x
    for _ in range(100):
        y = y + 0.0
    return y * 2
"""


def _reply(strategy: str, body: str) -> str:
    return (
        f"### Strategy: {strategy}\n```python\nimport torch\nfrom torch import nn\n\n\n"
        f"class ModelNew(nn.Module):\n    def forward(self, x):\n        {body}\n```\n"
    )


REPLIES = [
    _reply("add the tensor to itself", "return x + x"),
    _reply("triple it", "return x * 3"),
    _reply("half-written", "return x +"),
]


@pytest.mark.slow
def test_search_on_two_dask_workers_overlaps_and_finds_the_same_winner(
    pytester: pytest.Pytester,
) -> None:
    root = Path(pytester.path)
    pytester.makepyfile(test_k=KERNELS)
    pytester.makeini("[pytest]\nkernelpro_time_budget = 0.2\nkernelpro_warmup_ms = 1\n")
    (root / "replays").mkdir()
    with open(root / "replays" / "double.jsonl", "w", encoding="utf-8") as handle:
        for text in REPLIES:
            handle.write(json.dumps(recording_record(text)) + "\n")
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--kernelpro-optimize=3",
        "--kernelpro-llm=replay:replays",
        "--kernelpro-feedback=none",
        "--kernelpro-candidates=1",
        "--kernelpro-dask=local:2",
        "-k",
        "double",
        timeout=900,
    )
    result.assert_outcomes(passed=1)
    report = json.loads((root / ".kernelpro" / "kernelpro-report.json").read_text())
    summary = report["records"][0]["extra"]["optimize"]
    # What a search in this process finds for these answers (test_optimize_handoff.py).
    assert summary["outcomes"] == {"correct": 1, "wrong": 1, "build_error": 1}
    assert summary["candidates"][0]["strategy"] == "add the tensor to itself"
    # The report names the cluster, with the seconds of its start, probe and close.
    assert set(summary["dask"]["timings"]) == {"start_s", "probe_s", "close_s"}

    run = Path(summary["run_dir"])
    lines = [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]
    header, nodes = lines[0], lines[1:]
    cluster = header["meta"]["dask"]
    assert cluster["local"] is True
    assert cluster["slots"] == 2
    assert len(cluster["workers"]) == 2
    assert all(w["secrets"] == [] for w in cluster["workers"])
    # The cluster's start and the workers' probe are timed (a CPU task: no CUDA rung to take).
    assert cluster["timings"]["start_s"] > 0
    assert cluster["timings"]["probe_s"] > 0
    assert [w["probe"] for w in cluster["workers"]] == ["own", "own"]
    stamps = [n["metrics"]["dask"] for n in nodes]
    assert len(stamps) == 3
    assert all(s["ended"] > s["started"] for s in stamps)
    overlapping = [
        (a, b)
        for i, a in enumerate(stamps)
        for b in stamps[i + 1 :]
        if a["started"] < b["ended"] and b["started"] < a["ended"]
    ]
    assert overlapping, f"no two evaluations ran at the same time: {stamps}"
    assert any(a["worker"] != b["worker"] for a, b in overlapping)
    # Every node's sandbox was the real one on the worker, judged there.
    assert all(n["metrics"]["sandbox"] for n in nodes)


def test_dask_requested_without_dask_installed_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_k=KERNELS)
    # As if Dask were not installed: importing it fails.
    pytester.makeconftest("import sys\nsys.modules['distributed'] = None\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelpro-optimize=2", "--kernelpro-llm=replay:replays",
        "--kernelpro-dask=local",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kernelpro-dask needs Dask*pip install*pytest-kernelpro*dask*"])
    assert not (Path(pytester.path) / ".kernelpro" / "optimize").exists()


def test_a_dask_value_that_is_neither_local_nor_an_address_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_k=KERNELS)
    result = pytester.runpytest_subprocess("--kernelpro-dask=everywhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*everywhere*neither 'local', 'local:N' nor a scheduler address*"])
