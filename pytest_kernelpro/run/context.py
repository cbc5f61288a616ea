"""What one kernel item's run knows and is bound by: its resolved settings, its profiling setup,
its time limit, and what its process chose and ran with.

`ItemSettings.resolve` decides, once per item, every setting a marker can override, with the
one precedence of the project: marker > command line > `KERNELPRO_*` environment > ini >
conftest defaults (`pytest_kernelpro_defaults`) > built-in. It adds the marker on top of
`config.KernelproConfig` and keeps the source of every value, so a message can say why a
kernel got its threshold or tolerance.

| setting      | marker keyword | session setting          | built-in                                  |
|--------------|----------------|--------------------------|-------------------------------------------|
| threshold    | threshold=     | --kernelpro-threshold    | 2% on a CUDA GPU, 5% on the CPU (gate)    |
| trials       | trials=        | --kernelpro-trials       | 3                                         |
| rtol, atol   | rtol=, atol=   | (none)                   | by the reference output's dtype           |
| min_roofline | min_roofline=  | (none)                   | none (no floor)                           |
| device       | device=        | --kernelpro-device       | auto: the CUDA GPU when one is visible    |

**The time limit** (`item_time_limit`), in two layers, because a hang can happen in two places:

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

**What the item's process chose** (its autotune picks, the library settings that choose
algorithms, the versions that change generated code): the capture watches the correctness
trials, where an autotuner tunes at its first call, and reads what the timing tuned
afterwards. In the fresh process that confirms a regression (`fresh_process.py`) the
baseline's choices are pinned before the kernel's first call.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.environment import (
    autotuner_classes,
    library_choices,
    load_triton_if_used,
)
from pytest_kernelpro.record import AutotunePart, EnvironmentPart

if TYPE_CHECKING:
    import pytest

    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.measure.autotune_capture import AutotuneCapture
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.problem import Problem, ProblemLocator
    from pytest_kernelpro.record import KernelRecord
    from pytest_kernelpro.run.profile_stage import SessionCapture

T = TypeVar("T")

MARKER = "marker"
TOLERANCE_BY_DTYPE = "built-in: by the reference output's dtype (measure/output_rule.py)"

# The seed of the timing inputs: apart from the trials' (0, 1, ...), in the item's process and in
# the fresh process that re-measures it.
TIMING_SEED = 1_000_003
WATCHDOG_GRACE_S = 30.0  # after the limit, how long native code may still take to return
WATCHDOG_EXIT_STATUS = 3  # pytest's "internal error" status: the session did not finish


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A setting's value and where it came from."""

    value: T
    source: str


@dataclass(frozen=True)
class ItemSettings:
    """The settings of one kernel item, each with its source (see the module docstring)."""

    NAMES: ClassVar[tuple[str, ...]] = (
        "threshold", "trials", "rtol", "atol", "min_roofline", "device"
    )  # fmt: skip

    threshold: Resolved[float]
    trials: Resolved[int]
    rtol: Resolved[float | None]  # None: the dtype's default tolerance
    atol: Resolved[float | None]
    min_roofline: Resolved[float | None]  # None: no floor
    device: Resolved[str]  # "cuda", "cuda:N" or "cpu": the device the item runs on

    @classmethod
    def resolve(cls, problem: Problem, config: KernelproConfig, device: str) -> ItemSettings:
        """The item's settings once its `device` is chosen (the built-in threshold depends on
        it). `problem` carries the marker's values (None where the marker leaves one out)."""
        from pytest_kernelpro.gate.verdict import default_threshold

        sources = config.sources
        kind = "cuda" if device.startswith("cuda") else "cpu"

        def marker(key: str) -> str:
            return f"{MARKER} {key}="

        if problem.threshold is not None:
            threshold = Resolved(float(problem.threshold), marker("threshold"))
        elif config.threshold is not None:
            threshold = Resolved(config.threshold, sources.get("threshold", "default"))
        else:
            threshold = Resolved(default_threshold(kind), f"built-in for a {kind} kernel")
        if problem.trials is not None:
            trials = Resolved(int(problem.trials), marker("trials"))
        else:
            trials = Resolved(config.trials, sources.get("trials", "default"))
        rtol = Resolved(
            problem.rtol, marker("rtol") if problem.rtol is not None else TOLERANCE_BY_DTYPE
        )
        atol = Resolved(
            problem.atol, marker("atol") if problem.atol is not None else TOLERANCE_BY_DTYPE
        )
        if problem.min_roofline is not None:
            min_roofline = Resolved(problem.min_roofline, marker("min_roofline"))
        else:
            min_roofline = Resolved(None, "built-in: no floor")
        if problem.device_preference in ("cuda", "cpu"):
            device_source = marker("device")
        elif config.device != "auto":
            device_source = sources.get("device", "default")
        else:
            device_source = f"{sources.get('device', 'default')} (auto: {kind})"
        return cls(threshold, trials, rtol, atol, min_roofline, Resolved(device, device_source))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Setting name -> {"value", "source"}: the record's `settings` (the JSON report)."""
        return {
            name: {"value": getattr(self, name).value, "source": getattr(self, name).source}
            for name in self.NAMES
        }


@dataclass(frozen=True)
class DeviceModel:
    """The device's ceilings and table entry (None on the CPU), or the error that kept them
    from the item, which the roofline stage fails with (`require`)."""

    ceilings: Ceilings | None
    spec: DeviceSpec | None
    error: KernelproError | None = None

    def require(self) -> tuple[Ceilings, DeviceSpec | None]:
        if self.ceilings is None:
            assert self.error is not None
            raise self.error
        return self.ceilings, self.spec


@dataclass(frozen=True)
class ItemRun:
    """One kernel item's state once its device is chosen, built once per item and passed to
    every stage as a value: no stage chooses a device, reads a thread policy or looks ceilings
    or a baseline entry up again. The record is the one mutable part: each stage fills its own
    fields of it."""

    nodeid: str
    problem: Problem
    locator: ProblemLocator
    settings: ItemSettings  # the marker-overridable settings, the device among them
    record: KernelRecord
    session_settings: KernelproConfig  # the session-wide ones (timing budget, check mode, ...)
    time_limit: Resolved[float | None]  # the item time limit (None: none) and its source
    threads: int | None  # torch's CPU thread count under the thread policy; None on a GPU
    device_model: DeviceModel
    time_budget_s: float  # the timing budget on its device (`KernelproConfig.budget_for`)
    # The baseline's entry of this item under --kernelpro-check (None: a new kernel), or the
    # error that kept the baseline from loading (the gate stage fails with it).
    baseline_entry: BaselineEntry | None = None
    baseline_error: KernelproError | None = None
    # The test module pytest imported the marked kernel from (None for a KernelBench file):
    # the optimize stage finds the live kernel in it.
    module: Any = None

    # Read by every stage, fixed for the item: computed on the first read only.
    @functools.cached_property
    def device(self) -> str:
        return self.settings.device.value

    @functools.cached_property
    def name(self) -> str:
        return self.problem.display_name


@dataclass
class Profiling:
    """The profile stage's setup, one per session; the budget of automatic profiles of
    regressed kernels is shared by the session's items, so it counts as they run."""

    capture: SessionCapture | None
    timeout_s: float
    auto_limit: int  # automatic profiles per session (--kernelpro-auto-profiles)
    auto_time_s: float  # and the seconds they may take together
    auto_done: int = 0
    auto_spent_s: float = 0.0

    @classmethod
    def for_settings(cls, settings: KernelproConfig) -> Profiling:
        return cls(
            capture=None,
            timeout_s=settings.profile_timeout_s,
            auto_limit=settings.auto_profiles,
            auto_time_s=settings.auto_profile_time_s,
        )

    def auto_profile_allowed(self) -> bool:
        return self.auto_done < self.auto_limit and self.auto_spent_s < self.auto_time_s


class Services(Protocol):
    """What a plugin's `pytest_kernelpro_item_measured` hook may use of the session."""

    settings: KernelproConfig  # the session-wide settings and their sources
    config: pytest.Config

    def add_record(self, record: KernelRecord) -> None: ...


# The item's time limit (module docstring).


class ItemTimeout(BaseException):  # noqa: N818 - reads as what happened, like TimeoutError
    """Raised in the main thread when a kernel item runs past its time limit."""


def time_limit_setting(config: KernelproConfig) -> Resolved[float | None]:
    """The item time limit (None: none) and where it came from."""
    return Resolved(config.item_timeout_s, config.sources.get("item_timeout", "default"))


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
    """Limit the block to `seconds` (None: no limit); see the module docstring. `message()`
    gives the failure text when the limit fires; `on_native_hang(text)` runs in the watchdog
    thread before the process exits."""
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
    fired: list[str] = []  # the limit's message, once its alarm raised in the block

    def on_alarm(signum: int, frame: object) -> None:
        if done.is_set():  # the block already ended: an alarm in flight is not a timeout
            return
        fired.append(message())
        raise ItemTimeout(fired[0])

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
        # The alarm raises wherever the main thread is: C code can turn it into an error of
        # its own (`compile` into a SystemError), and a kernel's or library's handler can
        # wrap or swallow it. Past the limit the item failed for its time, whatever left the
        # block.
        try:
            yield
        except ItemTimeout:
            raise
        except BaseException as exc:
            if fired:
                raise ItemTimeout(fired[0]) from exc
            raise
        if fired:
            raise ItemTimeout(fired[0])
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


# What the item's process chose and ran with (module docstring).


def extra_autotuners(config: pytest.Config) -> list[type]:
    """Autotuner classes a conftest names (`pytest_kernelpro_autotuners`)."""
    found: list[type] = []
    for contributed in config.hook.pytest_kernelpro_autotuners():
        found.extend(c for c in contributed or () if isinstance(c, type))
    return found


def autotune_capture(run: ItemRun, pins_path: Any, classes: list[type]) -> AutotuneCapture | None:
    """The item's capture, with a re-measuring child's pins (`pins_path`) and the autotuners a
    conftest adds (`classes`); None when there is nothing to watch or pin (no autotuner loaded
    once the kernel is built, none added, no pins): it would record nothing."""
    load_triton_if_used(run.problem.language)
    if pins_path is None and not autotuner_classes(classes):
        return None
    from pytest_kernelpro.measure.autotune_capture import AutotuneCapture, read_pins

    pins = read_pins(pins_path) if pins_path is not None else []
    return AutotuneCapture(pins=pins, classes=classes)


def watching(capture: AutotuneCapture | None) -> contextlib.AbstractContextManager[Any]:
    """The capture watching the block's autotuner calls (nothing to watch without one)."""
    return capture.watching() if capture is not None else contextlib.nullcontext()


def record_process_facts(run: ItemRun, capture: AutotuneCapture | None) -> None:
    """The record's autotune choices, library settings and code-changing versions."""
    from pytest_kernelpro.measure.environment import code_versions

    record = run.record
    library = library_choices()
    record.autotune = (
        capture.part(library) if capture is not None else AutotunePart(library=library)
    )
    record.environment = EnvironmentPart(**code_versions(record.device_kind))
