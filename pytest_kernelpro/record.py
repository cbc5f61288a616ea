"""The record of a kernel item: `KernelRecord`, what every report, the gate and xdist merging
consume, and its typed, frozen parts (correctness, timing, roofline, verdict, profile, autotune
choices and code-changing versions).

One record per kernel item, built by the item as it runs: each stage puts its measured result
on the record as its part with `part_of`. The record and its parts are `msgspec.Struct`s, so
the JSON form exists only at a file's or a process's boundary. Reading validates every field
against its type; a value of the wrong type is a `RecordDecodeError` naming the source and
the field, never a record that fails later.

The record imports nothing of `measure/`, `gate/` or `profile/`, so it stays below everything
that measures; each part's docstring names its producer, and a test checks that a part has a
field for every key its producer writes. Nested values a part does not type (the timing's
clocks and budget, the profile's kernels) stay plain JSON values; treat them as read-only.

A key the record does not know (written by a newer version of the same schema) is left out
on reading; a change that an older reader would misread raises `SCHEMA_VERSION` instead.

JSON has no infinity or NaN: a non-finite float in a part is None, except the correctness
errors, which keep it as the text "inf", "-inf" or "nan" (an infinite error is a finding).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, TypeVar

import msgspec

from pytest_kernelpro.errors import KernelproError

S = TypeVar("S", bound="Part")

# The version of the record's JSON form. The files that hold records (the report, the
# history's runs and the records log, gate/report.py) write it as theirs and refuse a file
# of another one; raise it with a change an older reader would misread.
SCHEMA_VERSION = 1


class RecordDecodeError(KernelproError):
    """A stored record is not JSON or does not have the record's types."""


class Part(msgspec.Struct, frozen=True, kw_only=True):
    """What every part shares: frozen, keyword-only, and no non-finite float (see the module
    docstring); `TEXT_NONFINITE` names the fields that keep one as text."""

    TEXT_NONFINITE: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if type(value) is float and not math.isfinite(value):
                text = str(value) if name in self.TEXT_NONFINITE else None
                msgspec.structs.force_setattr(self, name, text)


class TolerancePart(Part, frozen=True, kw_only=True):
    """The tolerance an output was compared with (`measure.output_rule.Tolerance`)."""

    rtol: float | None = None
    atol: float | None = None
    source: str | None = None
    norm_rtol: float | None = None  # the normwise relative bound, when the rule has one


class CorrectnessPart(Part, frozen=True, kw_only=True):
    """The correctness check over all trials (`measure.correctness_check.CorrectnessResult`)."""

    TEXT_NONFINITE: ClassVar[tuple[str, ...]] = (
        "max_abs_err", "max_rel_err", "worst_ratio", "kernel_error", "reference_error",
    )  # fmt: skip

    passed: bool | None = None
    trials: int | None = None
    trials_run: int | None = None
    max_abs_err: float | str | None = None  # "inf"/"nan" for a non-finite error
    max_rel_err: float | str | None = None
    tolerance: TolerancePart | None = None
    failure: str | None = None
    worst_index: tuple[int, ...] | None = None
    output_path: str | None = None
    worst_ratio: float | str | None = None
    exception: str | None = None
    notes: tuple[str, ...] = ()
    tf32: bool = False
    cuda_error: bool = False
    rule: str | None = None  # which rule decided (measure/output_rule.py)
    factor: float | None = None  # the kernel within this many times the reference's error
    kernel_error: float | str | None = None  # normwise relative, against the truth
    reference_error: float | str | None = None  # the reference's, same inputs
    truth: dict[str, Any] | None = None  # precision, seconds, peak_bytes, skipped
    kernelbench: dict[str, Any] | None = None  # KernelBench's own verdict (KernelBench files)


class StatsPart(Part, frozen=True, kw_only=True):
    """Statistics of the timing samples (`measure.timing.budget.SampleStats`)."""

    n: int | None = None
    median_s: float | None = None
    mean_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    q1_s: float | None = None
    q3_s: float | None = None
    iqr_s: float | None = None
    ci_low_s: float | None = None
    ci_high_s: float | None = None
    rel_ci_halfwidth: float | None = None  # None when not finite
    stdev_s: float | None = None
    rel_stdev: float | None = None
    n_boot: int | None = None


class TimingPart(Part, frozen=True, kw_only=True):
    """Per-call times and how they were taken (`measure.timing.TimingResult`)."""

    samples_s: tuple[float, ...] = ()
    stats: StatsPart | None = None
    method: str | None = None
    device: str | None = None
    stop_reason: str | None = None
    wall_s: float | None = None
    warmup_runs: int | None = None
    throttled_samples: int | None = None
    clocks: dict[str, Any] | None = None
    flushed_l2: bool | None = None
    calls_per_sample: int | None = None
    flush_bytes: int | None = None
    rounds: int | None = None
    budget: dict[str, Any] | None = None
    threads: int | None = None
    cpu_load: dict[str, Any] | None = None  # measure.timing.cpu_load.CpuLoad, as JSON
    flush_reason: str | None = None
    budget_note: str | None = None
    anchor: dict[str, Any] | None = None  # measure.timing.anchor.summarize_pairs()
    warmup_throttled: bool | None = None  # the warm-up ran under a clock limit (anchor.py)
    honesty: dict[str, Any] | None = None  # fresh inputs, checked outputs, checked calls

    @property
    def median_s(self) -> float | None:
        return None if self.stats is None else self.stats.median_s

    @property
    def oversubscribed_reasons(self) -> list[str]:
        """Why the CPU was oversubscribed while the samples were taken; empty: it was not."""
        load = self.cpu_load or {}
        if not load.get("oversubscribed"):
            return []
        return list(load.get("reasons") or ["the CPU was oversubscribed"])


class OpCostPart(Part, frozen=True, kw_only=True):
    """The cost of one aten op at one peak (`measure.flops.OpCost`)."""

    op: str | None = None
    category: str | None = None
    flops: float | None = None
    bytes_unfused: float | None = None
    dtype: str | None = None
    peak_key: str | None = None
    count: int | None = None


class RooflinePart(Part, frozen=True, kw_only=True):
    """FLOPs, bytes, bound and roofline time of the reference (`measure.roofline.ReferenceAnalysis`)."""

    ops: tuple[OpCostPart, ...] | None = None
    flops: float | None = None
    min_bytes: float | None = None
    unfused_bytes: float | None = None
    intensity: float | None = None
    ridge: float | None = None
    bound: str | None = None  # memory | compute | mixed
    dominant_category: str | None = None
    peak_flops: float | None = None
    peak_name: str | None = None
    bandwidth_Bps: float | None = None
    compute_time_s: float | None = None
    memory_time_s: float | None = None
    roofline_time_s: float | None = None
    flops_source: str | None = None
    bytes_source: str | None = None
    device: str | None = None
    notes: tuple[str, ...] = ()
    bound_band: tuple[float, ...] | None = None
    peak_mix: dict[str, float] | None = None
    # The roofline on each faster unit the fp32 matrix work may run on, the op-level rule's
    # first (`measure.matrix_paths`); absent in records before it existed.
    paths: list[dict[str, Any]] | None = None
    # The call's own inputs and outputs (the impossible-time floor) and the ops no FLOP
    # formula priced (`measure.roofline.ReferenceAnalysis`); absent in older records.
    compulsory_bytes: float | None = None
    unpriced_ops: tuple[str, ...] | None = None


class VerdictPart(Part, frozen=True, kw_only=True):
    """The gate's verdict on the kernel against its baseline: the one type the gate builds,
    revises and the record keeps. `failed` and `message` follow from the other fields
    (`__post_init__`), written out for readers of the JSON form."""

    status: str | None = None  # gate/verdict.py's statuses; regressed and below-roofline fail
    change_status: str | None = None  # the baseline comparison alone (no roofline floor)
    basis: str | None = None  # "time (same device: X)", "efficiency (other device: ...)", "none"
    reason: str | None = None  # one sentence a user can act on
    tolerance: float | None = None  # relative change allowed on this basis
    threshold: float | None = None  # the kernel's same-device threshold
    cross_device_tolerance: float | None = None
    alpha: float | None = None
    change: float | None = None  # compared quantity, now / baseline - 1; + means slower
    change_low: float | None = None  # the same for the lower decile (the fastest calls)
    p_value: float | None = None  # one-sided, in the direction of the change
    current_median_s: float | None = None
    baseline_median_s: float | None = None
    efficiency: float | None = None
    baseline_efficiency: float | None = None
    device: str | None = None
    baseline_device: str | None = None
    n_current: int | None = None
    n_baseline: int | None = None
    below_roofline: bool | None = None
    min_roofline: float | None = None
    confirmed: bool | None = None  # the re-measurement reproduced the regression
    confirmation: dict[str, Any] | None = None  # set once the confirmation ran
    # The SM clocks of a clock-limited or clock-anchored comparison (gate/clock_basis.py):
    sm_mhz: float | None = None
    baseline_sm_mhz: float | None = None
    raw_change: float | None = None  # the change of the unscaled median time
    clock_limited: str | None = None  # why the tolerance was widened (clock held by a limit)
    anchor: str | None = None  # the anchor (clock or CPU) the comparison was relative to
    anchor_change: float | None = None  # the anchor's own median, now / baseline - 1
    # The time the verdict was decided on when it is not the wall median (the number shown is
    # the number gated): its label ("on-CPU", "anchor-scaled", ...), now and in the baseline;
    # gated_now_s / gated_baseline_s - 1 is the verdict's `change`. None: the wall medians.
    gated_label: str | None = None
    gated_now_s: float | None = None
    gated_baseline_s: float | None = None
    # The autotune choices compared with the baseline's and what the gate did about a
    # difference, and the code-changing versions that differ, each with its words:
    autotune: dict[str, Any] | None = None
    autotune_note: str | None = None
    environment_change: dict[str, Any] | None = None
    environment_note: str | None = None
    failed: bool | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # A decided verdict (its change status set) fails the kernel when it regressed or is
        # below the min_roofline floor, and its message is its reason, however it was built or
        # revised; a verdict read without a change status (a JUnit file's properties) keeps
        # what it was given.
        if self.change_status is not None:
            failed = self.change_status == "regressed" or bool(self.below_roofline)
            msgspec.structs.force_setattr(self, "failed", failed)
            msgspec.structs.force_setattr(self, "message", self.reason)


class ProfilePart(Part, frozen=True, kw_only=True):
    """The item's profile (`profile.model.ProfileReport`), kernels as the profiler wrote them."""

    # The profile's nested results, kept as their JSON form (`part_of` writes them so).
    PLAIN: ClassVar[tuple[str, ...]] = ("kernels", "timeline", "linkage", "not_collected")

    arch: str | None = None
    kernels: list[dict[str, Any]] | None = None
    timeline: dict[str, Any] | None = None
    linkage: dict[str, Any] | None = None
    not_collected: list[dict[str, Any]] | None = None
    wall_s: float | None = None


class AutotunePart(Part, frozen=True, kw_only=True):
    """What the item's autotuned kernels chose, and the library settings that choose algorithms."""

    # One per autotuned kernel and key: {"kernel", "key", "key_names", "config" (flat:
    # meta-parameters, num_warps, num_stages, ...), "configs" (candidates), "source"
    # (tuned | cached | pinned | single | tuned during timing), "disk_cache" when set}.
    choices: tuple[dict[str, Any], ...] = ()
    library: dict[str, Any] | None = None
    # Set in a re-measurement with the baseline's choices imposed: the pins, and why a pin
    # could not be applied.
    pinned: tuple[dict[str, Any], ...] | None = None
    pin_problems: tuple[str, ...] | None = None


class EnvironmentPart(Part, frozen=True, kw_only=True):
    """The versions that change the code the item ran; one this process does not have is absent."""

    torch: str | None = None
    triton: str | None = None
    cuda_runtime: str | None = None
    hip_runtime: str | None = None
    cudnn: str | None = None
    nvcc: str | None = None
    driver: str | None = None

    def versions(self) -> dict[str, str]:
        """The versions recorded, by name (a version this process lacks is left out)."""
        return {n: v for n in self.__struct_fields__ if (v := getattr(self, n)) is not None}


class SectionPart(Part, frozen=True, kw_only=True):
    """What a plugin other than the gate (the optimizer) reports about the item, as text the
    gate shows without knowing the plugin: a "TITLE" section in the terminal (one per title,
    every record's lines), lines in the item's report section, a table in the PR comment
    (every record's rows under the first record's columns; each cell escaped by the comment)
    and JUnit properties."""

    title: str = ""
    terminal_lines: tuple[str, ...] = ()
    item_lines: tuple[str, ...] = ()
    comment_columns: tuple[str, ...] = ()
    comment_rows: tuple[Any, ...] = ()  # each a list of cells
    comment_notes: tuple[str, ...] = ()  # paragraphs under the table (once per title)
    junit: tuple[Any, ...] = ()  # each a [name, value] pair


def part_of(part_type: type[S], measured: object) -> S:
    """`measured` (a producer's result, e.g. `TimingResult`) as the record's part, with no
    JSON form between; a part's `PLAIN` fields hold the producer's nested results in their
    JSON form (the record does not type them)."""
    plain: tuple[str, ...] = getattr(part_type, "PLAIN", ())
    if not plain:
        return msgspec.convert(measured, part_type, from_attributes=True)
    values = {
        name: msgspec.to_builtins(value, enc_hook=str) if name in plain else value
        for name in part_type.__struct_fields__
        if (value := getattr(measured, name, None)) is not None
    }
    return part_type(**values)


class KernelRecord(msgspec.Struct, kw_only=True):
    nodeid: str
    name: str  # item name with shape id, e.g. "softmax[8192x4096]"
    kernel: str  # base kernel name, e.g. "softmax"
    shape: str | None = None
    language: str = "pytorch"  # pytorch | triton | cuda
    device: str = ""  # e.g. "NVIDIA H200" or "cpu"
    device_kind: str = "cpu"  # cuda | cpu
    outcome: str = "pending"  # passed | failed | skipped | error
    message: str | None = None  # failure or skip reason, one paragraph
    correctness: CorrectnessPart | None = None
    timing: TimingPart | None = None  # includes samples_s
    roofline: RooflinePart | None = None
    efficiency: float | None = None  # roofline time / measured median, 0..1 (can exceed 1)
    # Set when the kernel ran faster than the roofline's op-level peak allows: the peak its
    # rate implies (efficiency is priced at it) or why it stays above 100%
    # (`measure.roofline.MeasuredPeak`, as JSON); None when the op-level peak holds.
    peak_used: dict[str, Any] | None = None
    threshold: float = 0.05
    min_roofline: float | None = None
    gate: VerdictPart | None = None
    profile: ProfilePart | None = None
    guidance: str | None = None  # Markdown "Automated Bottleneck Analysis"
    # Time the plugin spent on this item, less the machine's set-up the item triggered (a
    # CUDA context, the ceilings probe: `extra["machine_setup_s"]`).
    wall_s: float = 0.0
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # Each setting a marker can override, with where its value came from
    # (`run.context.ItemSettings.to_dict`); None before the item chose its device.
    settings: dict[str, dict[str, Any]] | None = None
    autotune: AutotunePart | None = None
    environment: EnvironmentPart | None = None
    # Sections other plugins report (the optimizer's search), shown by the gate as given.
    sections: list[SectionPart] = msgspec.field(default_factory=list)

    @property
    def median_s(self) -> float | None:
        value = None if self.timing is None else self.timing.median_s
        return None if value is None else float(value)

    @property
    def roofline_time_s(self) -> float | None:
        return None if self.roofline is None else self.roofline.roofline_time_s


# A value the record's JSON form has no type for (a path in `extra`) is written as its text.
_ENCODER = msgspec.json.Encoder(enc_hook=str)
_DECODER = msgspec.json.Decoder(KernelRecord)


def encode_record(record: KernelRecord) -> bytes:
    """The record's JSON text (the xdist transport, a record in a file of its own)."""
    return _ENCODER.encode(record)


def decode_record(text: bytes | str, *, source: str) -> KernelRecord:
    """The record of `text`; `source` names where it came from in the error."""
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError as exc:
        raise RecordDecodeError(f"{source}: not a kernel record: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RecordDecodeError(f"{source}: not JSON ({exc}); the file is corrupt") from None


def record_builtins(record: KernelRecord) -> dict[str, Any]:
    """The record as the JSON values its text decodes to (lists, not tuples), for a document."""
    return msgspec.json.decode(_ENCODER.encode(record))


def record_from_builtins(data: Any, *, source: str) -> KernelRecord:
    """The record of `data`, a record's JSON values (`source` names them for the error)."""
    try:
        return msgspec.convert(data, KernelRecord)
    except msgspec.ValidationError as exc:
        raise RecordDecodeError(f"{source}: not a kernel record: {exc}") from None
