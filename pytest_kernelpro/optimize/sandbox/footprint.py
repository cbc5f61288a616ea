"""Does one evaluation of a problem fit this machine? Decided before any worker starts.

A problem's footprint is the bytes of one call: its inputs (I) plus its output (O). Both are
found without allocating them: the problem's own `get_inputs()` and `Model` run on torch's
`meta` device (shapes and dtypes, no storage), in the session, before the first evaluation.

Every copy one evaluation holds at its peaks, counted in I and O. The judge runs beside the
worker and checks each output as it is handed over, while the worker waits holding nothing
of that call (`worker_claims.JudgeBeside`, `handles.Relay`): the session holds one checked
output at a time, and the two processes' large copies do not overlap. The watchdog counts
the worker's and the judge's resident memory together, plus the handed-over outputs not yet
checked, held by the session's descriptors (`supervise.py`: `both_peak_mb`). A copy the rules
need is marked with the rule; what they do not need was removed (the right column says what
changed).

| where | held at that moment | copies | rule / what changed |
|---|---|---|---|
| worker, trial 1 | sealed inputs (one read-only set for the reference and the candidate, `input_handles.py`), the reference's output, its float64 re-run (widened inputs 2I, output 2O), reference - truth in float32 | 3I + 4O | the correctness rule's truth (`measure.output_rule`); the first call's writable copy is dropped before the truth widens |
| judge, trial 1's output (the worker waits) | its inputs, the reference's output, the float64 re-run (2I + 2O), the difference (O), the handed-over output | 3I + 5O | outputs checked in a process the candidate never ran in; was 3I + 9O (five outputs held until the worker ended) |
| worker, trials 2-3, in-place, shape | sealed inputs (in-place: the maker's tensors refilled), the reference's output, the candidate's output and its handed-over copy, compare chunks | I + 3O | earlier outputs kept as digests for the cache check (`checks.digest`), not as outputs (was I + 6O); an output bit-identical to the reference's skips the rule's passes (`measurement.identical_reports`) |
| judge, later outputs | its inputs, the reference's output, the handed-over output | I + 2O | each dropped before the next is asked for (`handles.stream_outputs`) |
| worker, timing (the candidate's side; the reference's is dropped first) | the timed inputs, the mix's two ends and its uniform pool (`measure.timing.fresh_inputs`: 3I), a checked call's rebuilt content (I), the last and the current output, the checked copy and the reference's output on it (4O) | 5I + 4O | new content every timed call and checks no kernel can predict; no handed-over output is held any more (was 5I + 8O); the setup of the mix holds a second draw and the first reference output for a moment (6I + 3O) |
| judge, the reference's timing (the worker has ended) | the timed inputs, the mix (3I), the last and the current output, a second draw while the mix is made | 5I + 2O | the reference timed by the candidate's protocol |
| worker and judge | the interpreter, torch, the freed heap the allocator keeps, a CPU comparison chunk | `FIXED_BYTES` | two interpreters now (the judge is started with the worker); comparisons in chunks (`measure.output_rule.chunk_ranges`: on the CPU at most 2^20 elements) |

Comparison temporaries on a GPU (chunks of at most a 32nd of the output) and the
allocator's rounding: `TEMPORARIES` of O. The estimate takes the table's copies and a
two fifths more (`HEADROOM`: the measured peaks passed the table by up to 28%).

So the peak is the largest of the worker's timing, its setup and the judge's first check:
5I + 4O, 6I + 3O or 3I + 5O (4.5x the footprint where I = O: a softmax). `estimate` gives it
for the problem's own I and O, and when it passes the sandbox's memory limit
(`SandboxLimits.memory_limit_mb`, where the watchdog would kill the worker) the evaluation
is refused up front with those numbers, instead of every candidate dying "out of memory".
Held to it by `tests/optimize/search/test_evaluation_memory.py` (an evaluation's measured
peak above a tiny problem's stays within `estimate`), measured in
`bench/results/2026-12-05-optimizer-memory2-cpu.md`.

Below 3x the footprint needs what the timing's rules hold today: the fresh-content mix keeps
three input copies (its two ends and a pool of uniform values) beside the timed inputs and a
checked call's rebuilt content, and a checked timed call holds four outputs.

A problem the meta device cannot run (an op without a meta kernel, inputs made with numpy)
has no estimate: it is evaluated, and the watchdog still bounds it.
"""

from __future__ import annotations

import sys
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


# The evaluation's peaks (module doc): whichever holds more for the problem's I and O.
PEAKS = (
    Peak(5, 4, "the worker's timing phase"),
    Peak(6, 3, "the worker's timing setup"),
    Peak(3, 5, "the judge's check of the first output"),
    Peak(5, 2, "the judge's timing of the reference"),
)
TEMPORARIES = 0.25  # comparison chunks on a GPU and the allocator's rounding, of the output
# The table's copies and two fifths more: with the judge beside the worker, the measured peaks
# of a 1 GiB problem, less the two interpreters, passed the table's copies by up to 28%
# (bench/results/2026-12-05-optimizer-memory2-cpu.md); the watchdog samples, and an estimate
# that refuses should err high, not low.
HEADROOM = 1.4
MiB = 2**20
# The part of one process's memory that does not grow with the problem: the interpreter and
# torch (a 16x64 softmax's worker peaked at 246-305 MB), the freed heap glibc keeps (its
# trim threshold is 64 MiB, `measure.timing.cpu_cache.steady_allocator`, and fragments add
# to it: a 64 MiB problem's peak moved by 70 MiB between runs) and a comparison chunk's
# temporaries on the CPU (`measure.output_rule.CPU_COMPARE_CHUNK` elements, about 30 bytes
# each).
INTERPRETER_BYTES = 384 * MiB
HEAP_SLACK_BYTES = 128 * MiB
CHUNK_BYTES = 32 * MiB
PROCESSES = 2  # the worker and the judge beside it, each with its interpreter and torch
FIXED_BYTES = PROCESSES * INTERPRETER_BYTES + HEAP_SLACK_BYTES + CHUNK_BYTES


@dataclass(frozen=True)
class Footprint:
    """One call's inputs and output in bytes, and what one evaluation holds at its peak."""

    inputs: int
    outputs: int

    @property
    def total(self) -> int:
        return self.inputs + self.outputs

    def peak(self) -> Peak:
        return max(PEAKS, key=lambda p: p.bytes_for(self.inputs, self.outputs))

    def estimate(self) -> int:
        """Bytes one evaluation holds at its peak, the fixed part included."""
        return int(HEADROOM * self.peak().bytes_for(self.inputs, self.outputs)) + FIXED_BYTES


def meta_footprint(reference_source: str) -> Footprint | None:
    """Bytes of one call's inputs and output of a KernelBench reference, found on the meta
    device; None when the reference cannot run there."""
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

    def nbytes(leaves: list[Any]) -> int:
        return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))

    return Footprint(nbytes(flatten(inputs)), nbytes(flatten(output)))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def refusal(task_name: str, footprint: Footprint, limit_mb: int | None) -> KernelproError | None:
    """The error that refuses a problem whose evaluation cannot fit `limit_mb`, else None."""
    if not limit_mb or footprint.total <= 0:
        return None
    needed = footprint.estimate()
    limit = limit_mb * 2**20
    if needed <= limit:
        return None
    peak = footprint.peak()
    return KernelproError(
        f"The problem {task_name!r} is too large for the optimizer on this machine: one "
        f"call's inputs take {_gib(footprint.inputs)} and its output {_gib(footprint.outputs)}; "
        f"one evaluation holds up to {_gib(needed)} at its peak ({peak.where}: {peak.inputs:g} "
        f"copies of the inputs and {peak.outputs + TEMPORARIES:g} of the output, two fifths more "
        f"for what the table misses, and {_gib(FIXED_BYTES)} for the interpreters, torch and the "
        f"allocator of the worker and the judge beside it) and the sandbox's memory limit is "
        f"{_gib(limit)} (SandboxLimits.memory_limit_mb, half the machine's memory by default). "
        "Optimize it at a smaller shape (its get_inputs), or on a machine with at least "
        f"{needed / 2**30 * 2:.0f} GiB of memory."
    )


def check_fits(task_name: str, reference_source: str, limit_mb: int | None) -> dict[str, Any]:
    """Raise the refusal for a problem that cannot fit; else what was found (for metrics)."""
    footprint = meta_footprint(reference_source)
    if footprint is None:
        return {"footprint_bytes": None, "why": "the reference does not run on the meta device"}
    error = refusal(task_name, footprint, limit_mb)
    if error is not None:
        raise error
    return {
        "footprint_bytes": footprint.total,
        "inputs_bytes": footprint.inputs,
        "outputs_bytes": footprint.outputs,
        "estimate_bytes": footprint.estimate(),
        "peak_at": footprint.peak().where,
    }
