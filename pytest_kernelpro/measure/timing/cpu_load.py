"""The CPU as a timing finds it: its name, the cores it may use, the load of the machine over
the sampling, and the thread policy of CPU timing.

When other processes (or the hypervisor, as steal time) take cores the kernel's threads need,
a parallel region waits whole scheduler slices for a descheduled thread: such numbers are not
the kernel's, so the timing is marked "suspect" (reported, never failed) instead of gated.
Measured over exactly the timed interval: other processes' CPU use (the machine's busy time
from `/proc/stat`, steal included, less this process's `os.times`, per wall second, capped at
the machine's cores: both counters tick at 100 Hz), the load average and runnable threads at
the end (they include this process: they describe, never decide), and the kernel's threads
against the cores this process may use. The interval is oversubscribed when the threads
exceed the cores available, or the cores the other processes left free by more than
`OVERSUBSCRIBED_SLACK` of a thread each, or when other processes used more than
`SHARED_SHARE` of the cores (memory bandwidth and the last-level cache are shared too).

Thread policy (`kernelpro_cpu_threads`): `auto`, the default, is ONE torch intra-op thread, N
is N threads (at most the cores this process may use, or the timing is oversubscribed). One
by default because a parallel region waits for its slowest thread: beside one busy process on
two cores a softmax ran 60x slower at two threads than at one
(bench/results/2026-12-01-cpu-threads-cpu.md); give N to time multi-threaded CPU code. The
count is part of the device name ("cpu (AMD EPYC, 1 thread)"), so timings with different
counts are never compared as one machine's, and ceilings are cached per count.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from pytest_kernelpro.measure import bound


@functools.cache
def cpu_model_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else `platform.processor()` (read once
    a process: the timer, the ceilings and their machine identity each ask)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


OVERSUBSCRIBED_SLACK = 0.10  # threads may lose this fraction of a core each before it counts
SHARED_SHARE = 0.25  # other processes using more than this share of all cores: not quiet
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (idle=3, iowait=4)


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def online_cpus() -> int:
    """CPUs of the machine (what /proc/stat's busy time is spread over)."""
    return max(1, os.cpu_count() or 1)


def torch_threads() -> int | None:
    """torch's intra-op thread count when torch is imported, else None (nothing to ask)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return int(torch.get_num_threads())
    except Exception:  # a half-initialised torch: report nothing rather than guess
        return None


def policy_threads(requested: int | None) -> int:
    """The thread count CPU kernels are timed with (module docstring): `requested`, the
    `cpu_threads` setting, or one (None or 0: auto)."""
    return int(requested) if requested else 1


def _machine_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (None without /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            first = handle.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        ticks = list(map(int, first[1:]))
        busy = 0
        for field in _BUSY_FIELDS:  # a loop, no comprehension: one call less a reading
            if field < len(ticks):
                busy += ticks[field]
    except ValueError:
        return None
    return busy / float(os.sysconf("SC_CLK_TCK"))


def _runnable_threads() -> int | None:
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _self_cpu_s() -> float:
    times = os.times()
    return float(times.user + times.system)


@dataclass(frozen=True)
class CpuLoad:
    """The CPU's state over one timed interval (see the module docstring)."""

    cores: int  # CPUs this process may run on
    cpus: int  # CPUs of the machine
    threads: int  # threads the timed work ran with
    others_cores: float | None  # average cores used by other processes (None: unknown)
    loadavg_1m: float | None
    runnable_threads: int | None  # at the end, this process's running threads included
    wall_s: float

    @property
    def others_capped(self) -> float | None:
        """Other processes' cores within [0, cpus] (see the module docstring); records
        written before the cap may hold more."""
        if self.others_cores is None:
            return None
        return min(max(0.0, self.others_cores), float(self.cpus))

    @property
    def free_cores(self) -> float | None:
        others = self.others_capped
        if others is None:
            return None
        return max(0.0, self.cpus - others)

    @property
    def oversubscribed(self) -> bool:
        return bool(self.reasons())

    def reasons(self) -> list[str]:
        """Why the interval is oversubscribed; empty when it is not."""
        out = []
        if self.threads > self.cores:
            out.append(
                f"{self.threads} threads on {self.cores} available core(s) "
                "(set --kernelpro-cpu-threads to at most the cores)"
            )
        free, others = self.free_cores, self.others_capped
        if free is not None and others is not None:
            starved = self.threads > free + OVERSUBSCRIBED_SLACK * self.threads
            if starved or others > SHARED_SHARE * self.cpus:
                used = (
                    f"all {self.cpus}"
                    if others >= self.cpus - 0.05
                    else (f"{others:.1f} of {self.cpus}")
                )
                out.append(
                    f"other processes used {used} core(s) while {self.threads} thread(s) were timed"
                )
        return out

    def describe(self) -> str:
        """One line for the summary: the load and the reasons."""
        parts = []
        if self.loadavg_1m is not None:
            parts.append(f"load average {self.loadavg_1m:.1f} on {self.cpus} CPU(s)")
        if self.runnable_threads is not None:
            parts.append(f"{self.runnable_threads} runnable thread(s)")
        return "; ".join([*self.reasons(), *parts])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["oversubscribed"] = self.oversubscribed
        data["reasons"] = self.reasons()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CpuLoad:
        names = ("cores", "cpus", "threads", "others_cores", "loadavg_1m", "runnable_threads")
        return cls(**{k: data.get(k) for k in names}, wall_s=float(data.get("wall_s") or 0.0))


class CpuLoadMonitor:
    """Measure other processes' CPU use between `start()` (the constructor) and `stop()`."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._wall0 = time.perf_counter()
        self._busy0 = _machine_busy_s()
        self._self0 = _self_cpu_s()

    def stop(self) -> CpuLoad:
        wall = time.perf_counter() - self._wall0
        busy = _machine_busy_s()
        others = None
        if busy is not None and self._busy0 is not None and wall > 0:
            own = _self_cpu_s() - self._self0
            others = max(0.0, ((busy - self._busy0) - own) / wall)
            others = min(others, float(online_cpus()))  # tick rounding (module docstring)
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = None
        return CpuLoad(
            cores=available_cores(),
            cpus=online_cpus(),
            threads=self.threads,
            others_cores=None if others is None else round(others, 3),
            loadavg_1m=load,
            runnable_threads=_runnable_threads(),
            wall_s=wall,
        )


bound.keep_module(sys.modules[__name__])
