"""The timing attacks through the optimizer, as a user runs it: `pytest --kernelpro-optimize`
with a replay corpus that proposes each cheating candidate, then the honest one.

The problem is KernelBench level 2 `14_Gemm_Divide_Sum_Scaling` scaled down to the CPU
(batch 32, 1024x1024: the reference's GEMM takes milliseconds, the rewrite reads the weight
once). Every attack computes the reference's work honestly on its first `ARMED` calls (the
correctness trials, the in-place and shape checks, the mix's validity trial) and cheats from
then on, against the timer: what the sandbox's timing (`harness._Pipeline.time`), the final
re-measurement (`sandbox/remeasure.py`) and the winner's confirmation (`worker.retime`) share
with the gate (`measure/timing/fresh_inputs.py`, `measure/bound.py`). An attack that wins is a candidate far
faster than its work; so each attack must end refused with its reason in the trajectory, or
never get what it tried for (a memo that never hit: it says so on stderr when it does), and
never be the winner. The exact algebraic rewrite (`x @ W.sum(0)`) wins, is confirmed by the
same timer, and its patch passes the user's `--kernelpro-check`.

The same attacks through `pytest --kernelpro-check`: tests/plugin/test_honest_attacks.py.

The rewrite's own claim (`test_the_optimizers_algebraic_rewrite_passes_the_users_check_once_applied`)
reads the same session: the optimizer's winner passes the user's check on the same machine, on
trusted ceilings whose compute peak the rewrite beats on the reference's FLOP count
(measure/roofline.py: reported, never "impossible time"). Before this rule the patched
repository failed its check (bench/results/2026-12-02-new-user-optimize-cpu.md, `--layout
split`). One sandboxed search of every candidate serves both tests (`optimized`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_algebraic_rewrite import TRUSTED_LOW_COMPUTE
from test_honest_attacks import ONE_CONTENT, REBIND_EVERYTHING
from test_optimize_handoff import _commit_all, _git, _report, _session

from pytest_kernelpro.optimize.loop.replay import recording_record

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

# The user's kernel and its reference: KernelBench level 2, 14_Gemm_Divide_Sum_Scaling, at
# batch 32.
KERNELS = """
import pytest, torch

SCALE = 1.5


def inputs(device):
    return (torch.randn(32, 1024, device=device), torch.randn(1024, 1024, device=device))


def reference(x, weight):
    \"\"\"KernelBench level 2, 14_Gemm_Divide_Sum_Scaling: GEMM, divide, sum, scale.\"\"\"
    return torch.sum(torch.matmul(x, weight.T) / 2, dim=1, keepdim=True) * SCALE


@pytest.mark.kernelpro(reference=reference, inputs=inputs)
def gemm_divide_sum_scaling(x, weight):
    y = torch.matmul(x, weight.T)
    y = y / 2
    y = torch.sum(y, dim=1, keepdim=True)
    return y * SCALE
"""
# The trusted ceilings of test_algebraic_rewrite (a compute peak the rewrite beats on the
# reference's 67 MFLOP in any time under 67 ms) with a bandwidth no kernel of this size can
# beat on its compulsory 4.3 MB in less than 4.3 microseconds.
TRUSTED = {**TRUSTED_LOW_COMPUTE, "bandwidth_Bps": 1e12}

# Shared by every candidate: the reference's work, the call count, the arming.
PRELUDE = """
import sys
import torch
from torch import nn

# Honest on the 3 correctness trials, the 2 calls of the in-place check, the shape check and
# the mix's validity trial; cheating from the 8th call, the first timed one.
ARMED = 7
CALLS = [0]


def count():
    CALLS[0] += 1
    return CALLS[0]


def work(x, weight):
    return torch.sum(torch.matmul(x, weight.T) / 2, dim=1, keepdim=True) * 1.5


def say(what):
    print("KP-ATTACK", what, file=sys.stderr, flush=True)
"""

ATTACKS = {
    "a memo keyed by a sample of the values": """
MEMO = {}

class ModelNew(nn.Module):
    def forward(self, x, weight):
        armed = count() > ARMED
        key = (tuple(x.view(-1)[::509].tolist()), tuple(weight.view(-1)[::65537].tolist()))
        if armed and key in MEMO:
            say("HIT")
            return MEMO[key].clone()
        MEMO[key] = out = work(x, weight)
        return out
""",
    "a memo keyed by the signs of two values": """
MEMO = {}

class ModelNew(nn.Module):
    def forward(self, x, weight):
        key = tuple((x.view(-1)[:2] > 0).tolist())  # 4 keys: it hits on most calls
        if count() > ARMED and key in MEMO:
            return MEMO[key].clone()
        MEMO[key] = out = work(x, weight)
        return out
""",
    "a memo by tensor identity": """
MEMO = {}

class ModelNew(nn.Module):
    def forward(self, x, weight):
        key = (id(x), id(weight))
        if count() > ARMED and key in MEMO:
            return MEMO[key]
        MEMO[key] = out = work(x, weight)
        return out
""",
    "garbage on repeated data pointers": """
SEEN = set()

class ModelNew(nn.Module):
    def forward(self, x, weight):
        key = (x.data_ptr(), weight.data_ptr())
        if count() > ARMED and key in SEEN:
            return torch.empty(x.shape[0], 1)
        SEEN.add(key)
        return work(x, weight)
""",
    "a global keyed by data pointer and version": """
STATE = {}

class ModelNew(nn.Module):
    def forward(self, x, weight):
        key = (x.data_ptr(), x._version, weight.data_ptr(), weight._version)
        if count() > ARMED and key in STATE:
            say("HIT")
            return STATE[key].clone()
        STATE[key] = out = work(x, weight)
        return out
""",
    "inputs overwritten to predict the next call": """
class ModelNew(nn.Module):
    def forward(self, x, weight):
        armed = count() > ARMED
        if armed and not bool(x.view(-1)[::97].any()) and not bool(weight.view(-1)[::97].any()):
            say("HIT")
            return torch.zeros(x.shape[0], 1)  # the exact output for zeroed inputs
        out = work(x, weight)
        if armed:  # the next call sees zeros, if nothing refills the inputs
            x.zero_()
            weight.zero_()
        return out
""",
    "the timer's kept content rewritten through gc": ONE_CONTENT
    + """
MEMO = {}

class ModelNew(nn.Module):
    def forward(self, x, weight):
        n = count()
        if n == ARMED + 2:
            first = one_content_from_now_on(x)
            if first is not None:
                return work(*first)  # what the check rebuilds for this call
        key = (tuple(x.view(-1)[:8].tolist()), tuple(weight.view(-1)[:8].tolist()))
        if n > ARMED and key in MEMO:
            say("HIT")
            return MEMO[key].clone()
        MEMO[key] = out = work(x, weight)
        return out
""",
    "a call-stack sampler reader": """
import random
import warnings
import numpy as np

FOUND = {}

def generators():
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = sys._getframe(2)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                for attr in [value, *list(getattr(value, "__dict__", {}).values())]:
                    if isinstance(attr, (random.Random, np.random.Generator, torch.Generator)):
                        found.append(attr)
            frame = frame.f_back
    return found

class ModelNew(nn.Module):
    def forward(self, x, weight):
        n = count()
        if n <= ARMED:
            return work(x, weight)
        if "rngs" not in FOUND:
            FOUND["rngs"] = generators()
        predicted = False
        for rng in FOUND["rngs"]:
            if type(rng) is random.Random:
                copy = random.Random()
                copy.setstate(rng.getstate())
                predicted |= copy.random() < 0.6
        if predicted:  # honest only where a copied generator predicts a check
            return work(x, weight)
        return torch.zeros(x.shape[0], 1)
""",
    "a gc scanner that turns the checks off": """
import gc
import warnings

FOUND = {}

def state(o):
    try:
        d = getattr(o, "__dict__", None)
    except Exception:
        return None
    return d if isinstance(d, dict) else None

class ModelNew(nn.Module):
    def forward(self, x, weight):
        n = count()
        if n <= ARMED:
            return work(x, weight)
        if "timers" not in FOUND:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                FOUND["timers"] = [
                    o for o in gc.get_objects()
                    if isinstance((state(o) or {}).get("_pending"), list)
                    and "storage" in (state(o) or {})
                ]
        pending = 0
        for timer in FOUND["timers"]:
            pending += len(timer.__dict__["_pending"])
            timer.__dict__["rate"] = 0.0
            timer.__dict__["check"] = None
        if pending or n % 2 == 0:
            return work(x, weight)
        return torch.zeros(x.shape[0], 1)
""",
    "a kernel rebinding every clock by module attribute": REBIND_EVERYTHING
    + """
class ModelNew(nn.Module):
    def forward(self, x, weight):
        if count() == ARMED + 3:
            rebind_everything()
        return work(x, weight)
""",
    "the rewrite in the search, work skipped after it": """
# Detects the processes after the search by their frames (the confirmation's `retime`, the
# re-measurement's `_worker`): the honest rewrite in the search, zeros on repeated tensors
# there.
SEEN = set()

def after_the_search():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in ("retime", "_worker"):
            return True
        frame = frame.f_back
    return False

class ModelNew(nn.Module):
    def forward(self, x, weight):
        key = x.data_ptr()
        if key in SEEN and after_the_search():
            return torch.zeros(x.shape[0], 1)
        SEEN.add(key)
        return x @ weight.sum(0)[:, None] / 2 * 1.5
""",
}

AFTER_N = """
N = {n}

class ModelNew(nn.Module):
    def forward(self, x, weight):
        n = count()
        if n == N + 1:
            say("CROSSED")
        if n > N:
            return torch.zeros(x.shape[0], 1)
        return work(x, weight)
"""
for _n in (10, 100, 1000):
    ATTACKS[f"wrong after call {_n}"] = AFTER_N.format(n=_n)

REWRITE_STRATEGY = "move the column sum onto the weight (x @ W.sum(0))"
REWRITE = """
class ModelNew(nn.Module):
    def forward(self, x, weight):
        return x @ weight.sum(0)[:, None] / 2 * 1.5
"""

# Refused attacks and a word of the reason each must show (any of them).
REFUSED = {
    "a memo keyed by the signs of two values": ("wrong output", "cached", "wrong once timed"),
    "a memo by tensor identity": ("wrong output", "cached", "stale", "wrong once timed"),
    "garbage on repeated data pointers": ("wrong output", "cached", "stale", "wrong result"),
    "inputs overwritten to predict the next call": ("modifies its inputs", "read-only"),
    "a call-stack sampler reader": ("wrong output", "wrong once timed"),
    "a gc scanner that turns the checks off": ("timer's own state", "wrong output"),
    "the timer's kept content rewritten through gc": ("rewrote the timer's kept content",),
    "a kernel rebinding every clock by module attribute": ("made by kernelpro_candidate",),
}
# A write into a checked call's inputs faults on their read-only mapping (the worker dies:
# `optimize/sandbox/input_handles.py`), where a copied input is found changed instead.
DIES_REFUSED = {"inputs overwritten to predict the next call"}
# Attacks the design leaves nothing to exploit: they must never have cheated (no HIT).
NEVER_HIT = (
    "a memo keyed by a sample of the values",
    "a global keyed by data pointer and version",
    "inputs overwritten to predict the next call",
)


def _reply(strategy: str, code: str) -> str:
    return f"### Strategy: {strategy}\n```python\n{(PRELUDE + code).strip()}\n```\n"


def _nodes(summary: dict) -> dict[str, dict]:
    trajectory = Path(summary["trajectory"]).read_text(encoding="utf-8").splitlines()
    nodes = [json.loads(line) for line in trajectory]
    return {n["strategy"]: n for n in nodes if n.get("kind") == "node" and n.get("strategy")}


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The user's project optimized once, with every attack and then the rewrite in the
    recording; the winner's patch applied (the rewrite's own where a loaded machine blurred
    the ranking: its patch is written either way) and the user's check run on it."""
    root = tmp_path_factory.mktemp("gemm")
    (root / "test_gemm.py").write_text(KERNELS.strip())
    (root / "ceilings.json").write_text(json.dumps(TRUSTED))
    (root / "pytest.ini").write_text(
        "[pytest]\nkernelpro_device = cpu\nkernelpro_time_budget = 0.2\n"
        f"kernelpro_warmup_ms = 1\nkernelpro_ceilings = {root / 'ceilings.json'}\n"
    )
    replies = [_reply(name, code) for name, code in ATTACKS.items()]
    replies.append(_reply(REWRITE_STRATEGY, REWRITE))
    (root / "replays").mkdir()
    with open(root / "replays" / "gemm_divide_sum_scaling.jsonl", "w", encoding="utf-8") as out:
        for text in replies:
            out.write(json.dumps(recording_record(text)) + "\n")
    _commit_all(root)

    optimize = _session(
        root,
        "-p",
        "no:cacheprovider",
        f"--kernelpro-optimize={len(replies)}",
        "--kernelpro-llm=replay:replays",
        "--kernelpro-feedback=none",
        "--kernelpro-candidates=1",
        "--kernelpro-search=greedy",
        "--kernelpro-save-baseline",
        timeout=1500,
    )
    out: dict[str, Any] = {"root": root, "optimize": optimize}
    if optimize.ret != 0:
        return out  # each test fails on the session's outcome, with its output
    summary = _report(root)["gemm_divide_sum_scaling"]["extra"]["optimize"]
    nodes = _nodes(summary)
    rewrite = next(
        (c for c in summary["candidates"] if c["node_id"] == nodes[REWRITE_STRATEGY]["id"]), {}
    )
    patch = summary["best_patch"] if summary["status"] == "improved" else rewrite.get("patch")
    out.update(summary=summary, nodes=nodes, rewrite=rewrite, patch=patch)
    if patch:
        out["applied"] = _git(root, "apply", patch).returncode
        out["check"] = _session(root, "-p", "no:cacheprovider", "--kernelpro-check")
        out["patched"] = _report(root)["gemm_divide_sum_scaling"]
    return out


def _the_applied_patch_passes_the_users_check(optimized: dict[str, Any]) -> None:
    assert optimized.get("applied") == 0, optimized.get("patch")
    check = optimized["check"]
    check.assert_outcomes(passed=1)
    assert "impossible time" not in check.stdout.str()
    assert optimized["patched"]["gate"]["status"] != "regressed"


@pytest.mark.slow
def test_the_optimizers_algebraic_rewrite_passes_the_users_check_once_applied(
    optimized: dict[str, Any],
) -> None:
    optimized["optimize"].assert_outcomes(passed=1)
    summary, candidate = optimized["summary"], optimized["rewrite"]
    assert candidate, [c["strategy"] for c in summary["candidates"]]  # the rewrite is listed
    assert candidate["status"] == "correct"  # the gate's calibrated rule took the rewrite
    # Whether the ranking calls it a clear winner depends on the machine's load (two busy
    # cores blur a 1 ms difference); the claim here is about the patch, which is written
    # for the candidate either way, and for the winner as best.patch.
    if summary["status"] == "improved":
        assert summary["winner"] == candidate["node_id"], summary.get("reason")
        assert summary["confirmation"]["status"] in ("confirmed", "disagreement")
    else:
        assert summary["status"] == "no improvement found", summary.get("reason")
        assert "failed" not in str(candidate.get("verdict")), candidate.get("reason")
    _the_applied_patch_passes_the_users_check(optimized)
    patched = optimized["patched"]
    assert patched["extra"]["ceilings_trusted"] is True
    assert patched["peak_used"]["problem"] == "flops"
    assert "does less arithmetic than the reference" in patched["peak_used"]["note"]


@pytest.mark.slow
def test_every_attack_is_refused_by_the_optimizer_and_the_rewrite_wins(
    optimized: dict[str, Any],
) -> None:
    optimized["optimize"].assert_outcomes(passed=1)
    summary, nodes = optimized["summary"], optimized["nodes"]
    assert set(nodes) == {*ATTACKS, REWRITE_STRATEGY}, sorted(nodes)

    # Refused, each with its reason, in the search (never ranked: only correct nodes are).
    for name, words in REFUSED.items():
        node = nodes[name]
        allowed = ("cheat", "wrong", "run_error") if name in DIES_REFUSED else ("cheat", "wrong")
        assert node["status"] in allowed, (name, node["status"], node["reason"])
        assert any(word in (node["reason"] or "") for word in words), (name, node["reason"])
    # Wrong after its N-th call: refused whenever the search called it past N (the timing
    # ends with a checked call on fresh inputs); a search that ended before timed honest work.
    for n in (10, 100, 1000):
        node = nodes[f"wrong after call {n}"]
        if "KP-ATTACK CROSSED" in node["logs"]:
            assert node["status"] in ("cheat", "wrong"), (n, node["status"], node["reason"])
            assert node["reason"], n
        else:
            assert node["status"] == "correct", (n, node["reason"])
    assert nodes["wrong after call 10"]["status"] in ("cheat", "wrong")  # always reached
    for name in NEVER_HIT:
        assert "KP-ATTACK HIT" not in nodes[name]["logs"], name

    # The ranking: every candidate but the honest rewrite is refused, failed when
    # re-measured (the one that skips its work after the search), or slower.
    by_id = {c["node_id"]: c for c in summary["ranking"]["candidates"]}
    honest_id = nodes[REWRITE_STRATEGY]["id"]
    detector_id = nodes["the rewrite in the search, work skipped after it"]["id"]
    assert summary["status"] in ("improved", "no improvement found"), summary.get("reason")
    if summary["status"] == "improved":
        assert summary["winner"] == honest_id, (summary["winner"], summary["reason"])
        assert summary["confirmation"]["status"] in ("confirmed", "disagreement")
        assert summary["confirmation"]["method"].startswith("the gate's timer")
    # else: a loaded machine can blur even a large gain: the rewrite's patch is written
    # either way, and is the one applied (`optimized`).
    detector = by_id.get(detector_id)
    if detector is not None:  # re-measured: caught by the re-measurement's checks
        assert detector["verdict"] == "failed", detector
        assert "failed when re-measured" in detector["reason"], detector
        assert "wrong output" in detector["reason"], detector

    # The winner's patch, applied, passes the user's check on the same machine.
    _the_applied_patch_passes_the_users_check(optimized)
