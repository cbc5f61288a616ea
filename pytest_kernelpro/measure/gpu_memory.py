"""GPU memory of one kernel item: its peak against the problem's own footprint, and cleanup.

The footprint is what the problem needs by itself: its inputs, the reference's parameters and
buffers, and the reference's peak above those while it runs (measured during the roofline
run). The item's peak is the caching allocator's peak above what was allocated when the item
started, less buffers the session keeps for every later item (the timing loop's L2 flush
buffer), kept per phase (`phase`: check, timing, re-check, roofline, profiling) so a record
above its budget says which step held the memory. After the item its memory goes back to
the driver (`torch.cuda.empty_cache`) for the next item and the profiler's processes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.measure.output_rule import leaves_of

GIB = 1024**3
LEAK_CHECK_BYTES = 256 * 1024**2  # more than this still allocated after an item: collect
RELEASE_BYTES = 512 * 1024**2  # more than this cached but unused after an item: release


def tensor_bytes_of(obj: Any) -> int:
    """Bytes of the tensors inside `obj` (nested lists/tuples/dicts), each storage once."""
    import torch

    seen: set[tuple[str, int]] = set()
    total = 0

    def walk(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            try:
                storage = value.untyped_storage()
                key = (str(value.device), storage.data_ptr())
                size = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                key, size = ("id", id(value)), value.numel() * value.element_size()
            if key not in seen:
                seen.add(key)
                total += int(size)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(obj)
    return total


def module_bytes(obj: Any) -> int:
    """Bytes of an nn.Module's parameters and buffers (0 for a plain callable)."""
    import torch

    if not isinstance(obj, torch.nn.Module):
        return 0
    return tensor_bytes_of([*obj.parameters(), *obj.buffers()])


# The truth's re-run (`correctness_check.run_truth`) needs free memory of this times the
# widened inputs, parameters and outputs.
TRUTH_HEADROOM = 2.0


def truth_shortfall(torch: Any, narrow: Any, device: str) -> str | None:
    """Why the truth's re-run would not fit in the device's free memory, or None; `narrow`:
    its inputs, output and reference (the module of a bound method), before widening."""
    total = 0
    for _, leaf in leaves_of(torch, narrow):
        if isinstance(leaf, torch.nn.Module):
            params = [*leaf.parameters(), *leaf.buffers()]
            total += sum(t.numel() * t.element_size() for t in params)
        elif isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
    needed = TRUTH_HEADROOM * 2.0 * total  # fp32 -> fp64 and bf16/fp16 -> fp32 double a tensor
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    available = free + max(0, cached)
    if needed <= available:
        return None
    return (
        f"not enough device memory: the re-run needs about {needed / 2**30:.1f} GiB "
        f"({TRUTH_HEADROOM:g}x the widened inputs, parameters and outputs), "
        f"{available / 2**30:.1f} GiB free"
    )


def format_bytes(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    if value >= 1024**2:
        return f"{value / 1024**2:.1f} MiB"
    return f"{value / 1024:.1f} KiB"


@dataclass
class ItemMemory:
    """Tracks one item's GPU memory (a no-op on the CPU)."""

    device: str
    active: bool = False
    base_allocated: int = 0
    kept_at_start: int = 0
    total_bytes: int | None = None
    free_at_start: int | None = None
    peak_seen: int = 0
    inputs_bytes: int | None = None
    params_bytes: int | None = None
    reference_peak_bytes: int | None = None
    current_phase: str = "setup"
    phase_peaks: dict[str, int] = field(default_factory=dict)  # absolute allocator peaks

    def start(self) -> None:
        if not self.device.startswith("cuda"):
            return
        import torch

        if not torch.cuda.is_available():
            return
        self.active = True
        torch.cuda.synchronize(self.device)
        self.base_allocated = torch.cuda.memory_allocated(self.device)
        self.kept_at_start = _session_buffers_bytes()
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            self.free_at_start, self.total_bytes = torch.cuda.mem_get_info(self.device)
        except RuntimeError:
            pass

    def _peak_now(self) -> int:
        import torch

        peak = torch.cuda.max_memory_allocated(self.device)
        self.peak_seen = max(self.peak_seen, peak)
        name = self.current_phase
        self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), peak)
        return self.peak_seen

    def phase(self, name: str) -> None:
        """The item enters phase `name`: the allocator's peak so far is the last phase's, and
        the peak counter restarts from what is allocated now."""
        if not self.active:
            return
        import torch

        torch.cuda.synchronize(self.device)
        self._peak_now()
        self.current_phase = name
        torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def reference_run(self) -> Iterator[None]:
        """Measure the reference's peak above what is allocated when the block starts."""
        if not self.active:
            yield
            return
        import torch

        torch.cuda.synchronize(self.device)
        self._peak_now()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.reference_peak_bytes = max(0, peak - before)
            self._peak_now()

    @property
    def footprint_bytes(self) -> int | None:
        parts = (self.inputs_bytes, self.params_bytes, self.reference_peak_bytes)
        if any(p is None for p in parts):
            return None
        return sum(int(p) for p in parts if p is not None)

    def finish(self) -> dict[str, Any] | None:
        """The item's memory facts for its record; releases what the item left cached."""
        if not self.active:
            return None
        import torch

        torch.cuda.synchronize(self.device)
        kept = _session_buffers_bytes() - self.kept_at_start
        base = self.base_allocated + kept  # the session's own buffers are not the item's
        peak = max(0, self._peak_now() - base)
        footprint = self.footprint_bytes
        released = release_cached(self.device, base)
        return {
            "peak_bytes": peak,
            "peak_bytes_by_phase": {k: max(0, v - base) for k, v in self.phase_peaks.items()},
            "footprint_bytes": footprint,
            "peak_over_footprint": (peak / footprint) if footprint else None,
            "inputs_bytes": self.inputs_bytes,
            "params_bytes": self.params_bytes,
            "reference_peak_bytes": self.reference_peak_bytes,
            "session_buffers_bytes": kept,
            "total_bytes": self.total_bytes,
            "free_at_start_bytes": self.free_at_start,
            "left_allocated_bytes": torch.cuda.memory_allocated(self.device) - base,
            "released_bytes": released,
        }

    def oom_message(self, name: str, error: BaseException) -> str:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        parts = [f"inputs {format_bytes(self.inputs_bytes)}"]
        parts.append(f"reference parameters and buffers {format_bytes(self.params_bytes)}")
        if self.reference_peak_bytes is not None:
            parts.append(f"reference peak above those {format_bytes(self.reference_peak_bytes)}")
        gpu = (
            f"the GPU has {format_bytes(self.total_bytes)}, {format_bytes(self.free_at_start)} "
            "free when this item started"
        )
        return (
            f"{name} does not fit in GPU memory: {first[:300]}. The problem needs "
            f"{', '.join(parts)}; {gpu}. The check holds the inputs, one copy for the kernel, "
            "the reference's and the kernel's outputs at once: make the problem smaller or run "
            "it on a GPU with more memory"
        )


def _session_buffers_bytes() -> int:
    from pytest_kernelpro.measure.timing.anchor import anchor_buffers_bytes
    from pytest_kernelpro.measure.timing.cuda import flush_buffers_bytes

    return flush_buffers_bytes() + anchor_buffers_bytes()


def is_out_of_memory(exc: BaseException | None) -> BaseException | None:
    """The CUDA out-of-memory error in `exc`'s chain (cause or context), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def release_cached(device: str, keep_allocated: int) -> int:
    """Collect garbage if the item left memory allocated, and give cached blocks back."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_initialized():
        return 0
    if torch.cuda.memory_allocated(device) > keep_allocated + LEAK_CHECK_BYTES:
        gc.collect()  # reference cycles (a module holding itself, a traceback) keep tensors
    reserved = torch.cuda.memory_reserved(device)
    if reserved - torch.cuda.memory_allocated(device) > RELEASE_BYTES:
        torch.cuda.empty_cache()
        return max(0, reserved - torch.cuda.memory_reserved(device))
    return 0


def memory_state(device: str) -> dict[str, int] | None:
    """This process's view of the GPU's memory now: free and total on the device (all
    processes), allocated and reserved by this process's caching allocator; None off CUDA."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_initialized():
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
    except RuntimeError:
        return None
    return {
        "free_bytes": int(free),
        "total_bytes": int(total),
        "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "reserved_bytes": int(torch.cuda.memory_reserved(device)),
    }
