"""The profile stage of a kernel item: ncu, SASS and a timeline of the kernel, then the
tools' findings and guidance (under --kernelpro-profile, or for a regressed kernel within the
session's budget). A profiler failure never fails the kernel. The session's builds are
captured from configure on only where a CUDA GPU is, so a CPU session imports none of this."""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from typing import TYPE_CHECKING, Any

import msgspec

from pytest_kernelpro.errors import describe_exception
from pytest_kernelpro.run.context import ItemRun, Profiling

if TYPE_CHECKING:
    from pytest_kernelpro.profile.capture import ExtensionCapture


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


def profile(run: ItemRun, profiling: Profiling, device: str | None = None) -> None:
    """ncu, SASS and timeline of the kernel, then the tools' findings and guidance."""
    device = run.device if device is None else device
    record = run.record
    if not device.startswith("cuda"):
        record.extra["profile_text"] = (
            "profile: not collected: ncu, SASS and timeline need a CUDA GPU"
        )
        record.extra["profile_skipped"] = "no CUDA GPU"
        return
    from pytest_kernelpro.measure.gpu_memory import memory_state, release_cached

    # The profiler runs the kernel in child processes (ncu, kineto): give them the memory
    # this process has cached but does not use; the record says what they had.
    release_cached(device, 0)
    record.extra["profile_gpu_memory"] = memory_state(device)
    try:
        _profile_item(run, profiling, device)
    except Exception as exc:  # a profiler failure never fails the kernel
        record.extra["profile_text"] = f"profile: failed: {describe_exception(exc)}"


def _profile_item(run: ItemRun, profiling: Profiling, device: str) -> None:
    """Fill the record's profile, the tools' findings, guidance and the report text."""
    from pytest_kernelpro.analysis import RooflineFacts, profile_and_analyze
    from pytest_kernelpro.record import ProfilePart, part_of

    record = run.record
    capture = profiling.capture
    facts = RooflineFacts.from_roofline(
        msgspec.to_builtins(record.roofline) if record.roofline else None,
        median_s=record.median_s,
        efficiency=record.efficiency,
    )
    analysis = profile_and_analyze(
        run.locator,
        facts,
        so_paths=capture.so_paths if capture else (),
        ptxas=capture.ptxas if capture else (),
        device=device,
        timeout_s=profiling.timeout_s,
        ncu_path=os.environ.get("KERNELPRO_NCU"),
    )
    record.profile = part_of(ProfilePart, analysis.report)
    record.extra["tools"] = analysis.tool_run.to_dict()
    record.extra["profile_wall_s"] = analysis.profile_s
    record.guidance = analysis.guidance_md or None
    record.extra["profile_text"] = analysis.text


def auto_profile(run: ItemRun, profiling: Profiling) -> None:
    """A regression comes with its profile (what changed, in the counters' words), within the
    session's budget of automatic profiles; past it, the record says how to profile it."""
    record = run.record
    if not profiling.auto_profile_allowed():
        record.extra["profile_text"] = (
            f"profile: not collected automatically: {profiling.auto_done} regressed "
            f"kernel(s) were already profiled in {profiling.auto_spent_s:.0f} s (budget: "
            f"--kernelpro-auto-profiles={profiling.auto_limit}, "
            f"--kernelpro-auto-profile-time={profiling.auto_time_s:g}). Profile this one "
            f"with: pytest {shlex.quote(run.nodeid)} --kernelpro-profile"
        )
        return
    started = time.perf_counter()
    try:
        profile(run, profiling, record.device_kind)
    finally:
        profiling.auto_done += 1
        profiling.auto_spent_s += time.perf_counter() - started
