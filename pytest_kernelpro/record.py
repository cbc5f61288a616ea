"""The record of a kernel item: `KernelRecord`, what every report, the gate and xdist merging
consume, and its typed, frozen parts (correctness, timing, roofline, verdict, profile, autotune
choices and code-changing versions).

One record per kernel item, built by the item as it runs (each stage sets its own part) and
carried to the controller (also across pytest-xdist workers) as JSON in
`report.user_properties`. `to_dict` / `from_dict` are the one conversion to and from the JSON
form (the report, the records log, the baseline, JUnit properties, the xdist transport).

Each part is built from the JSON form its producer writes (`CorrectnessResult.to_dict`,
`TimingResult.to_dict`, `ReferenceAnalysis.to_dict`, `Verdict.to_dict`,
`ProfileReport.to_dict`) with `from_dict`, and gives that form back with `to_dict`, key for
key and in the same order. Building parts from the producers' JSON form keeps the record below
everything that measures (it imports nothing of `measure/`, `gate/` or `profile/`); the texts
made from a record are `gate/`'s (format.py, comment.py).

Parts are lenient readers, because they also read stored records (a report of an older or
newer version, a JSONL log, an artifact from another job): a key a part does not know is kept
in `unknown` and written back; a key the source lacks stays absent in `to_dict` (its field
holds the default); values are taken as they are, never coerced, so reading a record never
fails where the dict form did not. Nested values a part does not type (the roofline's ops,
the timing's clocks and budget, the profile's kernels) stay plain JSON values; treat them
as read-only.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

P = TypeVar("P", bound="Part")

_BOOKKEEPING = ("unknown", "key_order")


def _plain(value: Any) -> Any:
    """A field's value in the JSON form: nested parts as dicts, typed sequences as lists."""
    if isinstance(value, Part):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class Part:
    """What every part shares: unknown keys kept, the source's key order kept."""

    # Nested parts by field name (built with that class's from_dict when the value is a dict).
    NESTED: ClassVar[Mapping[str, type[Part]]] = {}
    # Fields that hold a JSON list as a tuple (so the part stays immutable).
    SEQUENCES: ClassVar[tuple[str, ...]] = ()

    unknown: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # The keys of the dict this part was read from, in order (None: built directly).
    key_order: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The keys this part knows, in the order its producer writes them."""
        return tuple(f.name for f in fields(cls) if f.name not in _BOOKKEEPING)

    @classmethod
    def from_dict(cls: type[P], data: Mapping[str, Any]) -> P:
        known = set(cls.field_names())
        values: dict[str, Any] = {}
        unknown: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                unknown[key] = value
                continue
            nested = cls.NESTED.get(key)
            if nested is not None and isinstance(value, Mapping):
                value = nested.from_dict(value)
            elif key in cls.SEQUENCES and isinstance(value, list):
                value = tuple(value)
            values[key] = value
        return cls(**values, unknown=unknown, key_order=tuple(data))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the source's keys in its order (every known key when built directly),
        then a field set since that the source lacked."""
        names = self.field_names()
        order = list(self.key_order) if self.key_order is not None else [*names, *self.unknown]
        listed = set(order)
        for f in fields(self):
            if f.name in _BOOKKEEPING or f.name in listed:
                continue
            if f.default is not MISSING and getattr(self, f.name) != f.default:
                order.append(f.name)
        out: dict[str, Any] = {}
        known = set(names)
        for key in order:
            if key in known:
                out[key] = _plain(getattr(self, key))
            elif key in self.unknown:
                out[key] = self.unknown[key]
        return out

    def __bool__(self) -> bool:
        """False for a part read from an empty object, as the dict form was (a stored
        `"gate": {}` is no verdict)."""
        if self.key_order is None or self.key_order:
            return True
        return bool(self.to_dict())


@dataclass(frozen=True, kw_only=True)
class TolerancePart(Part):
    """The tolerance an output was compared with (`measure.correctness.Tolerance`)."""

    rtol: float | None = None
    atol: float | None = None
    source: str | None = None
    norm_rtol: float | None = None  # the normwise relative bound, when the rule has one


@dataclass(frozen=True, kw_only=True)
class CorrectnessPart(Part):
    """The correctness check over all trials (`measure.correctness.CorrectnessResult`)."""

    NESTED: ClassVar[Mapping[str, type[Part]]] = {"tolerance": TolerancePart}
    SEQUENCES: ClassVar[tuple[str, ...]] = ("worst_index", "notes")

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
    rule: str | None = None  # which rule decided (measure/accuracy.py)
    factor: float | None = None  # the kernel within this many times the reference's error
    kernel_error: float | str | None = None  # normwise relative, against the truth
    reference_error: float | str | None = None  # the reference's, same inputs
    truth: dict[str, Any] | None = None  # precision, seconds, peak_bytes, skipped
    kernelbench: dict[str, Any] | None = None  # KernelBench's own verdict (KernelBench files)


@dataclass(frozen=True, kw_only=True)
class StatsPart(Part):
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


@dataclass(frozen=True, kw_only=True)
class TimingPart(Part):
    """Per-call times and how they were taken (`measure.timing.TimingResult`)."""

    NESTED: ClassVar[Mapping[str, type[Part]]] = {"stats": StatsPart}
    SEQUENCES: ClassVar[tuple[str, ...]] = ("samples_s",)

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
    cpu_load: dict[str, Any] | None = None  # measure.timing.cpu.CpuLoad.to_dict()
    flush_reason: str | None = None
    budget_note: str | None = None
    anchor: dict[str, Any] | None = None  # measure.timing.anchor.summarize_pairs()
    warmup_throttled: bool | None = None  # the warm-up ran under a clock limit (anchor.py)
    honesty: dict[str, Any] | None = None  # fresh inputs, checked outputs, checked calls

    @property
    def median_s(self) -> float | None:
        return None if self.stats is None else self.stats.median_s

    @property
    def oversubscribed(self) -> bool:
        """The CPU was oversubscribed while the samples were taken."""
        return bool((self.cpu_load or {}).get("oversubscribed"))


@dataclass(frozen=True, kw_only=True)
class RooflinePart(Part):
    """FLOPs, bytes, bound and roofline time of the reference (`measure.roofline.ReferenceAnalysis`)."""

    SEQUENCES: ClassVar[tuple[str, ...]] = ("notes", "bound_band", "unpriced_ops")

    ops: list[dict[str, Any]] | None = None  # measure.roofline.OpCost.to_dict() per op
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
    # first (`measure.roofline.matrix_paths`); absent in records before it existed.
    paths: list[dict[str, Any]] | None = None
    # The call's own inputs and outputs (the impossible-time floor) and the ops no FLOP
    # formula priced (`measure.roofline.ReferenceAnalysis`); absent in older records.
    compulsory_bytes: float | None = None
    unpriced_ops: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class VerdictPart(Part):
    """The gate's verdict against the baseline (`gate.verdict.Verdict`), with the `failed`
    and `message` it derives written out."""

    status: str | None = None
    change_status: str | None = None
    basis: str | None = None
    reason: str | None = None
    tolerance: float | None = None
    threshold: float | None = None
    cross_device_tolerance: float | None = None
    alpha: float | None = None
    change: float | None = None
    change_low: float | None = None
    p_value: float | None = None
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
    confirmed: bool | None = None
    confirmation: dict[str, Any] | None = None
    # Set when the times were compared at the baseline's SM clock (gate/verdict_basis.py):
    clock_scale: float | None = None
    sm_mhz: float | None = None
    baseline_sm_mhz: float | None = None
    raw_change: float | None = None  # the change of the unscaled median time
    clock_limited: str | None = None  # why the tolerance was widened (clock held by a limit)
    anchor: str | None = None  # the clock anchor a clock-limited comparison was relative to
    anchor_change: float | None = None  # the anchor's own median, now / baseline - 1
    # The time the verdict was decided on when not the wall median (`gate.verdict.Verdict`).
    gated_label: str | None = None
    gated_now_s: float | None = None
    gated_baseline_s: float | None = None
    # The autotune choices compared with the baseline's and what the gate did about a
    # difference (`gate.confirmation.AutotuneComparison.to_dict`), and that in words:
    autotune: dict[str, Any] | None = None
    autotune_note: str | None = None
    # The code-changing versions that differ from the baseline's (`gate.confirmation`):
    environment_change: dict[str, Any] | None = None
    environment_note: str | None = None
    failed: bool | None = None
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProfilePart(Part):
    """The item's profile (`profile.model.ProfileReport`): its kernels as the profiler wrote
    them, module-wide facts and what could not be collected."""

    arch: str | None = None
    kernels: list[dict[str, Any]] | None = None
    timeline: dict[str, Any] | None = None
    linkage: dict[str, Any] | None = None
    not_collected: list[dict[str, Any]] | None = None
    wall_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class AutotunePart(Part):
    """What the item's autotuned kernels chose in its process (`measure.environment.
    AutotuneCapture.to_dict`) and the library settings that choose algorithms
    (`measure.environment.library_choices`)."""

    SEQUENCES: ClassVar[tuple[str, ...]] = ("choices", "pinned", "pin_problems")

    # One per autotuned kernel and key: {"kernel", "key", "key_names", "config" (flat:
    # meta-parameters, num_warps, num_stages, ...), "configs" (candidates), "source"
    # (tuned | cached | pinned | single | tuned during timing), "disk_cache" when set}.
    choices: tuple[dict[str, Any], ...] = ()
    library: dict[str, Any] | None = None
    # Set in a re-measurement with the baseline's choices imposed: the pins, and why a pin
    # could not be applied.
    pinned: tuple[dict[str, Any], ...] | None = None
    pin_problems: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class EnvironmentPart(Part):
    """The versions that change the code the item ran (`measure.environment.code_versions`);
    a version this process does not have is absent."""

    torch: str | None = None
    triton: str | None = None
    cuda_runtime: str | None = None
    hip_runtime: str | None = None
    cudnn: str | None = None
    nvcc: str | None = None
    driver: str | None = None


@dataclass(frozen=True, kw_only=True)
class SectionPart(Part):
    """What a plugin other than the gate (the optimizer) reports about the item, as text the
    gate shows without knowing the plugin: a "TITLE" section in the terminal (one per title,
    every record's lines), lines in the item's report section, a table in the PR comment
    (every record's rows under the first record's columns; each cell escaped by the comment)
    and JUnit properties."""

    SEQUENCES: ClassVar[tuple[str, ...]] = (
        "terminal_lines", "item_lines", "comment_columns", "comment_rows", "comment_notes",
        "junit",
    )  # fmt: skip

    title: str = ""
    terminal_lines: tuple[str, ...] = ()
    item_lines: tuple[str, ...] = ()
    comment_columns: tuple[str, ...] = ()
    comment_rows: tuple[Any, ...] = ()  # each a list of cells
    comment_notes: tuple[str, ...] = ()  # paragraphs under the table (once per title)
    junit: tuple[Any, ...] = ()  # each a [name, value] pair


RECORD_PROPERTY = "kernelpro_record"  # user_properties key that carries the JSON record
SCHEMA_VERSION = 1

# The record's typed parts, by field name.
PARTS: dict[str, type[Part]] = {
    "correctness": CorrectnessPart,
    "timing": TimingPart,
    "roofline": RooflinePart,
    "gate": VerdictPart,
    "profile": ProfilePart,
    "autotune": AutotunePart,
    "environment": EnvironmentPart,
}


@dataclass
class KernelRecord:
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
    # (`measure.roofline.MeasuredPeak.to_dict`); None when the op-level peak holds.
    peak_used: dict[str, Any] | None = None
    threshold: float = 0.05
    min_roofline: float | None = None
    gate: VerdictPart | None = None
    profile: ProfilePart | None = None
    guidance: str | None = None  # Markdown "Automated Bottleneck Analysis"
    wall_s: float = 0.0  # time the plugin spent on this item
    extra: dict[str, Any] = field(default_factory=dict)
    # Each setting a marker can override: {"value": ..., "source": "marker threshold=" | the
    # command line, environment, ini or conftest setting it came from | "built-in: ..."}
    # (`run.context.ItemSettings.to_dict`); None before the item chose its device.
    settings: dict[str, dict[str, Any]] | None = None
    # What the item's autotuned kernels chose in its process, and the library settings that
    # choose algorithms (measure/environment.py); None when not captured.
    autotune: AutotunePart | None = None
    # The versions that change generated code (measure/environment.py).
    environment: EnvironmentPart | None = None
    # Sections other plugins report (the optimizer's search), shown by the gate as given.
    sections: list[SectionPart] = field(default_factory=list)

    def __setattr__(self, name: str, value: Any) -> None:
        # A part given in its JSON form (to the constructor or assigned) is read into its
        # type: the parts are always typed, whoever built the record.
        part = PARTS.get(name)
        if part is not None and isinstance(value, Mapping):
            value = part.from_dict(value)
        if name == "sections":
            value = [SectionPart.from_dict(v) if isinstance(v, Mapping) else v for v in value]
        super().__setattr__(name, value)

    @property
    def median_s(self) -> float | None:
        value = None if self.timing is None else self.timing.median_s
        return None if value is None else float(value)

    @property
    def roofline_time_s(self) -> float | None:
        return None if self.roofline is None else self.roofline.roofline_time_s

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a deep copy: changing it leaves the record as it is)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Part) else value
        out["sections"] = [section.to_dict() for section in self.sections]
        return copy.deepcopy(out)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> KernelRecord:
        return cls.from_dict(json.loads(text))


__all__ = [
    "PARTS",
    "RECORD_PROPERTY",
    "SCHEMA_VERSION",
    "AutotunePart",
    "CorrectnessPart",
    "EnvironmentPart",
    "KernelRecord",
    "Part",
    "ProfilePart",
    "RooflinePart",
    "SectionPart",
    "StatsPart",
    "TimingPart",
    "TolerancePart",
    "VerdictPart",
]
