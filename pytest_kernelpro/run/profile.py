"""Profile a kernel item and turn its counters into findings and guidance.

Glue between the runner and `analysis` (profile -> Stage 1 -> tools -> guidance, the same
path every optimizer candidate takes). Nothing here raises for a missing profiler; what was
not collected is in the report.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.profile.capture import ExtensionCapture
    from pytest_kernelpro.run.context import ItemRun, Profiling


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


def profile_item(run: ItemRun, profiling: Profiling, device: str) -> None:
    """Fill the record's profile, the tools' findings, guidance and the report text."""
    from pytest_kernelpro.analysis import RooflineFacts, profile_and_analyze
    from pytest_kernelpro.record import ProfilePart

    record = run.record
    capture = profiling.capture
    facts = RooflineFacts.from_roofline(
        record.roofline.to_dict() if record.roofline else None,
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
    record.profile = ProfilePart.from_dict(analysis.report.to_dict())
    record.extra["tools"] = analysis.tool_run.to_dict()
    record.extra["profile_wall_s"] = analysis.profile_s
    record.guidance = analysis.guidance_md or None
    record.extra["profile_text"] = analysis.text
