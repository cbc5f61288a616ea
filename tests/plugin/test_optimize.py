"""--kernelpro-optimize end to end on the CPU: the real anthropic SDK against a loopback
server that plays the Messages API, the real sandboxed evaluator, MCTS, patch and trajectory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import records_by_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from fake_messages_api import Reply, running_fake_api  # noqa: E402

KERNEL = """
import pytest, torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=inp)
def double(x):
    return x * 2
"""

CANDIDATE = """### Strategy: add the tensor to itself instead of multiplying
```python
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x + x
```
"""


@pytest.mark.slow
def test_optimize_writes_trajectory_patch_and_section(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    kp_project.makepyfile(test_k=KERNEL)
    with running_fake_api([Reply(CANDIDATE), Reply(CANDIDATE), Reply(CANDIDATE)]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-secret")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        result = kp_project.runpytest(
            "--kernelpro-optimize=2", "--kernelpro-feedback=none", "--kernelpro-candidates=1", "-rA"
        )
    result.assert_outcomes(passed=1)
    # Re-measured against the current kernel; whether it wins is the CPU's timing, not
    # asserted here (tests/search/test_ranking.py covers the rule).
    result.stdout.fnmatch_lines(
        [
            "*optimize: *",
            "*candidate *x the current kernel (*x the reference), re-measured in 5 interleaved "
            "rounds: * (2 evaluations*",
            "*wall: generate * s, build * s, check * s, time * s, profile * s, remeasure * s",
        ]
    )
    summary = records_by_name(kp_project)["double"]["extra"]["optimize"]
    assert summary["evaluations"] == 2
    assert summary["best_speedup"] > 0
    assert summary["status"] in ("improved", "no improvement found")
    ranking = summary["ranking"]
    assert ranking["baseline"] == "current kernel"
    assert ranking["current_samples"] > 0
    assert ranking["candidates"][0]["rank"] == 1
    patch = Path(summary["patch"]).read_text()
    assert "+        return x + x" in patch
    assert api.requests[0]["path"].startswith("/v1/models/")  # the reachability check
    lines = Path(summary["trajectory"]).read_text().splitlines()
    nodes = [json.loads(line) for line in lines if '"kind"' not in line or '"node"' in line]
    assert len(lines) >= 3  # header + two evaluated nodes
    assert all("sk-test-not-a-secret" not in line for line in lines)
    assert nodes
    assert api.requests, "the SDK reached the loopback server"


def test_bad_budget_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kernelpro-optimize=lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kernelpro-optimize*lots*"])
