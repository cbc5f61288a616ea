"""--kernelpro-optimize end to end on the CPU: the real anthropic and openai SDKs against
loopback servers that play the Messages API and an OpenAI-compatible server, the real
sandboxed evaluator, MCTS, patch and trajectory."""

from __future__ import annotations

import json
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXED_CEILINGS, records_by_name
from test_optimize_handoff import _session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optimize" / "agents"))
from fake_messages_api import Reply, running_fake_api  # noqa: E402
from fake_openai_api import ChatReply, running_fake_chat_api  # noqa: E402

# The SDKs are optional (pytest-kernelpro[llm]); without one, the session stops at a usage
# error naming it, before the behaviour these tests are about.
needs_anthropic = pytest.mark.skipif(
    find_spec("anthropic") is None, reason="needs the anthropic package (pytest-kernelpro[llm])"
)
needs_openai = pytest.mark.skipif(
    find_spec("openai") is None, reason="needs the openai package (pytest-kernelpro[llm])"
)

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

WRONG_CANDIDATE = CANDIDATE.replace("return x + x", "return x + x + x")

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


@pytest.fixture(scope="module")
def anthropic_session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `--kernelpro-optimize=2` session through the real anthropic SDK against the
    loopback Messages API, shared by the two tests below (each session is a sandboxed search):
    the first candidate reads every environment it can and puts it in its failure, which goes
    into the next (debug) prompt; the second is correct. The session's environment holds a
    canary secret from its start (its own process: /proc/self/environ has it)."""
    if find_spec("anthropic") is None:
        pytest.skip("needs the anthropic package (pytest-kernelpro[llm])")
    root = tmp_path_factory.mktemp("optimize")
    (root / "test_k.py").write_text(KERNEL.strip())
    (root / "ceilings.json").write_text(json.dumps(FIXED_CEILINGS))
    (root / "pytest.ini").write_text(
        "[pytest]\nkernelpro_device = cpu\n"
        f"kernelpro_ceilings = {root / 'ceilings.json'}\n"
        "kernelpro_time_budget = 0.2\nkernelpro_warmup_ms = 1\n"
    )
    with (
        running_fake_api([Reply(STEALER), Reply(CANDIDATE), Reply(CANDIDATE)]) as api,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.delenv("KERNELPRO_DEVICE", raising=False)  # the ini's device: the CPU
        env = {
            "ANTHROPIC_API_KEY": "sk-test-not-a-secret",
            "ANTHROPIC_BASE_URL": api.url,
            "GITHUB_TOKEN": CANARY,
            "KERNELPRO_CANARY_TOKEN": CANARY,
        }
        result = _session(
            root,
            "-p",
            "no:cacheprovider",
            "--kernelpro-optimize=2",
            "--kernelpro-feedback=none",
            "--kernelpro-candidates=1",
            "-rA",
            env=env,
            timeout=900,
        )
    report = root / ".kernelpro" / "kernelpro-report.json"
    # No report: each test fails on the session's outcome, with its output.
    records = json.loads(report.read_text())["records"] if report.is_file() else []
    by_name = {r["name"]: r for r in records}
    return {"root": root, "api": api, "result": result, "records": by_name}


@needs_anthropic
@pytest.mark.slow
def test_optimize_writes_trajectory_patch_and_section(anthropic_session: dict[str, Any]) -> None:
    """The session's files and its summary section: its first candidate failed (the
    environment reader), the second is correct."""
    result, api = anthropic_session["result"], anthropic_session["api"]
    result.assert_outcomes(passed=1)
    # Re-measured against the current kernel; whether it wins is the CPU's timing, not
    # asserted here (tests/optimize/search/test_ranking.py covers the rule).
    result.stdout.fnmatch_lines(
        [
            "*optimize: *",
            # Up to 5 rounds; fewer when the ranking's time budget runs out (a loaded machine).
            "*candidate *x the current kernel (*x the reference), re-measured in * interleaved "
            "round*: * (2 evaluations*",
            "*wall: setup * s, sandbox_probe * s, current_kernel * s, reference_profile * s, "
            "generate * s, build * s, check * s, time * s, profile * s, remeasure * s, "
            "confirm * s, patches * s, other * s",
        ]
    )
    summary = anthropic_session["records"]["double"]["extra"]["optimize"]
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


@needs_anthropic
@pytest.mark.slow
def test_a_canary_secret_reaches_no_prompt_and_no_artifact(
    anthropic_session: dict[str, Any],
) -> None:
    """A candidate reads every environment it can and puts it in its failure, which goes
    into the next (debug) prompt: the session's secret must be in none of them."""
    result, api = anthropic_session["result"], anthropic_session["api"]
    result.assert_outcomes(passed=1)
    summary = anthropic_session["records"]["double"]["extra"]["optimize"]
    out_dir = Path(summary["trajectory"]).parent
    trajectory = Path(summary["trajectory"]).read_text()
    assert "the kernel needs these settings" in trajectory  # the stealer ran and failed
    artifacts = {
        "prompts": json.dumps([r["body"] for r in api.requests]),
        "llm-calls.jsonl": (out_dir / "llm-calls.jsonl").read_text(),
        "trajectory.jsonl": trajectory,
        "report": (anthropic_session["root"] / ".kernelpro" / "kernelpro-report.json").read_text(),
        "terminal": result.stdout.str() + result.stderr.str(),
    }
    assert len(api.requests) >= 2  # the debug prompt after the stealer was sent
    leaked = [name for name, text in artifacts.items() if CANARY in text]
    assert leaked == []


def test_bad_budget_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kernelpro-optimize=lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kernelpro-optimize*lots*"])


# The OpenAI-compatible sessions below run in a subprocess: an in-process run takes the
# modules it imported out of sys.modules when it ends (pytester's snapshot), among them the
# parts of the SDK's HTTP stack loaded on its first request, and a later test of this process
# then gets connection errors the SDK no longer turns into its own APIConnectionError.


@pytest.fixture
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNELPRO_MODEL", "KERNELPRO_LLM"):
        monkeypatch.delenv(name, raising=False)


@needs_openai
@pytest.mark.slow
@pytest.mark.usefixtures("no_openai_env")
def test_a_local_server_without_a_model_option_searches_with_the_model_it_serves(
    kp_project: pytest.Pytester,
) -> None:
    """The new user's command: an OpenAI-compatible server's URL and no --kernelpro-model."""
    kp_project.makepyfile(test_k=KERNEL)
    # A wrong candidate: the model's name is the point, so the search ends at its one
    # evaluation, without the final re-measurement and confirmation a correct one costs.
    with running_fake_chat_api([ChatReply(WRONG_CANDIDATE)], served=["local-coder"]) as api:
        result = kp_project.runpytest_subprocess(
            "--kernelpro-optimize=1", "--kernelpro-llm=openai",
            f"--kernelpro-llm-base-url={api.url}", "--kernelpro-feedback=none",
            "--kernelpro-candidates=1", "-W", "always::pytest_kernelpro.errors.KernelproWarning",
        )  # fmt: skip
    result.assert_outcomes(passed=1)
    said = (
        "kernelpro: optimizing with model 'local-coder', the only model the server at "
        f"{api.url} serves (no --kernelpro-model set)"
    )
    assert result.stdout.str().count(said) == 1
    assert api.models_listed() == 1
    chats = [r["body"] for r in api.requests if r["path"] == "/v1/chat/completions"]
    assert chats
    assert {body["model"] for body in chats} == {"local-coder"}
    # Its price is unknown: said as it is, with nothing about a dollar budget none gave.
    result.stdout.fnmatch_lines(
        ["*no price known for model 'local-coder': its cost is not counted (it shows as $0.00), "
         "its token counts are.*"]
    )  # fmt: skip
    summary = records_by_name(kp_project)["double"]["extra"]["optimize"]
    assert summary["evaluations"] == 1
    assert summary["outcomes"] == {"wrong": 1}  # the served model's answer was evaluated


@needs_openai
@pytest.mark.usefixtures("no_openai_env")
def test_the_model_taken_from_a_local_server_is_said_at_any_verbosity(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=KERNEL)
    with running_fake_chat_api([], served=["local-coder"]) as api:
        result = kp_project.runpytest_subprocess(
            "-q", "--co", "--kernelpro-optimize=1", "--kernelpro-llm=openai",
            f"--kernelpro-llm-base-url={api.url}",
        )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    assert result.stdout.lines[0] == (
        "kernelpro: optimizing with model 'local-coder', the only model the server at "
        f"{api.url} serves (no --kernelpro-model set)"
    )


@needs_openai
@pytest.mark.usefixtures("no_openai_env")
def test_a_dollar_budget_for_an_unpriced_served_model_names_the_price_setting(
    kp_project: pytest.Pytester,
) -> None:
    """A local server's model is in no price table: a budget in dollars cannot be kept for it
    until the user gives its price, which is a setting, not an edit of the package."""
    kp_project.makepyfile(test_k=KERNEL)
    with running_fake_chat_api([], served=["local-coder"]) as api:
        refused = kp_project.runpytest_subprocess(
            "--co", "--kernelpro-optimize=2usd", "--kernelpro-llm=openai",
            f"--kernelpro-llm-base-url={api.url}",
        )  # fmt: skip
        priced = kp_project.runpytest_subprocess(
            "--co", "--kernelpro-optimize=2usd", "--kernelpro-llm=openai",
            f"--kernelpro-llm-base-url={api.url}", "--kernelpro-llm-price=0,0",
        )  # fmt: skip
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        ["ERROR: kernelpro: --kernelpro-optimize cannot run: the budget '2usd' is in dollars but "
         "model 'local-coder' (*) has no known price, so its spend cannot be counted; give its "
         "price with --kernelpro-llm-price=IN,OUT (dollars per million tokens) or give an "
         "evaluation or time budget"]
    )  # fmt: skip
    assert "prices.yaml" not in refused.stderr.str()
    assert priced.ret == pytest.ExitCode.OK, priced.stderr.str()
    assert not (kp_project.path / ".kernelpro" / "optimize").exists()  # --co ran no search


@pytest.mark.parametrize("text", ["3", "3,15,1", "a,b", "-1,15", "3,", "nan,1", "inf,1"])
def test_a_malformed_model_price_is_a_usage_error_naming_the_value(
    pytester: pytest.Pytester, text: str
) -> None:
    pytester.makepyfile(test_k=KERNEL)
    result = pytester.runpytest_inprocess("--co", f"--kernelpro-llm-price={text}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--kernelpro-llm-price: {text!r} is not a price: write IN,OUT in dollars per million*"]
    )


@needs_openai
@pytest.mark.usefixtures("no_openai_env")
def test_a_local_server_serving_two_models_is_a_usage_error_naming_both_and_the_option(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=KERNEL)
    with running_fake_chat_api([], served=["local-coder", "local-coder-small"]) as api:
        result = kp_project.runpytest_subprocess(
            "--kernelpro-optimize=1",
            "--kernelpro-llm=openai",
            f"--kernelpro-llm-base-url={api.url}",
        )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: kernelpro: --kernelpro-optimize cannot run: no model is set for "
            "--kernelpro-llm=openai (set it with --kernelpro-model=NAME, ini key kernelpro_model "
            f"or environment variable KERNELPRO_MODEL), and the server at {api.url} (command "
            "line --kernelpro-llm-base-url) serves 2 models: 'local-coder', 'local-coder-small'; "
            "choose one"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert [r["path"] for r in api.requests] == ["/v1/models"]  # no chat, no kernel ran
    assert not (kp_project.path / ".kernelpro" / "optimize").exists()


@needs_openai
@pytest.mark.usefixtures("no_openai_env")
@pytest.mark.parametrize("status", [500, 404])
def test_a_local_server_whose_model_list_fails_is_a_usage_error(
    kp_project: pytest.Pytester, status: int
) -> None:
    kp_project.makepyfile(test_k=KERNEL)
    with running_fake_chat_api([], models_status=status) as api:
        result = kp_project.runpytest_subprocess(
            "--kernelpro-optimize=1",
            "--kernelpro-llm=openai",
            f"--kernelpro-llm-base-url={api.url}",
        )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: kernelpro: --kernelpro-optimize cannot run: no model is set for "
            f"--kernelpro-llm=openai *, and asking the server at {api.url} (command line "
            f"--kernelpro-llm-base-url) which models it serves failed: GET {api.url}/models "
            f"answered HTTP {status} *; or set the model, and the server is not asked"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
