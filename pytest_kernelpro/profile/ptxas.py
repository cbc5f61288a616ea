"""Parse `ptxas -v` (`-Xptxas=-v`) resource reports into `PtxasReport`s.

ptxas writes, per entry function and target:

    ptxas info    : Compiling entry function '_Z12spill_kernelPKfPfPKii' for 'sm_90a'
    ptxas info    : Function properties for _Z12spill_kernelPKfPfPKii
        256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 20 registers, used 0 barriers, 256 bytes cumulative stack size

Older toolkits put shared and constant memory on the "Used" line ("8192 bytes smem, 360
bytes cmem[0]"), and print "Function properties" for device functions that are not entry
points; those are skipped. A build log (ninja's output) interleaves other lines, which are
ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pytest_kernelpro.profile.model import PtxasReport

_COMPILING = re.compile(
    r"ptxas\s+info\s*:\s*Compiling entry function\s+'([^']+)'\s+for\s+'([^']+)'"
)
_PROPERTIES = re.compile(r"ptxas\s+info\s*:\s*Function properties for\s+(\S+)")
_STACK = re.compile(
    r"(\d+)\s+bytes stack frame,\s*(\d+)\s+bytes spill stores,\s*(\d+)\s+bytes spill loads"
)
_USED = re.compile(r"ptxas\s+info\s*:\s*Used\s+(\d+)\s+registers(.*)$")
_SMEM = re.compile(r"(\d+)\s+bytes\s+smem")
_CMEM = re.compile(r"(\d+)\s+bytes\s+cmem\[\d+\]")


def parse_ptxas_output(text: str) -> list[PtxasReport]:
    """Every entry function's resources in `text`, in the order ptxas reported them."""
    reports: list[PtxasReport] = []
    entry: str | None = None
    arch = ""
    props_for: str | None = None
    stack = (0, 0, 0)
    for line in text.splitlines():
        match = _COMPILING.search(line)
        if match:
            entry, arch = match.group(1), match.group(2)
            props_for, stack = None, (0, 0, 0)
            continue
        match = _PROPERTIES.search(line)
        if match:
            props_for = match.group(1)
            continue
        match = _STACK.search(line)
        if match and props_for is not None:
            if props_for == entry:
                stack = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
            continue
        match = _USED.search(line)
        if match and entry is not None:
            rest = match.group(2)
            smem = _SMEM.search(rest)
            constant = sum(int(c) for c in _CMEM.findall(rest))
            reports.append(
                PtxasReport(
                    function=entry,
                    arch=arch,
                    registers=int(match.group(1)),
                    shared_bytes=int(smem.group(1)) if smem else 0,
                    stack_frame_bytes=stack[0],
                    spill_store_bytes=stack[1],
                    spill_load_bytes=stack[2],
                    constant_bytes=constant,
                )
            )
            entry, props_for, stack = None, None, (0, 0, 0)
    return reports


def ptxas_by_function(
    reports: Iterable[PtxasReport], arch: str | None = None
) -> dict[str, PtxasReport]:
    """Reports keyed by mangled function name; with several targets, `arch` picks one and
    otherwise the last reported target wins (nvcc compiles gencodes in the order given)."""
    result: dict[str, PtxasReport] = {}
    for report in reports:
        if arch is None or report.arch == arch:
            result[report.function] = report
    return result
