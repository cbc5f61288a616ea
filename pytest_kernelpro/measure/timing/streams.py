"""Device work outside the timed stream: seen, then timed at its real cost or refused.

The CUDA timer brackets each call with events on the current stream. Work the kernel puts on
another stream (a side stream it switched to, a CUDA graph replayed there, a library stream
that is never joined back) runs beside those events, and the call would look as fast as the
work left on the timed stream. Two things see it:

- `StreamWatch`: while timing runs, every stream switch (`torch.cuda.set_stream`, the
  `torch.cuda.stream(...)` context, `torch._C._cuda_setStream` called directly) and every new
  `torch.cuda.Stream` / `torch.cuda.streams.Stream` is recorded, with the stream it named.
  The sandbox's stream guard (`optimize/sandbox/checks.py`) is this watch. It names what
  happened; it cannot see streams made in C++.
- `EscapeProbe`: checked calls, one after the warm-up batch and one after every round of
  samples. A checked call starts on an idle device (a device-wide synchronize), records a
  start and an end event on the timed stream around the call (and a mark after the copy of
  its output the fresh-input check may enqueue there), then synchronizes the whole device
  (every stream) and records a last event. The mark-to-last gap of a call that left nothing
  running is the synchronize's own latency, measured by the same sequence around no call
  (`calibrate`, with a GPU sleep as long as the kernel in place of the call, so the host
  waits as long); a call whose work ran past its stream's end leaves a longer gap. When the
  median excess over the calibration passes `ESCAPE_MIN_S` and `ESCAPE_SHARE` of the median
  sample, the probe measures again (`confirm`: checked calls each beside a calibration as long
  as the calls' device-wide time) and the work escaped only if that says so too.

A kernel whose work escapes fails, naming what was seen, unless its marker says
`streams="any"`: then every sample is a checked call and counts from the start event to the
device-wide end (less the calibrated latency), i.e. its real cost, host launch time included.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.measure import bound

# A median end-to-idle gap this much longer than the synchronize's own latency is device
# work that outlived the call's stream. 50 us and half the kernel's median: an honest 70 us
# Triton softmax read 21 us with a calibration that waited for nothing (the host sleeps longer
# in a longer wait); the side-stream cheats on the H200 read 2,666-2,746 us.
ESCAPE_MIN_S = 50e-6
ESCAPE_SHARE = 0.5
CALIBRATION_CALLS = 3
# The calibration's GPU sleep stands in for kernels up to this long; beyond, the rule's
# margin (half the median) dwarfs the host's wake-up difference, and a sleep would only cost.
MATCHED_WAIT_MAX_S = 1e-3
CONFIRM_CALLS = 5  # checked calls, each beside a calibration, before a kernel is refused
STREAM_MODES = ("current", "any")


@dataclass
class StreamWatch:
    """Records stream switches and new streams while `active` (module docstring): `install()`
    wraps what makes them, `uninstall()` puts the originals back. Without CUDA in torch it
    installs nothing unless `force` (tests: the wrappers are plain Python either way)."""

    events: list[str] = field(default_factory=list)
    active: bool = False
    _restore: list[Callable[[], None]] = field(default_factory=list)
    _timed_id: Any = None
    _torch: Any = None

    def install(self, torch: Any, *, force: bool = False) -> StreamWatch:
        if not (force or torch.cuda.is_available()):
            return self
        self._torch = torch
        watch = self
        streams = torch.cuda.streams
        stream_cls = streams.Stream
        original_new = stream_cls.__dict__.get("__new__")

        def counting_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
            # current_stream() builds its result with stream_id=: not a new stream.
            if watch.active and "stream_id" not in kwargs:
                watch.events.append(f"created a new {cls.__module__}.{cls.__qualname__}")
            target = original_new if original_new is not None else super(stream_cls, cls).__new__
            func = target.__func__ if isinstance(target, staticmethod) else target
            return func(cls, *args, **kwargs)

        stream_cls.__new__ = staticmethod(counting_new)
        self._restore.append(lambda: setattr(stream_cls, "__new__", original_new))

        original_set = torch.cuda.set_stream

        def set_stream(stream: Any) -> None:
            if watch.active and stream is not None:
                watch._note_switch(getattr(stream, "stream_id", None), "torch.cuda.set_stream")
            original_set(stream)

        torch.cuda.set_stream = set_stream
        self._restore.append(lambda: setattr(torch.cuda, "set_stream", original_set))
        original_c_set = getattr(torch._C, "_cuda_setStream", None)
        if original_c_set is not None:

            def c_set_stream(*args: Any, **kwargs: Any) -> Any:
                if watch.active:
                    stream_id = kwargs.get("stream_id", args[0] if args else None)
                    watch._note_switch(stream_id, "torch._C._cuda_setStream")
                return original_c_set(*args, **kwargs)

            torch._C._cuda_setStream = c_set_stream
            self._restore.append(lambda: setattr(torch._C, "_cuda_setStream", original_c_set))
        return self

    def watch(self, timed_stream_id: Any) -> None:
        """Record from now on; switching back to `timed_stream_id` is not a switch."""
        self._timed_id = timed_stream_id
        self.active = True

    def _note_switch(self, stream_id: Any, how: str) -> None:
        if stream_id is not None and stream_id == self._reference_id():
            return
        text = f"switched to stream {stream_id} ({how})"
        if not any(e.startswith(f"switched to stream {stream_id} ") for e in self.events):
            self.events.append(text)

    def _reference_id(self) -> Any:
        """The timed stream's id, or (not timing) the current stream's: a switch to the
        stream already current is no switch."""
        if self._timed_id is not None:
            return self._timed_id
        try:
            return self._torch.cuda.current_stream().stream_id
        except Exception:  # no CUDA (tests of the wrappers)
            return None

    def uninstall(self) -> None:
        self.active = False
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()


@dataclass
class EscapeProbe:
    """Checked calls of one CUDA timing (module docstring); `events`: a `timing.cuda.CudaEvents`
    on the timed stream."""

    events: Any
    null_gaps_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    device_wide_s: list[float] = field(default_factory=list)
    spent_s: float = 0.0  # host seconds in the calibration and the checked calls
    confirmed: bool = False  # the decision rests on a confirmation (`confirm`)

    def _bracket(self, body: Callable[[], Any] | None) -> tuple[float, float, Any]:
        ev = self.events
        ev.synchronize_device()
        start = ev.mark()
        out = body() if body is not None else None
        end = ev.mark()
        ev.synchronize_device()  # every stream of the device
        idle = ev.mark()
        idle.synchronize()
        return ev.elapsed_s(start, end), ev.elapsed_s(end, idle), (start, idle, out)

    def calibrate(self, wait: Callable[[], Any] | None = None) -> None:
        """The end-to-idle gap of no kernel (module docstring), `wait` between the start and
        end events in place of a call."""
        started = bound.perf_counter()
        for _ in range(CALIBRATION_CALLS):
            self.null_gaps_s.append(self._bracket(wait)[1])
        self.spent_s += bound.perf_counter() - started

    def confirm(
        self,
        body: Callable[[], Any],
        after: Callable[[Any, Any], Any] | None,
        wait: Callable[[], Any] | None,
        before: Callable[[], Any] | None = None,
    ) -> tuple[Any, ...]:
        """Measure again before refusing (module docstring): `CONFIRM_CALLS` checked calls,
        each after a calibration with `wait`; `escaped` decides on these alone from then on.
        `before()` makes each call's content token, handed to `after`; returns what `after`
        returned that is not None."""
        self.gaps_s, self.null_gaps_s = [], []
        seen: tuple[Any, ...] = ()
        started = bound.perf_counter()
        for _ in range(CONFIRM_CALLS):
            self.null_gaps_s.append(self._bracket(wait)[1])
            self.spent_s += bound.perf_counter() - started
            content = before() if before is not None else None
            key = self.checked_call(body, after, content=content)[1]
            seen = seen if key is None else (*seen, key)
            started = bound.perf_counter()
        self.confirmed = True
        return seen

    def null_gap_s(self) -> float:
        return statistics.median(self.null_gaps_s) if self.null_gaps_s else 0.0

    def checked_call(
        self,
        body: Callable[[], Any],
        after: Callable[[Any, Any], Any] | None = None,
        *,
        own_streams: bool = False,
        content: Any = None,
    ) -> tuple[float, Any]:
        """One checked call; returns its device-wide time (start event to the device idle,
        less the calibrated latency and the copy `after` enqueued) and what `after` returned.
        `after(out, content)` sees the output before the device-wide synchronize (a copy
        enqueued there reads what the timed stream has); `content` is the token of the call's
        content (`FreshInputs.before`), passed through as an argument (no object holds it).
        `own_streams` (streams="any"): `after` waits for the kernel's own streams first, so
        its time is the kernel's and stays in."""
        ev = self.events
        began = bound.perf_counter()
        ev.synchronize_device()
        start = ev.mark()
        out = body()
        end = ev.mark()
        # A snapshot `after` copies runs on the timed stream: not the kernel's work.
        seen = after(out, content) if after is not None else None
        snapped = ev.mark()
        ev.synchronize_device()
        idle = ev.mark()
        idle.synchronize()
        gap = ev.elapsed_s(snapped, idle)
        self.gaps_s.append(gap)
        copied = 0.0 if own_streams else ev.elapsed_s(end, snapped)
        own = ev.elapsed_s(start, idle) - copied - self.null_gap_s()
        wide = max(own, ev.elapsed_s(start, end))
        self.device_wide_s.append(wide)
        self.spent_s += bound.perf_counter() - began
        return wide, seen

    def excess_s(self) -> float:
        """Median end-to-idle gap of the checked calls beyond the calibration's."""
        if not self.gaps_s:
            return 0.0
        return statistics.median(self.gaps_s) - self.null_gap_s()

    def escaped(self, median_s: float) -> bool:
        return self.excess_s() > max(ESCAPE_MIN_S, ESCAPE_SHARE * median_s)

    def to_dict(self) -> dict[str, Any]:
        # Not "checked_calls": the record's honesty holds the fresh inputs' count under it.
        return {
            "stream_checked_calls": len(self.gaps_s),
            "checked_s": round(self.spent_s, 6),
            "confirmed_by_recheck": self.confirmed,
            "excess_s": self.excess_s(),
            "null_gap_s": self.null_gap_s(),
        }


def escape_message(probe: EscapeProbe, median_s: float, switches: list[str]) -> str:
    """Why a kernel is refused: the device stayed busy after its stream's end event."""
    seen = f"; while it was timed the kernel {'; '.join(switches[:3])}" if switches else ""
    return (
        "device work outside the timed stream: after the kernel's calls the device stayed busy "
        f"a median {probe.excess_s() * 1e6:.1f} us past the end event on the timed stream "
        f"(median sample {median_s * 1e6:.1f} us, {len(probe.gaps_s)} checked calls"
        + (", measured again to confirm" if probe.confirmed else "")
        + f"){seen}. "
        "That work was not in the timing. If the kernel really uses its own streams, join them "
        "before returning (torch.cuda.current_stream().wait_stream(side)), or mark it "
        'streams="any" to be timed with a device-wide synchronize after every call (host '
        "launch time included)"
    )


bound.keep_module(sys.modules[__name__])
