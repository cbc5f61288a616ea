"""Profile a kernel item and turn its counters into findings and guidance.

Glue between the runner and the parts: `profile/` measures, `tools/` interprets. Nothing
here raises for a missing profiler; what was not collected is in the report.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .items import KernelItem
    from .profile.capture import ExtensionCapture
    from .results import KernelRecord
    from .session import KernelproSession


class SessionCapture:
    """Records every load_inline/load build of the session, so a kernel item whose
    extension was built (and cached) by an earlier item still finds its `.so`."""

    def __init__(self, *, extra_flags: bool = True) -> None:
        self._stack = contextlib.ExitStack()
        self.capture: ExtensionCapture | None = None
        self.extra_flags = extra_flags

    def start(self) -> None:
        try:
            from .profile.capture import DEFAULT_CUDA_FLAGS, capture_extensions
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


def profile_item(
    item: KernelItem, session: KernelproSession, record: KernelRecord, device: str
) -> None:
    """Fill record.profile, the tools' findings, guidance and the report text."""
    from .profile.collect import profile_kernel_item
    from .profile.model import NotCollected
    from .profile.render import render_profile_section
    from .tools.guidance import generate_prompt_guidance, render_findings_text
    from .tools.registry import run_tools
    from .tools.stage1 import classify

    capture = session.capture
    report = profile_kernel_item(
        item.locator,
        so_paths=capture.so_paths if capture else (),
        ptxas=capture.ptxas if capture else (),
        device=device,
        timeout_s=session.settings.profile_timeout_s,
        ncu_path=os.environ.get("KERNELPRO_NCU"),
    )
    roofline = record.roofline or {}
    main = next((k for k in report.kernels if k.metrics is not None), None)
    stage1 = classify(roofline.get("bound"), main.metrics if main else None)
    tool_run = run_tools(
        report,
        stage1,
        op_category=roofline.get("dominant_category"),
        min_bytes=roofline.get("min_bytes"),
        flops=roofline.get("flops"),
        roofline_fraction=record.efficiency,
        timed_median_s=record.median_s,
        dtype=next((op.get("dtype") for op in roofline.get("ops") or [] if op.get("dtype")), None),
    )
    # SASS and ptxas exist only for kernels of a captured load_inline module.
    if report.kernels and all(k.sass is None for k in report.kernels):
        report.not_collected.append(
            NotCollected(
                "sass",
                "no captured load_inline module holds these kernels (PyTorch, Triton or "
                "library kernels): SASS and ptxas resources are read from captured .so files only",
            )
        )
    record.profile = report.to_dict()
    record.extra["tools"] = tool_run.to_dict()
    record.extra["profile_wall_s"] = report.wall_s
    record.guidance = generate_prompt_guidance(report, tool_run, stage1, mode="tools") or None
    record.extra["profile_text"] = "\n".join(
        part for part in (render_profile_section(report), render_findings_text(tool_run)) if part
    )
