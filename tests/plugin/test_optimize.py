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
            "*wall: setup * s, sandbox_probe * s, current_kernel * s, reference_profile * s, "
            "generate * s, build * s, check * s, time * s, profile * s, remeasure * s, "
            "confirm * s, patches * s, other * s",
        ]
    )
    summary = records_by_name(kp_project)["double"]["extra"]["optimize"]
    assert summary["evaluations"] == 2
    assert summary["best_speedup"] > 0
    assert summary["status"] in ("improved", "no improvement found")
    # The current kernel's sandbox evaluation is part of the split (it starts a worker and
    # the judge: never free), and no phase is counted twice: their sum is the search's time.
    wall, elapsed = summary["wall_s"], summary["elapsed_s"]
    assert wall["current_kernel"] > 0
    named = sum(v for k, v in wall.items() if k != "other")
    assert named <= elapsed
    assert summary["wall_overlap_s"] == 0.0  # one evaluation at a time here
    # Every second is in a bucket: `other` is exactly the rest, and the rest is small (the
    # search's bookkeeping, not a whole phase left out of the split).
    assert wall["other"] == pytest.approx(elapsed - named, abs=1e-6)
    assert wall["other"] < 0.1 * elapsed
    # Both evaluations' parts add up to their own elapsed time, the judge's process included.
    for part in summary["per_candidate"]:
        pieces = ("build_s", "check_s", "time_s", "profile_s", "other_s")
        assert sum(part[k] for k in pieces) == pytest.approx(part["elapsed_s"])
        if part["status"] == "correct":
            assert 0 < part["judge_s"] <= part["check_s"]
    assert summary["sandbox"]["isolation"]
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


STEALER = """### Strategy: read what the session knows
```python
import glob
import os

import torch
from torch import nn

STOLEN = []
for path in ["/proc/self/environ", f"/proc/{os.getppid()}/environ", *glob.glob("/proc/*/environ")]:
    try:
        STOLEN.append(open(path, "rb").read().decode("utf-8", "replace").replace("\\0", " "))
    except OSError:
        pass
print("STOLEN", " ".join(STOLEN))


class ModelNew(nn.Module):
    def forward(self, x):
        raise RuntimeError("the kernel needs these settings: " + " ".join(STOLEN)[:4000])
```
"""
CANARY = "ghp_kernelproCanary0123456789abcdef"


@pytest.mark.slow
def test_a_canary_secret_reaches_no_prompt_and_no_artifact(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate reads every environment it can and puts it in its failure, which goes
    into the next (debug) prompt: the session's secret must be in none of them."""
    kp_project.makepyfile(test_k=KERNEL)
    with running_fake_api([Reply(STEALER), Reply(CANDIDATE), Reply(CANDIDATE)]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-secret")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("GITHUB_TOKEN", CANARY)
        monkeypatch.setenv("KERNELPRO_CANARY_TOKEN", CANARY)
        result = kp_project.runpytest(
            "--kernelpro-optimize=2", "--kernelpro-feedback=none", "--kernelpro-candidates=1", "-rA"
        )
    result.assert_outcomes(passed=1)
    summary = records_by_name(kp_project)["double"]["extra"]["optimize"]
    out_dir = Path(summary["trajectory"]).parent
    trajectory = Path(summary["trajectory"]).read_text()
    assert "the kernel needs these settings" in trajectory  # the stealer ran and failed
    artifacts = {
        "prompts": json.dumps([r["body"] for r in api.requests]),
        "llm-calls.jsonl": (out_dir / "llm-calls.jsonl").read_text(),
        "trajectory.jsonl": trajectory,
        "report": (kp_project.path / ".kernelpro" / "kernelpro-report.json").read_text(),
        "terminal": result.stdout.str() + result.stderr.str(),
    }
    assert len(api.requests) >= 2  # the debug prompt after the stealer was sent
    leaked = [name for name, text in artifacts.items() if CANARY in text]
    assert leaked == []
