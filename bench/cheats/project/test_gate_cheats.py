"""Kernels written to cheat the gate's CUDA timing, an honest control and two honest kernels
that use side streams the allowed ways (bench/honest_measurement_h200.py runs them through
`--kernelpro-save-baseline` then `--kernelpro-check`).

Each cheat is correct whenever its output is read after a device-wide synchronize (as the
correctness trials read it), so only the timing can catch it. Expected: every `cheat_*`
refused with its reason; `honest`, `joined_side_stream` and `own_stream_marked_any` pass.
On a CPU-only machine the CUDA ones are skipped (device="cuda").
"""

import time

import torch
from cheat_common import kp


@kp()
def honest(x, y):
    return torch.tanh(x @ y)


_SIDE = {}


def _side():
    if "s" not in _SIDE:
        _SIDE["s"] = torch.cuda.Stream()
    return _SIDE["s"]


@kp()
def joined_side_stream(x, y):
    """Honest: forks to a side stream and joins back before returning."""
    side, cur = _side(), torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        out = torch.tanh(x @ y)
    cur.wait_stream(side)
    out.record_stream(cur)
    return out


@kp(streams="any")
def own_stream_marked_any(x, y):
    """A library-like kernel on a stream of its own, never joined, marked streams='any':
    timed at its real cost."""
    side = _side()
    with torch.cuda.stream(side):
        out = torch.tanh(x @ y)
    return out


@kp()
def cheat_side_stream(x, y):
    """The work on a side stream that waits for the inputs but is never joined back."""
    side, cur = _side(), torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        out = torch.tanh(x @ y)
    return out


@kp()
def cheat_side_stream_nowait(x, y):
    """The work on a side stream that waits for nothing (it runs during the timer's GPU sleep)."""
    with torch.cuda.stream(_side()):
        out = torch.tanh(x @ y)
    return out


_GRAPH = {}


@kp()
def cheat_graph_on_side_stream(x, y):
    """A CUDA graph captured once, replayed on a side stream after copying the inputs in."""
    if "g" not in _GRAPH:
        sx, sy = x.clone(), y.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.tanh(sx @ sy)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            so = torch.tanh(sx @ sy)
        _GRAPH.update(g=g, sx=sx, sy=sy, so=so)
    with torch.cuda.stream(_side()):
        _GRAPH["sx"].copy_(x)
        _GRAPH["sy"].copy_(y)
        _GRAPH["g"].replay()
    return _GRAPH["so"]


@kp()
def cheat_c_set_stream(x, y):
    """Switches streams through torch._C._cuda_setStream, past torch.cuda.set_stream."""
    side, cur = _side(), torch.cuda.current_stream()
    set_stream = torch._C._cuda_setStream
    set_stream(
        stream_id=side.stream_id, device_index=side.device_index, device_type=side.device_type
    )
    try:
        out = torch.tanh(x @ y)
    finally:
        set_stream(
            stream_id=cur.stream_id, device_index=cur.device_index, device_type=cur.device_type
        )
    return out


_ORIGINAL_ELAPSED = torch.cuda.Event.elapsed_time


def _faster(self, end):
    return _ORIGINAL_ELAPSED(self, end) / 100.0


@kp()
def cheat_elapsed_time_patched(x, y):
    """Patches torch.cuda.Event.elapsed_time (at its first call) to read 100x less."""
    torch.cuda.Event.elapsed_time = _faster
    return torch.tanh(x @ y)


_MEMO = {}


@kp()
def cheat_memo_by_identity(x, y):
    key = (id(x), id(y))
    if key not in _MEMO:
        _MEMO[key] = torch.tanh(x @ y)
    return _MEMO[key]


_LAST = {}


@kp()
def cheat_garbage_on_repeat(x, y):
    if _LAST.get("x") is x:
        return torch.empty_like(x)
    _LAST["x"] = x
    return torch.tanh(x @ y)


class Lazy(torch.Tensor):
    pass


@kp()
def cheat_lazy_subclass(x, y):
    return torch.tanh(x @ y).as_subclass(Lazy)


_REAL_COUNTER = time.perf_counter


@kp()
def cheat_rebound_clock(x, y):
    """Rebinds time.perf_counter (at its first call) to run 10x slow."""
    time.perf_counter = lambda: _REAL_COUNTER() / 10.0
    return torch.tanh(x @ y)
