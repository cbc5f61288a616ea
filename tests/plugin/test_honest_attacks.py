"""Attacks on the timer from inside the kernel's process, through `pytest` as a user runs it
(measure/timing/fresh_inputs.py, measure/bound.py). The timing is the same with and without
`--kernelpro-check` (which needs a baseline); the sample memo also goes through the check.

Each attack knows how the timer works: new content per call (mixed between two draws of the
input maker), which calls are checked decided from os.urandom after each call returned, the
clocks and the plugin's timing modules verified by identity before and after every sample.
Each one is refused, or (where the design leaves it nothing to exploit) never gets the
advantage it tries for; an honest kernel beside them passes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pytest_kernelpro.measure import bound
from tests.plugin.conftest import records_by_name
from tests.plugin.test_honest_measurement import HEADER

SAMPLE_MEMO = """
import json, os
_MEMO = {}
_HITS = []

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def sample_memo(x, y):
    # The memo of the last wave: keyed by a cheap sample of the values (8 of 4096), which
    # passed every check while the timer alternated two content sets.
    key = (tuple(x.view(-1)[::512].tolist()), tuple(y.view(-1)[::512].tolist()))
    if key in _MEMO:
        _HITS.append(count("hit"))
        with open(os.environ["KP_HITS"], "w") as handle:
            json.dump(len(_HITS), handle)
        return _MEMO[key]
    _MEMO[key] = out = torch.tanh(x @ y)
    return out
"""

STACK_READER = """
import random, sys, warnings
import numpy as np

def _find_rngs():
    with warnings.catch_warnings():  # touching every object wakes deprecation warnings
        warnings.simplefilter("ignore")
        return _scan()

def _scan():
    # Every RNG held by an object of the timer on the call stack: what the last wave's
    # sampler reader copied to predict the checked calls (the timer kept one then).
    found = []
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            for attr in list(getattr(value, "__dict__", {}).values()):
                if isinstance(attr, (random.Random, np.random.Generator, torch.Generator)):
                    found.append(attr)
        frame = frame.f_back
    return found

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def stack_reader(x, y):
    n = count("reader")
    if n <= 6:  # the trials, the mix's validity trial and the first timed calls (always checked)
        return torch.tanh(x @ y)
    if "rngs" not in CALLS:  # one scan (it takes a while), kept
        CALLS["rngs"] = _find_rngs()
    rngs = CALLS["rngs"]
    predicted_checked = False
    for rng in rngs:
        copy = random.Random()
        if type(rng) is random.Random:  # os.urandom's SystemRandom has no state to copy
            copy.setstate(rng.getstate())
            predicted_checked |= copy.randrange(8) == 0
    # Honest only when a copied generator predicts a check, else on every other call: a kernel
    # skipping half of its work (a 2x gain).
    if predicted_checked or n % 2 == 0:
        return torch.tanh(x @ y)
    return torch.zeros(x.shape[0], y.shape[1])
"""

GC_READER = """
import gc, warnings

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def gc_scanner(x, y):
    # Finds the timer's own state through the garbage collector (the object holding the
    # pending checks), sets its check rate to 0 and skips its work when nothing is pending.
    n = count("gc")
    if n <= 6:
        return torch.tanh(x @ y)
    if "timers" not in CALLS:  # one scan (it takes a while), kept
        def state(o):  # an object's namespace; some objects raise when asked (pydantic's)
            try:
                d = getattr(o, "__dict__", None)
            except Exception:
                return None
            return d if isinstance(d, dict) else None

        with warnings.catch_warnings():  # touching every object wakes deprecation warnings
            warnings.simplefilter("ignore")
            CALLS["timers"] = [
                o for o in gc.get_objects()
                if isinstance((state(o) or {}).get("_pending"), list) and "storage" in state(o)
            ]
    pending = 0
    for timer in CALLS["timers"]:
        pending += len(timer.__dict__["_pending"])
        timer.__dict__["rate"] = 0.0  # and turns the checks off, if it can
    if pending or n % 2 == 0:
        return torch.tanh(x @ y)
    return torch.zeros(x.shape[0], y.shape[1])
"""

AFTER_N = """
import os

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def after_n(x, y):
    n = count("after_n")
    with open(os.environ["KP_CALLS"], "w") as handle:
        handle.write(str(n))
    if n > N:
        return torch.zeros(x.shape[0], y.shape[1])
    return torch.tanh(x @ y)
"""

HONEST = """
@pytest.mark.kernelpro(reference=ref, inputs=pair)
def honest(x, y):
    return torch.tanh(x @ y)
"""


# Hostile code shared with the optimizer's attacks (test_optimize_honest_attacks.py).
# Rebinds every clock-like name of time, json, os and the plugin's modules by attribute.
REBIND_EVERYTHING = """
import sys

NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "process_time", "thread_time",
         "dumps", "json_dumps", "os_pread", "pread", "urandom", "os_urandom")

def fake(*args, **kwargs):
    return 0.0

def rebind_everything():
    for name, module in list(sys.modules.items()):
        if not (name in ("time", "json", "os") or name.startswith("pytest_kernelpro")):
            continue
        for attr in NAMES:
            if hasattr(module, attr):
                try:
                    setattr(module, attr, fake)
                except (AttributeError, TypeError):
                    pass
"""
# Finds the fresh inputs of the timer that refills `x` through gc and makes the mix's second
# end its first, in place: a kept second end copied from the first; a first end that is its
# own second end (rolled by half its rows) given its first row everywhere, so its roll is
# itself. Every later call's content, and every check's rebuilt content, is the first end
# (returned, or None when no such timer was found).
ONE_CONTENT = """
import gc

def one_content_from_now_on(x):
    timers = [o for o in gc.get_objects()
              if type(o).__name__ == "FreshInputs" and getattr(o, "ends", None)
              and o.storage[0].data_ptr() == x.data_ptr()]
    for timer in timers:
        for a, b in zip(*timer.ends):
            if b is a:
                a[1:] = a[0]
            else:
                b.copy_(a)
    return timers[0].ends[0] if timers else None
"""


def _refused(out: str, name: str, reason: str) -> None:
    lines = [line for line in out.splitlines() if name in line and "refused" in line]
    assert lines, f"{name} was not refused:\n{out[-3000:]}"
    assert reason in " ".join(lines), (name, lines)


def test_a_memo_keyed_by_a_sample_of_the_values_never_hits(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    hits = kp_project.path / "hits.json"
    monkeypatch.setenv("KP_HITS", str(hits))
    kp_project.makepyfile(test_memo=HEADER + SAMPLE_MEMO)
    # A budget of 1 s: the memo must get many timed calls in which to hit. At the project's
    # 0.2 s a loaded machine may stop at the timer's floor of samples, fewer than 10 calls.
    budget = "--kernelpro-time-budget=1"
    kp_project.runpytest("--kernelpro-save-baseline", budget).assert_outcomes(passed=1)
    # The gate's check against that baseline: the memo still never hits, so nothing to gain.
    kp_project.runpytest(budget).assert_outcomes(passed=1)
    assert not hits.exists(), f"the memo hit {hits.read_text()} time(s)"
    honesty = records_by_name(kp_project)["sample_memo"]["timing"]["honesty"]
    assert honesty["mode"] == "mix"
    assert honesty["calls"] > 10


def test_a_kernel_reading_the_timer_from_its_call_stack_and_gc_is_refused(
    kp_project: pytest.Pytester,
) -> None:
    """It skips half of its calls, honest where a copied generator predicts a check: there is
    no generator to copy, and with a check rate of 0.6 it survives n calls with p = 0.7^n."""
    kp_project.makepyfile(test_reader=HEADER + STACK_READER + GC_READER + HONEST)
    # A budget of 1 s: a few hundred calls, so a kernel skipping half of them survives with
    # p = 0.7^n, far below 1e-6 (at the project's 0.2 s a slow machine may make 10 calls).
    result = kp_project.runpytest("--kernelpro-time-budget=1")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    _refused(out, "stack_reader", "returned a wrong output")
    _refused(out, "gc_scanner", "is refused: ")  # by a check, or by the seal on its rate
    honesty = records_by_name(kp_project)["honest"]["timing"]["honesty"]
    assert honesty["checked_calls"] >= 1
    assert honesty["survival_half_skipped"] == pytest.approx(0.7 ** honesty["calls"])


@pytest.mark.parametrize("n", [1, 3, 10, 100, 1000])
def test_a_kernel_that_changes_after_its_nth_call_is_refused_once_timed_past_it(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """Wrong on every call after the N-th (the correctness trials and the mix's validity trial
    included). Refused whenever the timer called it more than N times; a timing that ends
    before call N timed honest work (then the kernel must pass)."""
    calls = kp_project.path / "calls.txt"
    monkeypatch.setenv("KP_CALLS", str(calls))
    kp_project.makepyfile(test_after=HEADER + f"N = {n}\n" + AFTER_N)
    result = kp_project.runpytest("--kernelpro-cpu-flush=off")
    made = int(calls.read_text())
    if made > n:
        result.assert_outcomes(failed=1)
        out = result.stdout.str()
        assert "after_n is refused" in out or "after_n is wrong" in out, out[-2000:]
    else:
        result.assert_outcomes(passed=1)
    if n <= 10:
        assert made > n  # the short timing reaches these: each case is a real test
    # N = 100 and 1000 are reached or not depending on the machine's speed and load; the
    # per-call protocol is driven past both in tests/measure/test_fresh_inputs.py.


def test_a_kernel_that_rebinds_every_clock_it_can_find_is_refused_naming_its_module(
    kp_project: pytest.Pytester,
) -> None:
    """At its 5th call (inside a timed sample) it rebinds every clock-like name of every
    module it can reach: time, json, os and the plugin's own modules by attribute."""
    kp_project.makepyfile(
        test_rebind=HEADER
        + REBIND_EVERYTHING
        + """
@pytest.mark.kernelpro(reference=ref, inputs=pair)
def rebinds_in_a_sample(x, y):
    if count("rebind") == 5:
        rebind_everything()
    return torch.tanh(x @ y)
"""
    )
    kp_project.makepyfile(test_z_after=HEADER + HONEST)  # timed after it, not blamed
    try:
        result = kp_project.runpytest()
    finally:
        bound.restore()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*rebinds_in_a_sample is refused*(now test_rebind.fake, made by test_rebind*"]
    )
    records = records_by_name(kp_project)
    assert records["rebinds_in_a_sample"].get("timing") is None  # no number published
    assert bound.binding_failure("after the test") is None


def test_an_honest_kernel_beside_a_clock_rebinding_cheat_is_refused_for_its_module(
    kp_project: pytest.Pytester,
) -> None:
    """Found on the H200: an honest kernel defined in the module of a kernel that rebound
    every clock inside a timed sample is refused too (any code of a patching module can
    profit from its patch), and the message says it is the module, put back since, and how
    to keep the kernel timed; the same honest kernel in a module of its own passes."""
    kp_project.makepyfile(
        test_rebind=HEADER
        + REBIND_EVERYTHING
        + """
@pytest.mark.kernelpro(reference=ref, inputs=pair)
def a_rebinds_in_a_sample(x, y):
    if count("rebind") == 5:
        rebind_everything()
    return torch.tanh(x @ y)
"""
        + HONEST.replace("def honest(", "def b_honest_beside_it(")
    )
    kp_project.makepyfile(test_z_own_module=HEADER + HONEST)
    try:
        result = kp_project.runpytest()
    finally:
        bound.restore()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*b_honest_beside_it is refused: its module (*test_rebind.py) rebound *(to "
            "test_rebind.fake), found and put back before this timing*keep this kernel in "
            "a module that patches nothing*"
        ]
    )
    assert records_by_name(kp_project)["honest"]["outcome"] in ("passed", "ok")


def test_a_module_patching_the_plugins_clock_at_import_is_refused_not_the_kernel_before_it(
    kp_project: pytest.Pytester,
) -> None:
    """`import pytest_kernelpro.measure.bound as b; b.perf_counter = fake` at import: the
    kernel of another module timed first is timed on the originals (put back) and passes;
    the patching module's own kernel is refused, named."""
    kp_project.makepyfile(test_a_first=HEADER + HONEST)
    kp_project.makepyfile(
        test_b_patcher=HEADER
        + """
import time
import pytest_kernelpro.measure.bound as b

_real = time.perf_counter

def slow_clock():
    return _real() / 5.0

b.perf_counter = slow_clock

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def patcher(x, y):
    return torch.tanh(x @ y)
"""
    )
    try:
        result = kp_project.runpytest()
    finally:
        bound.restore()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*patcher is refused*pytest_kernelpro.measure.bound.perf_counter "
            "(to test_b_patcher.slow_clock), found and put back before this timing*"
        ]
    )
    records = records_by_name(kp_project)
    assert records["honest"]["outcome"] in ("passed", "ok") or records["honest"].get("timing")
    assert records["patcher"].get("timing") is None


def test_a_thread_left_running_by_the_kernel_cannot_finish_its_work_in_time(
    kp_project: pytest.Pytester,
) -> None:
    """Returns at once and fills its output from a thread: the checked copy is taken as the
    call returns, before the reference runs."""
    kp_project.makepyfile(
        test_thread=HEADER
        + """
import threading, time

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def finishes_on_a_thread(x, y):
    if count("thread") <= 4:
        return torch.tanh(x @ y)
    out = torch.zeros(x.shape[0], y.shape[1])
    x, y = x.clone(), y.clone()

    def finish():
        time.sleep(0.0005)
        out.copy_(torch.tanh(x @ y))

    threading.Thread(target=finish, daemon=True).start()
    return out
"""
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1)
    _refused(result.stdout.str(), "finishes_on_a_thread", "returned a wrong output")


def test_fixed_input_tensors_get_a_note_naming_the_kernel_and_what_to_change(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(
        test_fixed=HEADER
        + """
FIXED = pair("cpu")

@pytest.mark.kernelpro(reference=ref, inputs=lambda device: FIXED)
def fixed_inputs(x, y):
    return torch.tanh(x @ y)
"""
    )
    result = kp_project.runpytest()
    result.assert_outcomes(passed=1)
    # One short line by default, naming the kernel; the full text (what to change) under -v.
    result.stdout.fnmatch_lines(
        ["kernelpro: 1 kernel(s) timed on inputs that stay the same (fixed_inputs); -v says*"]
    )
    result = kp_project.runpytest("-v")
    result.stdout.fnmatch_lines(
        [
            "*1 kernel(s) timed on inputs that stay the same: fixed_inputs: its inputs cannot be "
            "regenerated per timed call*`inputs=` a factory*"
        ]
    )
    honesty = records_by_name(kp_project)["fixed_inputs"]["timing"]["honesty"]
    assert honesty["mode"] == "mix"
    assert "a jitter of them" in honesty["note"]
    assert json.loads(json.dumps(honesty)) == honesty
    assert Path(kp_project.path / ".kernelpro").is_dir()


def test_a_thread_that_computes_the_next_output_between_the_timed_calls_is_refused(
    kp_project: pytest.Pytester,
) -> None:
    """Its thread watches the input's `_version`: once the timer refilled it, it computes the
    output while the cache is flushed, and the timed call returns it at once (right on every
    checked call). The other threads' CPU time between the calls refuses it; where its thread
    found no time there, it is timed at the cost of its work."""
    kp_project.makepyfile(
        test_prefetch=HEADER
        + """
import threading, time

def big(device):
    return (torch.randn(384, 384, device=device), torch.randn(384, 384, device=device))

# Timed first (file order): the attack's thread does not exist yet.
@pytest.mark.kernelpro(reference=ref, inputs=big)
def honest_twin(x, y):
    return torch.tanh(x @ y)

READY = {}

def _ahead(x, y):
    seen = None
    end = time.monotonic() + 3.0  # gone before the next test of this process times anything
    while time.monotonic() < end:
        version = x._version
        if version != seen:
            seen = version
            READY[version] = torch.tanh(x @ y)
        time.sleep(0)

@pytest.mark.kernelpro(reference=ref, inputs=big)
def computes_ahead(x, y):
    if count("ahead") <= 4:
        return torch.tanh(x @ y)
    if "thread" not in READY:
        READY["thread"] = threading.Thread(
            target=_ahead, args=(x, y), daemon=True, name="kernelpro-test-ahead"
        )
        READY["thread"].start()
    ready = READY.pop(x._version, None)
    return ready if ready is not None else torch.tanh(x @ y)
"""
    )
    try:
        result = kp_project.runpytest("--kernelpro-cpu-flush=on")
    finally:
        for thread in threading.enumerate():
            if thread.name == "kernelpro-test-ahead":
                thread.join()
    if result.parseoutcomes().get("failed"):
        result.assert_outcomes(failed=1, passed=1)
        # Refused by the other threads' CPU time between the calls, or, when its thread raced
        # the refill and computed on half-new inputs, by a checked call or the re-check after
        # the timing ("wrong once timed"); the rule alone is tested in
        # tests/measure/test_fresh_inputs.py.
        out = result.stdout.str()
        if "computes_ahead is wrong: correct in the trials, but wrong once timed" not in out:
            _refused(out, "computes_ahead", "is refused: ")
        return
    # Not refused: its thread found no time between the calls (the timer holds the
    # interpreter there, the flush included), so the work ran inside the timed calls and the
    # trick gained nothing: timed at no less than half the same work done honestly beside it
    # (a trick that worked returns a ready output: a small fraction of it).
    result.assert_outcomes(passed=2)
    records = records_by_name(kp_project)
    ahead = records["computes_ahead"]["timing"]["stats"]["median_s"]
    honest = records["honest_twin"]["timing"]["stats"]["median_s"]
    assert ahead >= 0.5 * honest, (ahead, honest)


def test_a_kernel_that_makes_torch_equal_pass_everything_is_refused(
    kp_project: pytest.Pytester,
) -> None:
    """`torch.equal = lambda a, b: True` in its 6th call, then zeros: the checks' own torch
    functions are verified every sample like the clocks."""
    kp_project.makepyfile(
        test_equal=HEADER
        + """
@pytest.mark.kernelpro(reference=ref, inputs=pair)
def fools_the_check(x, y):
    n = count("equal")
    if n == 6:
        torch.equal = lambda a, b: True
    if n >= 6:
        return torch.zeros(x.shape[0], y.shape[1])
    return torch.tanh(x @ y)
"""
    )
    try:
        result = kp_project.runpytest()
    finally:
        bound.restore()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*fools_the_check is refused*torch.equal (now test_equal.*<lambda>, made by test_equal*"]
    )
    assert bound.binding_failure("after the test") is None


def test_a_kernel_rewriting_the_timers_kept_content_through_gc_is_refused(
    kp_project: pytest.Pytester,
) -> None:
    """At its 6th call it finds the timer's fresh inputs through gc and makes the mix's second
    end equal to the first in place (the same objects: the seal holds), returning what the
    check will rebuild; from then on every call's content is the first end and a memo keyed by
    a sample of the values hits, right on every check. The kept content's fingerprint refuses
    it (measure/timing/fresh_inputs.kept_content)."""
    kp_project.makepyfile(
        test_kept=HEADER
        + ONE_CONTENT
        + """
MEMO = {}

@pytest.mark.kernelpro(reference=ref, inputs=pair)
def rewrites_the_kept_content(x, y):
    n = count("kept")
    if n == 6:
        first = one_content_from_now_on(x)
        if first is not None:
            return ref(*first)
    key = (repr(x[0, :8].tolist()), repr(y[0, :8].tolist()))
    if n > 6 and key in MEMO:
        return MEMO[key].clone()
    MEMO[key] = out = torch.tanh(x @ y)
    return out
"""
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1)
    _refused(result.stdout.str(), "rewrites_the_kept_content", "rewrote the timer's kept content")
