"""What the CPU's memory holds when a timed call starts: the cache flush and the allocator.

- The cache flush (`cpu_flush`): `on` writes the last-level cache (at most
  `CPU_FLUSH_LLC_CAP` of it) plus the L2 of the CPU the process runs on before each sample;
  `off` never does; `auto` (the default) flushes only when the kernel's inputs fit in that
  cache (`working_set_bytes`), because inputs larger than the cache come from memory whether
  or not it was flushed, and the flush would only cost time (81 ms a sample on a machine with
  a 256 MiB last-level cache). `CacheFlush` is the buffer written and its cost per sample.
- The process's allocator is made steady before the first CPU timing (`steady_allocator`):
  glibc's moving mmap threshold otherwise decides per process whether a kernel's output
  buffers page-fault on every call, and the gate would compare two allocators, not two kernels.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.measure import bound
from pytest_kernelpro.measure.timing.budget import DEFAULT_FLUSH_BYTES, TimingBudget


def _current_cpu() -> int:
    try:
        return min(os.sched_getaffinity(0))
    except (AttributeError, OSError, ValueError):
        return 0


def cpu_cache_levels() -> dict[int, int]:
    """Sizes of the data/unified caches of the CPU this process runs on, by level (sysfs)."""
    import glob

    sizes: dict[int, int] = {}
    for folder in glob.glob(f"/sys/devices/system/cpu/cpu{_current_cpu()}/cache/index*"):
        try:
            with open(f"{folder}/level", encoding="utf-8") as handle:
                level = int(handle.read())
            with open(f"{folder}/type", encoding="utf-8") as handle:
                kind = handle.read().strip()
            with open(f"{folder}/size", encoding="utf-8") as handle:
                text = handle.read().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes[level] = int(digits) * scale
    return sizes


# The most of the last-level cache a CPU flush writes: above the cache's size a flush costs a
# memory-speed write every sample, and a VM can report its host's whole LLC (480 MiB: ~100 ms
# a sample, the default budget overrun 2-5x; bench/results/2026-12-05-first-run-cpu.md). Above
# the cap small inputs may stay partly cached (alike for baseline and head on one machine);
# the flush reason says when it applies.
CPU_FLUSH_LLC_CAP = 64 * 2**20


def cpu_flush_bytes() -> int:
    """Bytes a CPU flush writes: the L2 of this core plus the last-level cache, at most
    `CPU_FLUSH_LLC_CAP` of it, so every level that could hold the inputs is overwritten once
    where the LLC is of ordinary size; the cap when the cache sizes are unknown."""
    levels = cpu_cache_levels()
    if len(levels) >= 2:
        top = sorted(levels)[-2:]
        return levels[top[0]] + min(levels[top[1]], CPU_FLUSH_LLC_CAP)
    return min(last_level_cache_bytes() or DEFAULT_FLUSH_BYTES, CPU_FLUSH_LLC_CAP)


def cpu_flush_cap_note() -> str:
    """Why the flush writes less than the whole last-level cache ("" when it writes all)."""
    llc = last_level_cache_bytes()
    if llc is None:
        return f"; the cache sizes are unknown, so {CPU_FLUSH_LLC_CAP >> 20} MiB"
    if llc <= CPU_FLUSH_LLC_CAP:
        return ""
    return (
        f"; {CPU_FLUSH_LLC_CAP >> 20} MiB of the {llc >> 20} MiB last-level cache (the cap: "
        "a whole-cache write before every sample would not fit the time budget; small inputs "
        "may stay partly cached, the same for the baseline and the head)"
    )


def last_level_cache_bytes() -> int | None:
    """Size of the CPU's largest cache level (Linux sysfs, else sysconf), or None."""
    import glob

    best: tuple[int, int] | None = None
    for folder in glob.glob(f"/sys/devices/system/cpu/cpu{_current_cpu()}/cache/index*"):
        try:
            with open(f"{folder}/level", encoding="utf-8") as handle:
                level = int(handle.read())
            with open(f"{folder}/size", encoding="utf-8") as handle:
                text = handle.read().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit() and (best is None or level > best[0]):
            best = (level, int(digits) * scale)
    if best is not None:
        return best[1]
    try:
        value = os.sysconf("SC_LEVEL3_CACHE_SIZE")
    except (ValueError, OSError):
        return None
    return value if value > 0 else None


_CPU_FLUSH_BUFFERS: dict[int, Any] = {}

# glibc serves a request above its mmap threshold with fresh pages (faulted in on first
# touch, returned on free) and raises the threshold to the last such block freed, so a
# kernel's page faults per call depended on what the process freed before (unchanged kernels
# timed 2x apart in half the sessions). The threshold fixed at its maximum (and the trim at
# twice it, glibc's ratio) serves every block up to 32 MiB from reused heap pages.
GLIBC_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


@functools.cache
def steady_allocator() -> str:
    """Fix glibc's mmap and trim thresholds for this process (once; see above) and say what
    was done: the note a CPU timing records, "" where the allocator is not glibc's."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
        version.restype = ctypes.c_char_p
        if libc.mallopt(_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD) and libc.mallopt(
            _M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_THRESHOLD
        ):
            return (
                f"glibc {version().decode()}: mmap threshold fixed at "
                f"{GLIBC_MMAP_THRESHOLD >> 20} MiB, trim at {GLIBC_MMAP_THRESHOLD >> 19} MiB"
            )
    except (OSError, AttributeError, ValueError):  # not glibc (musl, macOS, Windows)
        pass
    return ""


def cpu_flush_decision(budget: TimingBudget) -> tuple[int, str]:
    """(bytes to write before each CPU sample, why) for the budget's `cpu_flush` mode."""
    if not budget.flush_l2 or budget.cpu_flush == "off":
        return 0, "off" if budget.flush_l2 else "flush disabled"
    capped = ""
    if budget.flush_bytes is not None:
        nbytes = int(budget.flush_bytes)
    else:
        nbytes, capped = cpu_flush_bytes(), cpu_flush_cap_note()
    if budget.cpu_flush == "on":
        return nbytes, "on" + capped
    working = budget.working_set_bytes
    if working is not None and working > nbytes:
        return 0, (
            f"auto: the inputs ({working / 2**20:.0f} MiB) exceed the "
            f"{nbytes / 2**20:.0f} MiB a flush writes, so "
            + ("they come from memory anyway" if not capped else "no flush makes them cold")
        )
    return nbytes, "auto: the inputs fit in the cache" + capped


@dataclass
class CacheFlush:
    """The write before each sample that leaves no input in the caches (`nbytes` of a buffer
    kept for the process: page faults paid once), or a test's `flush` callable; `seconds`
    keeps each flush's time for the overrun note. The timer calls `write(next(fills))`: the
    buffer's C `fill` with a new byte value each time (no write is skipped), so a flush runs
    no Python frame; None when nothing is flushed."""

    nbytes: int
    flush: Callable[[], None] | None = None
    seconds: list[float] = field(default_factory=list)
    write: Callable[[int], object] | None = None
    fills: Iterator[int] = field(default_factory=lambda: itertools.cycle((*range(1, 256), 0)))

    def __post_init__(self) -> None:
        if not self.nbytes:
            return
        if self.flush is not None:
            test_flush = self.flush
            self.write = lambda _value: test_flush()
            return
        import numpy as np

        if self.nbytes not in _CPU_FLUSH_BUFFERS:
            _CPU_FLUSH_BUFFERS[self.nbytes] = np.ones(self.nbytes, dtype=np.uint8)
        self.write = _CPU_FLUSH_BUFFERS[self.nbytes].fill


bound.keep_module(sys.modules[__name__])
