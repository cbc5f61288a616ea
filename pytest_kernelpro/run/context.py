"""What one kernel item's run is given: its resolved settings and its profiling setup.

`ItemSettings.resolve` decides, once per item, every setting a marker can override, with the
one precedence of the project: marker > command line > `KERNELPRO_*` environment > ini >
conftest defaults (`pytest_kernelpro_defaults`) > built-in. The session-wide part of that
chain (command line to built-in) is already resolved by `config.KernelproConfig`, whose
`sources` name where each value came from; this adds the marker on top and keeps the source
of every value, so a message can say why a kernel got its threshold or tolerance.

| setting      | marker keyword | session setting          | built-in                                  |
|--------------|----------------|--------------------------|-------------------------------------------|
| threshold    | threshold=     | --kernelpro-threshold    | 2% on a CUDA GPU, 5% on the CPU (gate)    |
| trials       | trials=        | --kernelpro-trials       | 3                                         |
| rtol, atol   | rtol=, atol=   | (none)                   | by the reference output's dtype           |
| min_roofline | min_roofline=  | (none)                   | none (no floor)                           |
| device       | device=        | --kernelpro-device       | auto: the CUDA GPU when one is visible    |

`Profiling` is the profile stage's setup: the session's builds (`SessionCapture`), the
profiler's time limit, the budget of automatic regression profiles. `Services` is what the optimizer's one seam
(`optimize.loop.item.optimize_item`) uses of the session; the other stages get values.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.optimize.loop.progress import SearchProgress
    from pytest_kernelpro.problem import Problem, ProblemLocator
    from pytest_kernelpro.profile.capture import ExtensionCapture
    from pytest_kernelpro.record import KernelRecord

T = TypeVar("T")

MARKER = "marker"
TOLERANCE_BY_DTYPE = "built-in: by the reference output's dtype (measure/correctness.py)"


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

    def sources(self) -> dict[str, str]:
        """Setting name -> where its value came from."""
        return {name: getattr(self, name).source for name in self.NAMES}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Setting name -> {"value", "source"}: the record's `settings` (the JSON report)."""
        return {
            name: {"value": getattr(self, name).value, "source": getattr(self, name).source}
            for name in self.NAMES
        }


@dataclass(frozen=True)
class ItemRun:
    """One kernel item's run once its device is chosen: what every stage works on.

    The record is the one mutable part: each stage fills its own fields of it.
    """

    nodeid: str
    problem: Problem
    locator: ProblemLocator
    settings: ItemSettings
    record: KernelRecord
    # The test module pytest imported the marked kernel from (None for a KernelBench file):
    # the optimize stage finds the live kernel in it, and its patch keeps the module's
    # import style.
    module: Any = None

    @property
    def device(self) -> str:
        return self.settings.device.value

    @property
    def name(self) -> str:
        return self.problem.display_name


class SessionCapture:
    """Records every load_inline/load build of the session, so a kernel item whose
    extension was built (and cached) by an earlier item still finds its `.so`."""

    def __init__(self, *, extra_flags: bool = True) -> None:
        self._stack = contextlib.ExitStack()
        self.capture: ExtensionCapture | None = None
        self.extra_flags = extra_flags

    def start(self) -> None:
        try:
            from pytest_kernelpro.profile.capture import DEFAULT_CUDA_FLAGS, capture_extensions
        except ImportError:  # torch missing: nothing can be built anyway
            return
        flags = DEFAULT_CUDA_FLAGS if self.extra_flags else ()
        self.capture = self._stack.enter_context(capture_extensions(extra_cuda_cflags=flags))

    def stop(self) -> None:
        self._stack.close()

    @property
    def so_paths(self) -> list[str]:
        return self.capture.so_paths if self.capture else []

    @property
    def ptxas(self) -> list[Any]:
        return [p for b in self.capture.builds for p in b.ptxas] if self.capture else []


@dataclass
class Profiling:
    """The profile stage's setup, one per session: the builds it looks up (`capture`), the
    profiler's time limit, and the budget of automatic profiles of regressed kernels with
    what was spent of it (shared by the session's items, so it counts as they run)."""

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
    """What the optimize stage uses of the session, and all it may use of it (implemented by
    `run.session.KernelproSession`)."""

    settings: KernelproConfig  # the session-wide settings and their sources

    def add_record(self, record: KernelRecord) -> None: ...

    def search_progress(
        self, kernel: str, budget: str, max_evaluations: int | None
    ) -> SearchProgress:
        """The optimize stage's live progress display (on pytest's terminal)."""
