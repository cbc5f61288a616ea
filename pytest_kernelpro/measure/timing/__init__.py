"""Time one kernel: warm-up, cache flush before every sample, adaptive sample count.

One interface, `Timer.time(fn, budget, fresh) -> TimingResult` (`budget.py`), a timer per
device (`cpu.py`, `cuda.py`); `time_kernel` picks the device's (`timer_for`) for the gate, the
optimizer's sandbox and the re-measurement.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from pytest_kernelpro.measure import bound
from pytest_kernelpro.measure.timing.budget import Timer, TimingBudget, TimingResult, parse_device
from pytest_kernelpro.measure.timing.cpu import CpuTimer
from pytest_kernelpro.measure.timing.fresh_inputs import (
    KEPT_CHANGED,
    DishonestTiming,
    FreshInputs,
    kept_content,
    kept_content_changed,
    verify_bindings,
)


def timer_for(device: str) -> Timer:
    """The timer of `device` ("cpu", "cuda", "cuda:<index>"); the CUDA one needs torch."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return CpuTimer()
    from pytest_kernelpro.measure.timing.cuda import CudaTimer

    return CudaTimer(index)


def time_kernel(
    fn: Callable[[], object],
    *,
    device: str,
    budget: TimingBudget | None = None,
    fresh: FreshInputs | None = None,
) -> TimingResult:
    """Time `fn()` (a kernel launch on pre-built inputs) on `device` and summarize; with
    `fresh` (`fresh_inputs.fresh_inputs`), its call on inputs refilled before every sample,
    outputs checked; a rebound binding is refused or put back by `measure.bound`'s rule.

    Raises `KernelproError` (the original chained) if `fn` raises, CUDA is unavailable or
    graph capture fails; `DishonestTiming` when a call did less than its work."""
    budget = budget or TimingBudget()
    if bound.binding_failure("before this kernel's timing") is not None:
        bound.restore()  # another module's patch: this kernel is timed on the originals
    kernel = fresh.kernel if fresh is not None else fn
    own = bound.kernel_is_patcher(kernel)
    if own is not None:
        raise DishonestTiming(
            f"{own}: no kernel of a module that rebinds a clock, serializer or timing "
            "function is timed (any code of that module can profit from the patch, so its "
            "numbers could be anything); remove the patch, or keep this kernel in a module "
            "that patches nothing"
        )
    # The mix's kept content, fingerprinted in this frame (fresh_inputs.kept_content).
    kept_seed = int.from_bytes(bound.os_urandom(8), "little") & (2**63 - 1)
    kept = kept_content(fresh, kept_seed) if fresh is not None else ()
    try:
        result = timer_for(device).time(fn, budget, fresh)
    except Exception as exc:
        # A kept function the kernel rebound can make the timer itself raise (`os.urandom`
        # returning a float breaks the check decision) before its next verification: the
        # rebinding is the reason, named as such, not the error it caused.
        failure = bound.binding_failure("while the kernel was timed")
        if failure is None:
            raise
        bound.restore()
        raise DishonestTiming(failure) from exc
    verify_bindings()
    if fresh is not None and kept_content_changed(fresh, kept_seed, kept):
        raise DishonestTiming(KEPT_CHANGED + " (while it was timed)")
    return result


__all__ = ["DishonestTiming", "TimingBudget", "TimingResult", "time_kernel", "timer_for"]

bound.keep_module(sys.modules[__name__])
