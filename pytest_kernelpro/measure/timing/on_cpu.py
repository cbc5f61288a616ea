"""On-CPU time: what a CPU sample charges the kernel, and what it does not.

On a shared CPU a kernel's wall time is mostly other processes' (waiting on the run queue),
and the wall-clock median of the same code moves by tens of percent between two sessions
(bench/results/2026-12-02-cpu-gate-cpu.md). Two things fix that, as the GPU clock anchor
cancels the power cap (`anchor.py`):

1. **On-CPU time.** Each timed call is charged its wall time less the time its thread waited
   on the run queue while it ran (Linux's per-thread `schedstat`, read just outside the timed
   window), never less than the thread's CPU time: a preemption is not the kernel's time,
   while a kernel that sleeps, blocks or waits on another thread is still charged (it is not
   runnable then). Without `schedstat` the thread's CPU time is used.
2. **The anchors.** After each sample a fixed fp32 GEMM of `CPU_ANCHOR_N`^3 on seeded data runs
   twice, timed the same way, the faster kept (the first also brings its data back to the
   cache); then the memory anchor, a sum over `MEMORY_ANCHOR_BYTES` that the sample's cache
   flush evicted. The gate reads the kernel against them (`gate/verdict_basis.py`), and their
   own change and scatter as how far the machine moved: the host's steal and the clock slow
   the GEMM too; another process's memory traffic slows the memory anchor, not the GEMM.

The pairs go to `TimingResult.anchor` with the GPU anchor's keys (`name`, `ratios`,
`anchor_median_s`). Between the timed calls (refill and flush) and while the anchors run
nothing else of the process should use the CPU: `OtherThreads` refuses a kernel whose other
thread computes the next output outside the timed window, or works beside the anchors (it
would slow them, and a slowdown of the kernel would hide behind them). The anchors call
torch's C functions themselves, and a timing whose anchor buffers or calls changed is
refused (`anchors_changed`): the kernel is code of the same process (docs/cpu-gate.md).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.measure import bound

CPU_ANCHOR_N = 128  # the anchor: fp32 (N x N) @ (N x N), ~4 MFLOP, about 0.1 ms on one core
# The memory anchor's size: above any core's own cache, so that a shared cache's or the memory's
# speed sets its time (about 1 ms on one core). Its times are comparable only at one size: a
# new size needs a new key in the record and the baseline (`memory_s`, `cpu_memory_s`).
MEMORY_ANCHOR_BYTES = 8 * 2**20
CPU_LAYOUT = "cpu-pairs"  # each sample followed by the anchor, both in on-CPU time
_ANCHOR_SEED = 20261202
_ANCHOR_BUFFERS: dict[int, tuple[Any, Any, Any]] = {}  # by thread count: (a, b, out)
_MEMORY_BUFFER: list[Any] = []  # the memory anchor's data, made once per process


def cpu_anchor_name(torch: Any, threads: int | None) -> str:
    """The anchor's identity: ratios are comparable only under the same one (another torch
    build may pick another GEMM kernel; the thread count changes what it measures)."""
    return (
        f"cpu anchor: fp32 matmul {CPU_ANCHOR_N}x{CPU_ANCHOR_N}x{CPU_ANCHOR_N}, on-CPU time "
        f"(torch {torch.__version__}, {threads or 1} thread(s))"
    )


def cpu_anchor_launch(torch: Any) -> Callable[[], object]:
    """A zero-argument call of the anchor GEMM (buffers made once per process)."""
    threads = int(torch.get_num_threads())
    if threads not in _ANCHOR_BUFFERS:
        gen = torch.Generator().manual_seed(_ANCHOR_SEED)
        a = torch.randn(CPU_ANCHOR_N, CPU_ANCHOR_N, generator=gen)
        b = torch.randn(CPU_ANCHOR_N, CPU_ANCHOR_N, generator=gen)
        _ANCHOR_BUFFERS[threads] = (a, b, torch.empty_like(a))
    a, b, out = _ANCHOR_BUFFERS[threads]
    # C all the way, no Python frame: torch's own function, from its read-only table (a
    # kernel that rebinds `torch.mm` would slow the anchor, and hide its own slowdown).
    return functools.partial(torch._C._VariableFunctions.mm, a, b, out=out)


def memory_anchor_launch(torch: Any) -> Callable[[], object]:
    """A zero-argument call of the memory anchor: the sum of `MEMORY_ANCHOR_BYTES` of fp32."""
    if not _MEMORY_BUFFER:
        _MEMORY_BUFFER.append(torch.ones(MEMORY_ANCHOR_BYTES // 4))
    return functools.partial(torch._C._VariableFunctions.sum, _MEMORY_BUFFER[0])  # as the GEMM


class RunQueueClock:
    """Time this thread spent waiting on the run queue (ns), from its /proc `schedstat`
    ("on-CPU ns, run-queue wait ns, timeslices"), opened once and re-read with `pread`;
    `raw` is that read as one C call (the file's bytes), None when unavailable."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.raw: Callable[[], bytes] | None = None
        self.available = False  # whether the reads work (else on-CPU time is the thread's)
        try:
            tid = threading.get_native_id()
            self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            self.raw = functools.partial(bound.os_pread, self._fd, 128, 0)
            self.wait_ns()
            self.available = True
        except (OSError, ValueError, IndexError, AttributeError):
            self.close()

    def wait_ns(self) -> int:
        """Run-queue wait so far; 0 when unavailable (then on-CPU time is the thread's)."""
        if self.raw is None:
            return 0
        return int(self.raw().split()[1])

    def close(self) -> None:
        self.raw = None
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
            self.available = False


def on_cpu_seconds(wall_s: float, wait_ns: int, cpu_s: float, use_wait: bool) -> float:
    """Wall time less the run-queue wait, never below the thread's CPU time (the wait is read
    just outside the timed window, so it can include a little time the window did not). The
    rule of every timed call; the sample loop (`CpuSampler.take`) applies it inline."""
    if not use_wait:
        return cpu_s
    return max(wall_s - wait_ns * 1e-9, cpu_s, 1e-12)


@dataclass
class CpuPairs:
    """The (kernel, anchor) pairs in on-CPU time of the sampling rounds: while `recording`,
    the CPU timer's sample loop (`CpuSampler.take`, where the three timed calls of a sample
    run in one frame) charges each call by `on_cpu_seconds` and appends here."""

    anchor: Callable[[], object]
    name: str
    memory: Callable[[], object] | None = None  # the memory anchor (module docstring)
    threads: int = 1  # torch's: on one, the anchors are charged their thread's CPU time
    recording: bool = False
    kernel_s: list[float] = field(default_factory=list)  # on-CPU, per call
    kernel_wall_s: list[float] = field(default_factory=list)  # wall, per call
    anchor_s: list[float] = field(default_factory=list)  # on-CPU, per anchor call
    anchor_wall_s: list[float] = field(default_factory=list)
    memory_s: list[float] = field(default_factory=list)  # on-CPU, per memory anchor call
    added_s: float = 0.0  # wall time the anchors and the reads added
    rq: RunQueueClock = field(default_factory=RunQueueClock)
    # What runs after the kernel in each sample: the GEMM twice, then the memory anchor.
    after_kernel: tuple[Callable[[], object], ...] = field(init=False)

    def __post_init__(self) -> None:
        memory = () if self.memory is None else (self.memory,)
        self.after_kernel = (self.anchor, self.anchor, *memory)

    def ratios(self) -> list[float]:
        return pair_ratios(self.kernel_s, self.anchor_s)

    def summary(self) -> dict[str, Any]:
        """The `TimingResult.anchor` dict (see `summarize_cpu_pairs`)."""
        run_queue = self.rq.available
        self.rq.close()
        return summarize_cpu_pairs(
            self.name,
            self.kernel_s,
            self.anchor_s,
            kernel_wall_s=self.kernel_wall_s,
            anchor_wall_s=self.anchor_wall_s,
            memory_s=self.memory_s,
            run_queue=run_queue,
            added_s=self.added_s,
        )


def pair_ratios(kernel_s: Sequence[float], anchor_s: Sequence[float]) -> list[float]:
    """kernel / anchor per pair, pairs with a non-positive time left out (a loop: every
    sampling round asks)."""
    ratios: list[float] = []
    for k, a in zip(kernel_s, anchor_s, strict=True):
        if k > 0 and a > 0:
            ratios.append(k / a)
    return ratios


def summarize_cpu_pairs(
    name: str,
    kernel_s: Sequence[float],
    anchor_s: Sequence[float],
    *,
    kernel_wall_s: Sequence[float] = (),
    anchor_wall_s: Sequence[float] = (),
    memory_s: Sequence[float] = (),
    run_queue: bool = True,
    added_s: float = 0.0,
) -> dict[str, Any]:
    """The pairs as `TimingResult.anchor` keeps them: the GPU anchor's keys (name, ratios,
    anchor_median_s, kernel_median_s) plus the on-CPU kernel times, the memory anchor's (an
    empty list without it) and the share of the kernel's wall time that was run-queue wait
    (how much of it other processes took)."""
    # The kept pairs, in loops (no comprehension frames).
    kernels: list[float] = []
    anchors: list[float] = []
    ratios: list[float] = []
    for k, a in zip(kernel_s, anchor_s, strict=True):
        if k > 0 and a > 0:
            kernels.append(k)
            anchors.append(a)
            ratios.append(k / a)
    walls: list[float] = []
    for wall in kernel_wall_s:
        if wall > 0:
            walls.append(wall)
    waited = None
    if walls and len(walls) == len(kernel_s):
        total = sum(walls)
        waited = max(0.0, 1.0 - sum(kernel_s) / total) if total > 0 else None
    return {
        "name": name,
        "layout": CPU_LAYOUT,
        "time": "on-CPU (wall less run-queue wait)" if run_queue else "thread CPU time",
        "pairs": len(kernels),
        "anchor_s": anchors,
        "kernel_s": kernels,
        "ratios": ratios,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "kernel_median_s": statistics.median(kernels) if kernels else None,
        "anchor_median_s": statistics.median(anchors) if anchors else None,
        "anchor_wall_median_s": statistics.median(anchor_wall_s) if anchor_wall_s else None,
        "memory_s": [m for m in memory_s if m > 0],
        "run_queue_share": waited,
        "added_s": added_s,
    }


def cpu_pairs(budget: Any) -> CpuPairs | None:
    """The pairs collector of a CPU timing when `budget.clock_anchor` is "on" (the plugin's
    default), else None; the anchor's first call (its lazy initialisation) happens here."""
    if getattr(budget, "clock_anchor", "off") != "on":
        return None
    import torch

    launch, memory = cpu_anchor_launch(torch), memory_anchor_launch(torch)
    launch()
    memory()
    threads = int(torch.get_num_threads())
    return CpuPairs(
        anchor=launch, name=cpu_anchor_name(torch, threads), memory=memory, threads=threads
    )


def anchor_state(pairs: CpuPairs) -> tuple[object, ...]:
    """What the anchors run, to compare: each call's function and each tensor's address,
    shape, strides, dtype and contiguity. The buffers are the module's, found by any code of
    the process: a bigger or strided buffer (`set_`, a new one in the cache) slows the anchor
    the kernel is compared against, as the same factor of its own slowdown would hide."""
    state: list[object] = [id(pairs.after_kernel)]
    for call in pairs.after_kernel:
        assert isinstance(call, functools.partial)  # as `cpu_pairs` makes them
        state.append(id(call.func))
        for t in (*call.args, *call.keywords.values()):
            state.append((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.is_contiguous()))
    return tuple(state)


def anchors_changed(pairs: CpuPairs | None, made: tuple[object, ...]) -> str | None:
    """Why the anchors' calls are not as `cpu_pairs` made them (`made`: `anchor_state` then)
    or changed while the timing ran; None when they are and did not."""
    if pairs is None:
        return None
    now, fp32 = anchor_state(pairs), sys.modules["torch"].float32
    square = ((CPU_ANCHOR_N, CPU_ANCHOR_N), (CPU_ANCHOR_N, 1), fp32, True)  # a, b, out
    memory = ((MEMORY_ANCHOR_BYTES // 4,), (1,), fp32, True)
    layouts = [part[1:] for part in now if isinstance(part, tuple)]  # the GEMM twice
    if now == made and layouts == [square] * 6 + [memory]:
        return None
    return (
        "the CPU anchors' buffers or calls (pytest_kernelpro.measure.timing.on_cpu's cache) "
        "were replaced, re-pointed or resized: the anchors the kernel is compared against "
        "must be the timer's own. Leave the plugin's modules alone"
    )


# The gaps between timed calls (refill and flush; module docstring): with one torch thread
# (the default policy) other threads' CPU time there beyond this share of the kernel's own
# time (and `OTHER_THREADS_MIN_S`) refuses the timing. The process's own threads
# (pytest-xdist's channel reader, a logging handler) use a little CPU whatever the kernel
# does: up to `OTHER_THREADS_BACKGROUND` of the gaps' wall time is theirs; work moved out of
# the timed window keeps a thread busy for the whole gap, far above that rate.
# The anchors' window is gated apart, the kernel's time buying no allowance there (only the
# background rate and the floor): a thread woken as the call returns can slow the anchors
# (they always follow the call), and moving their speed (the gate reads their fastest
# quarter of calls) takes a busy thread beside three quarters of the samples' anchors.
OTHER_THREADS_SHARE = 0.5
OTHER_THREADS_MIN_S = 1e-3
OTHER_THREADS_BACKGROUND = 0.01


@dataclass
class OtherThreads:
    """CPU time of this process's other threads between timed calls (refill and flush) and
    while the anchors ran, as `CpuSampler.take` reads it around each window."""

    other_s: float = 0.0
    gap_s: float = 0.0
    kernel_s: float = 0.0
    anchors_other_s: float = 0.0  # their CPU while the anchors ran
    anchors_s: float = 0.0  # wall time of the anchors' windows

    def reset(self) -> None:
        """Count from here: the sampling rounds' gaps are gated, not the warm-up's (OpenMP
        workers may still spin there after the correctness trials' parallel regions)."""
        self.other_s = self.gap_s = self.kernel_s = 0.0
        self.anchors_other_s = self.anchors_s = 0.0

    def failure(self, threads: int | None) -> str | None:
        if (threads or 1) != 1:  # torch's own workers may spin after a parallel refill
            return None
        beside = self.anchors_other_s
        if beside > max(OTHER_THREADS_MIN_S, OTHER_THREADS_BACKGROUND * self.anchors_s):
            return (
                f"other threads of the process used {beside * 1e3:.1f} ms of CPU while the "
                f"CPU anchors ran after the timed calls "
                f"({self.anchors_s * 1e3:.1f} ms): a thread working as the call returns slows "
                "the anchors the kernel is compared against, and a slowdown of the kernel "
                "would hide behind them. Finish the work inside the call"
            )
        allowed = OTHER_THREADS_SHARE * self.kernel_s + OTHER_THREADS_BACKGROUND * self.gap_s
        if self.other_s <= max(OTHER_THREADS_MIN_S, allowed):
            return None
        return (
            f"other threads of the process used {self.other_s * 1e3:.1f} ms of CPU between "
            f"the timed calls (while inputs were refilled and the cache flushed, "
            f"{self.gap_s * 1e3:.1f} ms), against {self.kernel_s * 1e3:.1f} ms of timed calls: "
            "work done on another thread outside the timed window (a thread that computes "
            "the next output ahead) is not the kernel's time. Do the work inside the call"
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "other_threads_between_calls_s": round(self.other_s, 6),
            "other_threads_beside_anchors_s": round(self.anchors_other_s, 6),
        }


bound.keep_module(sys.modules[__name__])
