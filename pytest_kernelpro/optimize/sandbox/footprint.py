"""Does one evaluation of a problem fit this machine? Decided before any worker starts.

A problem's footprint is the bytes of one call: its inputs (I) plus its output (O). Both are
found without allocating them: the problem's own `get_inputs()` and `Model` run on torch's
`meta` device (shapes and dtypes, no storage), in the session, before the first evaluation.

Every copy one evaluation holds at its peaks, counted in I and O. The judge runs beside the
worker and checks each output as it is handed over, while the worker waits holding nothing
of that call (`worker_claims.JudgeBeside`, `handles.Relay`) but the next call's inputs,
drawn meanwhile (`harness._Pipeline.await_judge`): the session holds one checked output at a
time, and the two processes' large copies overlap by that one input set only. The judge
decides every output it is handed and says why it refused one; the worker makes no
comparison, and on the CPU no reference output, for those calls. The float64 truth is
made once, by the judge, before any output exists: the worker waits for its numbers before
its first call (`handles.await_truth`, `measurement.take_truth`) and makes no truth of its
own. The watchdog's limit is per process (`supervise.py`): the worker's resident memory plus
the outputs it handed over and the judge has not checked yet, and the judge's own; their
sum is reported (`both_peak_mb`, and where it was, `both_peak_at`) and is what the table
counts. A copy the rules need is marked with the rule; what they do not need was removed
(the right column says what changed).

| where | held at that moment | copies | rule / what changed |
|---|---|---|---|
| judge, the truth of the first output (the worker waits for it, holding no input or output) | its draw of the first call's inputs and the reference's call on a copy (2I + O); the float64 re-run (widened inputs 2I, output 2O); the reference's output goes before the re-run and is made again from the seed after it (`run_truth`'s `remake`), unless it is kept (below); then reference - truth in float32 beside the re-run's output | 2I + O, 3I while widening, 2I + 2O, I + 3O, then 4O | the correctness rule's truth (`measure.output_rule`), found on the first checked call's inputs, in a process the candidate never ran in; made before that call's output is handed over (`judge.judge`'s `tell_truth`), so no handed-over output is held beside it (was 2I + 4O, and the worker's own truth, 2I + 3O, in its turn); the re-run beside the reference's output was 2I + 3O, and so it stayed on CUDA until the GPU's measured peaks (bench/results/2026-12-06-device-calls6.md) |
| worker, trial 1 (the judge holds reference - truth) | sealed inputs (one read-only set, `input_handles.py`; on CUDA the inputs themselves, their digest compared after the call); on the CPU the candidate's call only where the judge decides the call (`harness._Pipeline.judge_decides`), else a reference call on a copy whose output goes where the judge did not say whether it writes or aliases its inputs, then the candidate's call, then the reference's output (`harness._Pipeline.candidate_first`); on CUDA the reference first, its output beside the candidate's call and the copy of the candidate's output taken on its stream (`harness._Pipeline.run_candidate`) | CPU: 2I + O, I + O and the candidate's temporaries, I + 2O; CUDA: I + 3O | the first call decided in the worker by the truth calibrated (`measurement.take_truth`), in the judge by the truth itself; the judge keeps the reference's output as its digest and makes it again for the comparison (`judge._Reference.output_again`: the same bytes, else its truth is found again); was 2I + 3O, then I + 4O; on CUDA a copy of the inputs for the candidate and the judge's kept output made it 2I + 3O and I + 5O |
| judge, trial 1's output (the worker waits) | the handed-over output, the reference's output (made again: its inputs while it runs), reference - truth | 3O (I + 3O while it is made again) | the first output compared with the truth (`CorrectnessRule.judge`) |
| worker, trials 2-3, in-place, shape | sealed inputs (in-place: the maker's tensors refilled), the reference's output (on the CPU only for the second shape, which no judge checks, or where no judge is beside the worker; on CUDA for the candidate's pre-poisoned blocks), the candidate's output and its handed-over copy, compare chunks; on the CPU trials 2-3 and the call after timing run the candidate first (no reference output beside its temporaries); the inputs are dropped before the copy is handed over (the judge starts on it at once) | CPU, judged: I + O and the candidate's temporaries; otherwise I + 2O (was I + 3O) | earlier outputs kept as digests for the cache check (`checks.digest`), not as outputs; an output bit-identical to the reference's skips the rule's passes (`measurement.identical_reports`); bitwise checks compare chunk by chunk (`checks.same_values`) |
| judge, later outputs (the worker draws the next call's inputs meanwhile) | its inputs, the reference's output, the handed-over output; the worker's next inputs | I + 2O, and the worker's I: 2I + 2O together | each dropped before the next is asked for (`handles.stream_outputs`); the worker's draw was on the critical path, after the judge's word |
| worker, timing (the candidate only) | the timed inputs, the mix's first end (its second is the first rolled, views made per chunk), its pools of one byte a weight (`measure.timing.fresh_inputs`: a quarter of float32 inputs, half of 16-bit ones, all of 8-bit ones), the call's output while it runs; at a checked call the output's copy and the reference's output on the call's content, rebuilt into the timed inputs | 2.25I + 2O (2.5I for 16-bit inputs, 3I for 8-bit) | new content every timed call and checks no kernel can predict; the reference is timed by the judge only (its time is the speedup's; the worker's was a claim nothing decided by) |
| judge, the reference's timing (the worker has ended) | as the worker's timing | 2.25I + 2O | the reference timed by the candidate's protocol |
| worker and judge | the interpreter, torch, the freed heap the allocator keeps, a CPU comparison chunk | `FIXED_BYTES` | two interpreters (the judge is started with the worker); comparisons in chunks (`measure.output_rule.chunk_ranges`: on the CPU at most 2^20 elements) |

Comparison temporaries on a GPU (chunks of at most a 32nd of the output) and the
allocator's rounding: `TEMPORARIES` of O. The estimate takes the table's copies and a
two fifths more (`HEADROOM`: the measured peaks passed the table by up to 28%).

So the peak is the largest of the worker's timing, the judge's truth and the worker's first
call: 3I + 2O (2.25I + 2O for float32 inputs), 2I + 3O, 3I + O, I + 4O or 4O (for a
softmax, where I = O, the timing: 4.25 copies for float32 inputs; the judge's 4O where the
output is more than twice the inputs). `estimate` gives it for the problem's own I and O,
the timing's inputs still counted at 4I whatever their width, as before the mix's second end
was rolled instead of kept (an estimate that refuses should err high).

The first output's reference: made again from its seed after the truth's re-run and again
when the first output comes (the table's rows: two draws of the first inputs, two reference
calls and two digests of an output), so that the judge holds one output fewer at both
moments. On the CPU, where one more output still fits within 3x the footprint with the
interpreters (`Footprint.room_for_kept_reference`: large problems, where the fixed part is a
small share), the judge keeps it instead (a CPU draw of a large input takes seconds): 2I + 3O
at its truth, I + 4O beside the worker's first call, both already counted by `estimate`. On
a GPU a draw and a call take milliseconds: it is always made again.

Where the copies live. On the CPU every copy above is in host memory. On a CUDA problem
(`Footprint.device`) they are in the GPU's memory: the worker and the judge run on one
device, and each gives the blocks torch's allocator keeps cached back before the other works
(`handles.release_freed_heap`), so their copies take turns there as on the host. What
crosses to the host is each handed-over output, copied once from the device into a sealed
memfd that the judge maps, one at a time (`HOST_OF_CUDA`: 1 O); the digests of earlier
outputs read 4 MiB at a time (`checks.digest`) and the bitwise checks compare on the device
(`checks.same_values`). So a CUDA problem has two estimates: `device_estimate` (the table's
copies and the worker's and the judge's CUDA contexts) against the GPU's free memory, read
in the session (`torch.cuda.mem_get_info`), and `estimate` (one output and the two
interpreters with the CUDA libraries) against the sandbox's host limit.

When either passes its bound (`SandboxLimits.memory_limit_mb`, where the watchdog would
kill the worker; the GPU's free memory, where the allocator would fail) the evaluation is
refused up front with both numbers and which memory does not fit, instead of every
candidate dying "out of memory". Held to it by `tests/optimize/search/test_evaluation_memory.py`
(an evaluation's measured peak above a tiny problem's stays within `estimate`), measured in
`bench/results/2026-12-05-optimizer-memory7-cpu.md` (the watchdog's `both_peak_at` says
which moment was the peak and each process's part of it).

Below 3x the footprint (with the two interpreters, about a quarter of a 1 GiB softmax's
footprint): the fresh-inputs mix (`measure.timing.fresh_inputs`) keeps the timed inputs, its
first end (2I; the second end is the first rolled) and the pools beside a checked call's
output copy and reference output (2.1 footprints for a float32 softmax). The correctness phase on the CPU holds at most 4 of I and O in both
processes together (the worker's I + 2O beside the judge's reference - truth; the judge's
re-run 2I + 2O beside the waiting worker).

A problem the meta device cannot run (an op without a meta kernel, inputs made with numpy)
has no estimate: it is evaluated, and the watchdog still bounds it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.errors import KernelproError


@dataclass(frozen=True)
class Peak:
    """Copies of one call's inputs and of its output one process holds at one moment."""

    inputs: float
    outputs: float
    where: str

    def bytes_for(self, inputs: int, outputs: int) -> float:
        return self.inputs * inputs + (self.outputs + TEMPORARIES) * outputs


# The evaluation's peaks (module doc): whichever holds more for the problem's I and O. On a
# CUDA problem these copies are in device memory.
WORKER_TIMING = Peak(4, 2, "the worker's timing phase")  # a re-measurement worker's too
PEAKS = (
    WORKER_TIMING,
    Peak(2, 3, "the judge's truth for the first output"),
    Peak(3, 1, "the judge's first inputs widened for its truth"),
    Peak(1, 4, "the worker's first call beside the judge's truth"),
    Peak(0, 4, "the judge's truth measured against the first output's reference"),
)
# The judge's first output's reference kept from the truth's call to the first comparison,
# on the CPU (module doc): one output more beside the truth's re-run (2I + 3O) and beside the
# worker's first call (the worker's I + 2O or 2I + O, the judge's reference and
# reference - truth), for two draws of the first inputs and two reference calls fewer. Both
# are already among `PEAKS`: keeping it never raises the estimate, only the measured peak.
KEPT_REFERENCE_PEAKS = (PEAKS[1], PEAKS[3])
# Kept only where those copies and `FIXED_BYTES` stay within this many footprints (the
# issue's bound on one evaluation's peak): a 16384x32768 float32 softmax keeps it (5.25 of its
# 2 GiB copies and 0.9 GiB fixed, 11.4 of 12 GiB), a 4096x32768 one does not (3.5 of 3 GiB),
# nor does a small problem, where the interpreters are most of the peak.
KEPT_REFERENCE_BOUND = 3
# What a CUDA problem's evaluation holds in host memory besides the interpreters: the
# handed-over output being checked, copied once from the device into a sealed memfd (the
# judge maps the same pages), one at a time (module doc).
HOST_OF_CUDA = Peak(0, 1, "the handed-over output being checked, copied from the GPU")
TEMPORARIES = 0.25  # comparison chunks on a GPU and the allocator's rounding, of the output
# The table's copies and two fifths more: with the judge beside the worker, the measured peaks
# of a 1 GiB problem, less the two interpreters, passed the table's copies by up to 28%
# (bench/results/2026-12-05-optimizer-memory2-cpu.md); the watchdog samples, and an estimate
# that refuses should err high, not low. Applied to the device's copies too (not measured
# there yet: the GPU issue's run of this path does).
HEADROOM = 1.4
MiB = 2**20
GiB = 2**30
# The part of one process's memory that does not grow with the problem: the interpreter and
# torch (a 16x64 softmax's worker peaked at 246-305 MB), the freed heap glibc keeps (its
# trim threshold is 64 MiB, `measure.timing.cpu.steady_allocator`, and fragments add
# to it: a 64 MiB problem's peak moved by 70 MiB between runs) and a comparison chunk's
# temporaries on the CPU (`measure.output_rule.CPU_COMPARE_CHUNK` elements, about 30 bytes
# each).
INTERPRETER_BYTES = 384 * MiB
HEAP_SLACK_BYTES = 128 * MiB
CHUNK_BYTES = 32 * MiB
PROCESSES = 2  # the worker and the judge beside it, each with its interpreter and torch
FIXED_BYTES = PROCESSES * INTERPRETER_BYTES + HEAP_SLACK_BYTES + CHUNK_BYTES
# With CUDA each process also loads the CUDA libraries into host memory and makes a context
# (and cuBLAS's workspace) on the device. Set high, not measured on a GPU here: the GPU
# issue's run of this path measures both.
CUDA_LIBRARIES_BYTES = 1 * GiB  # host, per process
CUDA_CONTEXT_BYTES = 1 * GiB  # device, per process
CUDA_HOST_FIXED_BYTES = FIXED_BYTES + PROCESSES * CUDA_LIBRARIES_BYTES
CUDA_DEVICE_FIXED_BYTES = PROCESSES * CUDA_CONTEXT_BYTES


@dataclass(frozen=True)
class Footprint:
    """One call's inputs and output in bytes on the problem's `device` ("cpu" or "cuda"),
    and what one evaluation holds at its peak in host memory and, for CUDA, device memory."""

    inputs: int
    outputs: int
    device: str = "cpu"

    @property
    def total(self) -> int:
        return self.inputs + self.outputs

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def peak(self) -> Peak:
        """The copies one evaluation holds at its peak (in device memory for CUDA)."""
        return max(PEAKS, key=lambda p: p.bytes_for(self.inputs, self.outputs))

    def host_peak(self) -> Peak:
        """The copies one evaluation holds in host memory at its peak."""
        return HOST_OF_CUDA if self.cuda else self.peak()

    def estimate(self) -> int:
        """Host bytes one evaluation holds at its peak, the fixed part included."""
        copies = HEADROOM * self.host_peak().bytes_for(self.inputs, self.outputs)
        return int(copies) + (CUDA_HOST_FIXED_BYTES if self.cuda else FIXED_BYTES)

    def room_for_kept_reference(self) -> bool:
        """Whether the judge keeps the first output's reference on the CPU instead of making
        it again from its seed (module doc, `judge._Reference.keeps_reference`): where the
        correctness phase's copies with it kept (`KEPT_REFERENCE_PEAKS`) and the fixed part
        stay within `KEPT_REFERENCE_BOUND` footprints."""
        held = max(p.bytes_for(self.inputs, self.outputs) for p in KEPT_REFERENCE_PEAKS)
        return held + FIXED_BYTES <= KEPT_REFERENCE_BOUND * self.total

    def device_estimate(self) -> int | None:
        """Device bytes one evaluation holds at its peak (the worker and the judge on one
        GPU, their contexts included); None for a CPU problem."""
        if not self.cuda:
            return None
        copies = HEADROOM * self.peak().bytes_for(self.inputs, self.outputs)
        return int(copies) + CUDA_DEVICE_FIXED_BYTES


def meta_footprint(reference_source: str, device: str = "cpu") -> Footprint | None:
    """Bytes of one call's inputs and output of a KernelBench reference on `device`, found on
    the meta device; None when the reference cannot run there."""
    import torch

    from pytest_kernelpro.optimize.sandbox.checks import flatten
    from pytest_kernelpro.optimize.sandbox.loader import load_source

    name = "kernelpro_footprint_reference"
    try:
        module = load_source(reference_source, name)
        with torch.device("meta"), torch.no_grad():
            inputs = list(module.get_inputs())
            init = list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
            output = module.Model(*init)(*inputs)
    except Exception:
        return None
    finally:
        sys.modules.pop(name, None)

    return Footprint(
        tensor_bytes(torch, flatten(inputs)), tensor_bytes(torch, flatten(output)), device
    )


def tensor_bytes(torch: Any, leaves: Sequence[Any]) -> int:
    """Bytes of the tensors among `leaves` (flattened inputs or outputs; other values hold none)."""
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _copies(peak: Peak) -> str:
    return (
        f"{peak.where}: {peak.inputs:g} copies of the inputs and "
        f"{peak.outputs + TEMPORARIES:g} of the output, two fifths more for what the table misses"
    )


def refusal(
    task_name: str,
    footprint: Footprint,
    limit_mb: int | None,
    device_memory: tuple[int, int] | None = None,
) -> KernelproError | None:
    """The error that refuses a problem whose evaluation cannot fit, else None: its host
    estimate against `limit_mb` (the sandbox's memory limit), and for a CUDA problem its
    device estimate against `device_memory` ((free, total) bytes of its GPU, None: not known)."""
    if footprint.total <= 0:
        return None
    where = "on the GPU" if footprint.cuda else "in host memory"
    call = (
        f"The problem {task_name!r} is too large for the optimizer on this machine: one "
        f"call's inputs take {_gib(footprint.inputs)} and its output {_gib(footprint.outputs)} "
        f"({where}); "
    )
    device_needed = footprint.device_estimate()
    if device_needed is not None and device_memory is not None:
        free, total = device_memory
        if device_needed > free:
            return KernelproError(
                call + f"one evaluation holds up to {_gib(device_needed)} of device memory at "
                f"its peak ({_copies(footprint.peak())}, and "
                f"{_gib(CUDA_DEVICE_FIXED_BYTES)} for the CUDA contexts of the worker and the "
                f"judge beside it) and its GPU has {_gib(free)} free of {_gib(total)} "
                "(torch.cuda.mem_get_info, read in the session). Optimize it at a smaller shape "
                f"(its get_inputs), or on a GPU with at least {_gib(device_needed)} free."
            )
    needed = footprint.estimate()
    if not limit_mb or needed <= limit_mb * MiB:
        return None
    fixed = CUDA_HOST_FIXED_BYTES if footprint.cuda else FIXED_BYTES
    with_cuda = ", the CUDA libraries" if footprint.cuda else ""
    return KernelproError(
        call + f"one evaluation holds up to {_gib(needed)} of host memory at its peak "
        f"({_copies(footprint.host_peak())}, and {_gib(fixed)} for the interpreters, torch"
        f"{with_cuda} and the allocator of the worker and the judge beside it) and the "
        f"sandbox's memory limit is {_gib(limit_mb * MiB)} (SandboxLimits.memory_limit_mb, "
        "half the machine's memory by default). Optimize it at a smaller shape (its "
        f"get_inputs), or on a machine with at least {needed / GiB * 2:.0f} GiB of memory."
    )


def session_device(requested: str) -> str:
    """The device a task's workers run on ("auto": CUDA when this process sees a GPU), as
    they resolve it (`harness._Pipeline`)."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes of `device`'s GPU as the session sees it, None when it sees none.

    The session's caching allocator is emptied first: the blocks it keeps from the gate's own
    run of the item are free for the evaluation's processes (the session allocates nothing
    while they run), but the driver counts them as taken until they are given back; a
    session that had just timed a 12 GiB problem read tens of GiB less than it could give."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(total)


def check_fits(
    task_name: str,
    reference_source: str,
    limit_mb: int | None,
    device: str = "cpu",
    device_memory: Callable[[str], tuple[int, int] | None] = cuda_memory,
) -> dict[str, Any]:
    """Raise the refusal for a problem that cannot fit; else what was found (for metrics).
    `device`: the task's ("auto" resolved here); `device_memory`: (free, total) bytes of a
    CUDA device (read only for a CUDA problem)."""
    device = session_device(device)
    footprint = meta_footprint(reference_source, device)
    if footprint is None:
        return {"footprint_bytes": None, "why": "the reference does not run on the meta device"}
    capacity = device_memory(device) if footprint.cuda else None
    error = refusal(task_name, footprint, limit_mb, capacity)
    if error is not None:
        raise error
    found: dict[str, Any] = {
        "footprint_bytes": footprint.total,
        "inputs_bytes": footprint.inputs,
        "outputs_bytes": footprint.outputs,
        "device": footprint.device,
        "estimate_bytes": footprint.estimate(),
        "peak_at": footprint.peak().where,
    }
    if footprint.cuda:
        found["device_estimate_bytes"] = footprint.device_estimate()
        found["device_free_bytes"] = None if capacity is None else capacity[0]
    return found
