"""The attacks on fresh content and unpredictable checks, on CUDA (the CPU versions are in
tests/plugin/test_honest_attacks.py): a memo keyed by a sample of the values, a reader of
the timer's generators on the call stack, a gc scanner turning the checks off, a kernel
that stops working after its N-th call, a kernel rebinding every clock it can find inside
a timed sample. Expected: every `cheat_*` refused, or (the memo) never faster than the
honest kernel. The honest rewrite is in test_gate_honest_rewrite.py: a module that rebinds a
clock has none of its kernels timed, so an honest kernel beside these cheats is refused too.
"""

import gc
import random
import sys
import warnings

import numpy as np
import torch
from cheat_common import N, kp

CALLS: dict[str, int] = {}


def count(name: str) -> int:
    CALLS[name] = CALLS.get(name, 0) + 1
    return CALLS[name]


def _work(x, y):
    return torch.tanh(x @ y)


_MEMO: dict = {}


@kp()
def cheat_memo_by_content_sample(x, y):
    """Keyed by 8 sampled values of each input (one small device-to-host copy)."""
    key = (tuple(x.view(-1)[::2_097_152].tolist()), tuple(y.view(-1)[::2_097_152].tolist()))
    if key not in _MEMO:
        _MEMO[key] = _work(x, y)
    return _MEMO[key]


def _scan_frames_for_generators():
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = sys._getframe(2)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                for attr in list(getattr(value, "__dict__", {}).values()):
                    if isinstance(attr, (random.Random, np.random.Generator, torch.Generator)):
                        found.append(attr)
            frame = frame.f_back
    return found


@kp()
def cheat_call_stack_sampler_reader(x, y):
    """Copies any generator of the timer found on the call stack to predict the checked
    calls; skips its work on every other unpredicted call (a 2x gain)."""
    n = count("reader")
    if n <= 6:
        return _work(x, y)
    if "rngs" not in _MEMO:
        _MEMO["rngs"] = _scan_frames_for_generators()
    predicted = False
    for rng in _MEMO["rngs"]:
        if type(rng) is random.Random:
            copy = random.Random()
            copy.setstate(rng.getstate())
            predicted |= copy.randrange(8) == 0
    if predicted or n % 2 == 0:
        return _work(x, y)
    return torch.zeros(N, N, device=x.device)


@kp()
def cheat_gc_scanner(x, y):
    """Finds the timer's pending-check state through the garbage collector, sets its rate to
    0 and skips its work when nothing is pending."""
    n = count("gc")
    if n <= 6:
        return _work(x, y)
    if "timers" not in _MEMO:

        def state(o):
            try:
                d = getattr(o, "__dict__", None)
            except Exception:
                return None
            return d if isinstance(d, dict) else None

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _MEMO["timers"] = [
                o
                for o in gc.get_objects()
                if isinstance((state(o) or {}).get("_pending"), list) and "storage" in state(o)
            ]
    pending = 0
    for timer in _MEMO["timers"]:
        pending += len(timer.__dict__["_pending"])
        timer.__dict__["rate"] = 0.0
    if pending or n % 2 == 0:
        return _work(x, y)
    return torch.zeros(N, N, device=x.device)


@kp()
def cheat_after_nth_call(x, y):
    """Honest for its first 40 calls (past the correctness trials), then does nothing."""
    if count("after_n") > 40:
        return torch.zeros(N, N, device=x.device)
    return _work(x, y)


_NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "process_time", "thread_time",
          "dumps", "json_dumps", "os_pread", "pread", "urandom", "os_urandom", "elapsed_time")  # fmt: skip


def _fake(*args, **kwargs):
    return 0.0


@kp()
def cheat_rebinds_every_clock(x, y):
    """At its 5th call (inside a timed sample) rebinds every clock-like name of time, json,
    os and the plugin's own modules."""
    if count("rebind") == 5:
        for name, module in list(sys.modules.items()):
            if not (name in ("time", "json", "os") or name.startswith("pytest_kernelpro")):
                continue
            for attr in _NAMES:
                if hasattr(module, attr):
                    try:
                        setattr(module, attr, _fake)
                    except (AttributeError, TypeError):
                        pass
    return _work(x, y)
