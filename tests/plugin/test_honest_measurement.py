"""Cheating kernels against the gate's timing: each is refused with its reason, and an honest
kernel beside them passes (measure/timing/fresh_inputs.py, bound.py).

Each cheat is correct in the correctness trials and cheats only once it is timed, as a
kernel written to game the timer would. The CUDA-only tricks (side streams, graphs on a side
stream, a patched Event.elapsed_time) are in bench/cheats/ for the GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kernelpro.measure import bound
from tests.plugin.conftest import records_by_name

HEADER = """
import threading
import time
import pytest
import torch

def pair(device):
    return (torch.randn(64, 64, device=device), torch.randn(64, 64, device=device))

def ref(x, y):
    return torch.tanh(x @ y)

CALLS = {}

def count(name):
    CALLS[name] = CALLS.get(name, 0) + 1
    return CALLS[name]
"""

# Correctness makes 3 trials; these cheat from their 4th call on (the first timed one) or
# whenever they see the same tensors again, which only the timer does.
CHEATS = """
@pytest.mark.kernelpro(reference=ref, inputs=pair)
def honest(x, y):
    return torch.tanh(x @ y)

_MEMO = {}

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def memo_by_identity(x, y):
    # Only once timed: CPython reuses a freed tensor's id, so a memo already live in the
    # trials may hit there and fail as plain wrong, before the timer could refuse it.
    key = (id(x), id(y))
    if count("identity") > 3 and key in _MEMO:
        return _MEMO[key]
    _MEMO[key] = out = torch.tanh(x @ y)
    return out

_LAST = {}

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def garbage_on_repeat(x, y):
    if _LAST.get("x") is x:
        return torch.empty_like(x)
    _LAST["x"] = x
    return torch.tanh(x @ y)

class Lazy(torch.Tensor):
    pass

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def lazy_subclass(x, y):
    return torch.tanh(x @ y).as_subclass(Lazy)

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def work_after_return(x, y):
    if count("after") <= 3:
        return torch.tanh(x @ y)
    out = torch.zeros(x.shape[0], y.shape[1])

    def finish():
        time.sleep(0.002)
        out.copy_(torch.tanh(x @ y))

    threading.Thread(target=finish, daemon=True).start()
    return out

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def detects_the_timer(x, y):
    import inspect
    if any(f.function in ("time_cpu", "time_cuda") for f in inspect.stack()[1:8]):
        return torch.zeros(x.shape[0], y.shape[1])
    return torch.tanh(x @ y)
"""

MEMO_BY_VERSION = """
_MEMO = {}
HITS = []

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def memo_by_version(x, y):
    # Only the timer's calls are memoised (the correctness trials make 3): a trial's entry
    # could be hit by a timed tensor that reuses a freed one's id, which is no memo of timing.
    if count("memo") <= 3:
        return torch.tanh(x @ y)
    key = (id(x), x._version, id(y), y._version)
    if key in _MEMO:
        HITS.append(1)
        return _MEMO[key]
    _MEMO[key] = out = torch.tanh(x @ y)
    return out

def test_zz_the_memo_never_hit_while_timed():
    # The timer bumps the version every call.
    assert HITS == []
"""


def _check(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A session that times every kernel, as the gate does (the timing is the same with and
    without `--kernelpro-check`). Without a baseline, so that the honest control's verdict is
    its honesty alone: gating two CPU sessions of a cold-cache 64x64 kernel against each other
    can read a real between-process difference, which is not what these tests are about."""
    return project.runpytest(*args)


def test_cheating_kernels_are_refused_with_their_reason(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(test_cheats=HEADER + CHEATS)
    result = _check(kp_project)
    result.assert_outcomes(passed=1, failed=5)
    out = result.stdout.str()
    assert "honest PASSED" in out or "1 passed" in out
    expected = {
        "memo_by_identity": "returned a wrong output",
        "garbage_on_repeat": "returned a wrong output",
        "lazy_subclass": "Lazy, not a plain torch.Tensor",
        "work_after_return": "returned a wrong output",
        "detects_the_timer": "returned a wrong output",
    }
    for name, reason in expected.items():
        lines = [line for line in out.splitlines() if name in line and "refused" in line]
        assert lines, f"{name} was not refused:\n{out[-3000:]}"
        assert reason in " ".join(lines), (name, lines)
    timing = records_by_name(kp_project)["honest"]["timing"]
    assert timing["honesty"]["mode"] == "mix"
    assert timing["honesty"]["outputs_checked"] is True
    assert timing["honesty"]["checked_calls"] >= 1


# Both timers: the CUDA timer's warm-up once called the kernel on unchanged inputs, the one
# loop of its calls without fresh inputs (the CPU timer's had them); on the H200 this memo hit
# 26 times there.
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_memo_by_identity_and_version_never_hits_while_timed(
    kp_project: pytest.Pytester, device: str
) -> None:
    kp_project.makepyfile(test_memo=HEADER + MEMO_BY_VERSION)
    _check(kp_project, f"--kernelpro-device={device}").assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("patch", "named"),
    [
        ("time.perf_counter = lambda: _real() / 10.0", "time.perf_counter (to"),
        ("time.perf_counter_ns = lambda: _real_ns() // 10", "time.perf_counter_ns (to"),
        (
            "json.dumps = lambda value, *a, **k: _dumps(_shrink(value), *a, **k)",
            "json.dumps (to",
        ),
    ],
    ids=["perf_counter", "perf_counter_ns", "json_dumps"],
)
def test_a_kernel_that_rebinds_a_clock_or_the_serializer_is_refused(
    kp_project: pytest.Pytester, patch: str, named: str
) -> None:
    source = (
        HEADER
        + """
import json
_real, _real_ns, _dumps = time.perf_counter, time.perf_counter_ns, json.dumps

def _shrink(value):
    if isinstance(value, float):
        return value / 5
    if isinstance(value, dict):
        return {k: _shrink(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shrink(v) for v in value]
    return value

"""
        + patch
        + """

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def rebinds(x, y):
    return torch.tanh(x @ y)
"""
    )
    kp_project.makepyfile(test_clock=source)
    try:
        result = kp_project.runpytest()
    finally:  # the patch must not outlive this run, refused or not
        bound.restore()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*rebinds is refused*{named}*test_clock*"])


def test_an_honest_kernels_report_says_how_it_was_kept_honest(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_ok=HEADER
        + """
@pytest.mark.kernelpro(reference=ref, inputs=pair)
def honest(x, y):
    return torch.tanh(x @ y)
"""
    )
    _check(kp_project).assert_outcomes(passed=1)
    honesty = records_by_name(kp_project)["honest"]["timing"]["honesty"]
    assert honesty["note"].startswith("fresh inputs: new content every call")
    assert honesty["refill_per_call_s"] > 0  # the per-call cost of the new content
    assert json.loads(json.dumps(honesty)) == honesty
    assert Path(kp_project.path / ".kernelpro").is_dir()


def test_a_time_beyond_every_trusted_ceiling_fails_and_says_why(
    kp_project: pytest.Pytester,
) -> None:
    """Only physics makes a time impossible (measure/roofline.py): a byte count a million
    times too large makes an honest 64x64 matmul move its compulsory bytes faster than the
    trusted bandwidth ceiling, which fails the item with the likely causes; a FLOP count a
    million times too large is only reported (fewer FLOPs than the "reference"), and the
    kernel with true counts passes."""
    kp_project.makepyfile(
        test_impossible=HEADER
        + """
@pytest.mark.kernelpro(reference=ref, inputs=pair, bytes=3 * 64 * 64 * 4 * 1e6)
def wrong_byte_count(x, y):
    return torch.tanh(x @ y)

@pytest.mark.kernelpro(reference=ref, inputs=pair, flops=2 * 64**3 * 1e6)
def wrong_flop_count(x, y):
    return torch.tanh(x @ y)

@pytest.mark.kernelpro(reference=ref, inputs=pair, flops=2 * 64**3)
def right_flop_count(x, y):
    return torch.tanh(x @ y)
"""
    )
    result = kp_project.runpytest("--kernelpro-save-baseline")
    result.assert_outcomes(passed=2, failed=1)
    saved = (kp_project.path / "kernelpro-baseline.yaml").read_text()
    assert "right_flop_count" in saved
    assert "wrong_flop_count" in saved  # fewer FLOPs than the count: a result, reported
    assert "wrong_byte_count" not in saved  # an impossible time never enters a baseline
    records = records_by_name(kp_project)
    assert records["wrong_flop_count"]["peak_used"]["problem"] == "flops"
    assert (
        "does less arithmetic than the reference"
        in records["wrong_flop_count"]["peak_used"]["note"]
    )
    result.stdout.fnmatch_lines(
        [
            "*wrong_byte_count: impossible time: its median * is faster than physics allows "
            "(its compulsory bytes beyond the bandwidth ceiling*ceilings trusted*inputs read "
            "from memory*Likely causes: device work outside the timed stream, a result cached "
            "between calls, or a wrong byte count (pass bytes=*"
        ]
    )


def test_a_bad_streams_keyword_fails_its_item_with_the_choices(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_streams=HEADER
        + """
@pytest.mark.kernelpro(reference=ref, inputs=pair, streams="sideways")
def k(x, y):
    return torch.tanh(x @ y)
"""
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*streams*'any' for a kernel that really launches work on*"])
