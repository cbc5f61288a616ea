"""Time limit of one kernel item, enforced inside the pytest process.

Two layers, because a hang can happen in two places:

- Python code (a kernel stuck in a loop, a `time.sleep`, a wait that returns to the
  interpreter): `SIGALRM` at the limit raises `ItemTimeout` in the main thread; the item fails
  with a message naming the limit and where it came from, and the session goes on.
  `ItemTimeout` derives from BaseException so the `except Exception` blocks that turn a kernel's
  error into a failed check do not swallow it.
- Native code that never returns to the interpreter (a GPU kernel spinning forever while the
  host waits in `cudaDeviceSynchronize`): no signal handler can run there. A watchdog thread
  waits `WATCHDOG_GRACE_S` more, then appends the item's failed record to the records log,
  writes the JSON report of what finished, says why on stderr and ends the process. The
  session is lost from that item on, but every finished record is kept and the gate fails;
  `--kernelpro-isolate` runs each item in its own process, where only that item is lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

WATCHDOG_GRACE_S = 30.0  # after the limit, how long native code may still take to return
WATCHDOG_EXIT_STATUS = 3  # pytest's "internal error" status: the session did not finish


class ItemTimeout(BaseException):  # noqa: N818 - reads as what happened, like TimeoutError
    """Raised in the main thread when a kernel item runs past its time limit."""


def timeout_message(name: str, seconds: float, source: str, phase: str) -> str:
    return (
        f"{name} ran past the item time limit of {seconds:g} s ({source}) while {phase}; "
        "a hanging or very slow kernel. Raise the limit with --kernelpro-item-timeout=SECONDS "
        "(ini kernelpro_item_timeout) if it is only slow"
    )


@contextlib.contextmanager
def item_time_limit(
    seconds: float | None,
    message: Callable[[], str],
    on_native_hang: Callable[[str], None],
) -> Iterator[None]:
    """Limit the block to `seconds` (None: no limit); see the module docstring.

    `message()` gives the failure text at the moment the limit fires (it names the phase);
    `on_native_hang(text)` runs in the watchdog thread before the process exits.
    """
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return
    assert seconds is not None
    done = threading.Event()

    def on_alarm(signum: int, frame: object) -> None:
        if done.is_set():  # the block already ended: an alarm in flight is not a timeout
            return
        raise ItemTimeout(message())

    def watchdog() -> None:
        if done.wait(seconds + WATCHDOG_GRACE_S):
            return
        text = (
            message()
            + f". It did not return within {WATCHDOG_GRACE_S:g} s more (stuck in native code, "
            "e.g. a GPU kernel that never finishes), so the pytest process ends here; finished "
            "records are in the records log. Run with --kernelpro-isolate to lose only this item"
        )
        try:
            on_native_hang(text)
        finally:
            sys.stderr.write(f"\nkernelpro: {text}\n")
            sys.stderr.flush()
            os._exit(WATCHDOG_EXIT_STATUS)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    thread = threading.Thread(target=watchdog, name="kernelpro-item-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        # Nested, because the alarm can fire here, as the block ends at its limit: its
        # ItemTimeout must not skip `done.set()`, or the watchdog would later end a process
        # whose item had already finished.
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            try:
                signal.signal(signal.SIGALRM, previous)
            finally:
                done.set()
