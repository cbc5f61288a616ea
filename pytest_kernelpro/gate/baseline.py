"""Baselines: one YAML file per device run, written atomically, validated when read.

Layout (schema 1)::

    schema_version: 1
    tool: pytest-kernelpro 0.1.0
    device: NVIDIA H200
    commit: 3f2a9c...            # or null
    created: '2026-11-30T12:00:00+00:00'
    kernels:
      tests/test_softmax.py::softmax[8192x4096]:
        name: softmax[8192x4096]
        kernel: softmax
        device: NVIDIA H200
        median_s: 5.21e-05
        q1_s: 5.19e-05
        q3_s: 5.24e-05
        n: 1840                  # samples behind median/q1/q3
        efficiency: 0.61
        roofline_time_s: 3.18e-05
        method: cuda-events
        sm_mhz: 1592.4           # GPU timings: the clock the samples ran at
        max_sm_mhz: 1980.0
        clock_capped_share: 1.0
        bound: compute
        anchor: bf16 matmul 4096x4096x4096 (torch 2.11.0+cu130, CUDA 13.0)  # when the
        anchor_median_s: 0.000201                 # warm-up ran capped: the clock anchor
        anchor_ratios: [...]                      # paired with each sample
        samples_s: [...]         # <= baseline_save.BASELINE_SAMPLES order statistics

The clock and anchor keys are optional: files written before they existed load unchanged
(their comparisons fall back to the rules those files were made for).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.format import finite_float
from pytest_kernelpro.record import KernelRecord, TimingPart

if TYPE_CHECKING:
    import numpy as np


BASELINE_SCHEMA_VERSION = 1
_SAVE_HINT = "regenerate it with `pytest --kernelpro-save-baseline={path}` on the base commit"


# -- what one measurement says that the verdict's basis is chosen on (its clock, its pairs with
# the clock anchor and with the CPU anchor), read without any rule: here so that the baseline
# never imports the rules (`verdict_basis.py`, `clock_basis.py`), and the rules import it.

# How a CPU timing lays out its anchored samples (measure/timing/cpu.CPU_LAYOUT): each sample
# followed by the anchor, both in on-CPU time.
CPU_LAYOUT = "cpu-pairs"
BUSY_RUN_QUEUE_SHARE = 0.10  # the kernel waited for a core this share of its wall time: busy


def positive(value: Any) -> float | None:
    """`value` as a finite positive float, or None (not a number, zero, negative, NaN)."""
    out = finite_float(value)
    return out if out is not None and out > 0 else None


def positive_list(values: Any) -> tuple[float, ...]:
    """The positive numbers of `values`, in order (others dropped)."""
    out = []
    for value in values or ():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            out.append(float(value))
    return tuple(out)


@dataclass(frozen=True)
class ClockFacts:
    """What one measurement says about the clock it ran at (GPU timings with NVML readings)."""

    sm_mhz: float | None  # mean SM clock over the readings taken while samples ran
    capped_share: float | None  # share of samples taken in rounds with a clock limit
    bound: str | None  # the reference's roofline bound: "compute", "memory", "mixed"
    max_sm_mhz: float | None = None  # the GPU's maximum SM clock (NVML)


def record_clock_facts(record: KernelRecord) -> ClockFacts:
    """The clock facts of a measured record (None fields where it has no NVML readings)."""
    timing = record.timing
    clocks = (timing.clocks if timing else None) or {}
    n = len((timing.samples_s if timing else None) or ())
    throttled = timing.throttled_samples if timing else None
    share = (float(throttled) / n) if n and isinstance(throttled, (int, float)) else None
    bound = record.roofline.bound if record.roofline else None
    return ClockFacts(
        sm_mhz=positive(clocks.get("sm_mhz_mean")),
        capped_share=share,
        bound=bound if isinstance(bound, str) else None,
        max_sm_mhz=positive(clocks.get("max_sm_mhz")),
    )


@dataclass(frozen=True)
class AnchorSide:
    """One side's pairs with the clock anchor (measure/timing/anchor.py)."""

    name: str
    anchor_median_s: float
    ratios: tuple[float, ...]


def anchor_of_timing(anchor: Any) -> AnchorSide | None:
    """The clock-anchored pairs of a timing's `anchor` dict, or None without them."""
    if not isinstance(anchor, dict):
        return None
    name, median = anchor.get("name"), anchor.get("anchor_median_s")
    ratios = tuple(float(v) for v in anchor.get("ratios") or () if finite_positive(v))
    if not isinstance(name, str) or not name or not finite_positive(median) or not ratios:
        return None
    return AnchorSide(name, float(median), ratios)


def record_anchor(record: KernelRecord) -> AnchorSide | None:
    return anchor_of_timing(record.timing.anchor if record.timing else None)


@dataclass(frozen=True)
class CpuAnchorSide:
    """One side's pairs with the CPU anchor (`measure/timing/on_cpu.py`); `busy`: why the
    machine counted as busy (None: it did not); `memory_s`: empty where that side has none."""

    name: str
    kernel_s: tuple[float, ...]
    anchor_s: tuple[float, ...]
    busy: str | None = None
    memory_s: tuple[float, ...] = ()


def busy_reason(timing: TimingPart, run_queue_share: Any) -> str | None:
    """Why a CPU timing counts as taken on a busy machine, or None."""
    reasons = timing.oversubscribed_reasons
    if isinstance(run_queue_share, (int, float)) and run_queue_share > BUSY_RUN_QUEUE_SHARE:
        reasons.append(f"the kernel waited for a core {run_queue_share:.0%} of its wall time")
    return "; ".join(reasons) or None


def record_cpu_anchor(record: KernelRecord) -> CpuAnchorSide | None:
    """The CPU-anchored samples of a measured record, or None without them."""
    timing = record.timing
    anchor = timing.anchor if timing else None
    if timing is None or not isinstance(anchor, Mapping) or anchor.get("layout") != CPU_LAYOUT:
        return None
    name = anchor.get("name")
    kernel, anchors = positive_list(anchor.get("kernel_s")), positive_list(anchor.get("anchor_s"))
    if not isinstance(name, str) or not kernel or not anchors:
        return None
    busy = busy_reason(timing, anchor.get("run_queue_share"))
    return CpuAnchorSide(name, kernel, anchors, busy, positive_list(anchor.get("memory_s")))


def finite_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite values of `values`, flat, as a float array."""
    import numpy as np

    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def median(values: Sequence[float] | np.ndarray) -> float:
    """Median of the finite values (NaN when there are none)."""
    import numpy as np

    arr = finite_array(values)
    return float(np.median(arr)) if len(arr) else float("nan")


def pct_text(x: float) -> str:
    """A signed change as a percentage: "+4.0%", "-1.2%"."""
    return f"{x * 100:+.1f}%"


def quantile_subsample(samples: Sequence[float] | np.ndarray, k: int) -> list[float]:
    """At most `k` values that keep the shape of the sample: its order statistics at the
    mid-ranks (i + 0.5) / k, i = 0..k-1. Deterministic (a baseline saved twice is the same
    file), and the sample's median, quartiles and tails survive. Being more regular than an
    i.i.d. draw, it makes the Mann-Whitney null variance overstate its spread slightly, which
    errs toward "not significant" (a false alarm is the costlier error for a gate)."""
    import numpy as np

    arr = np.sort(finite_array(samples))
    if len(arr) <= k:
        return [float(v) for v in arr]
    idx = np.floor((np.arange(k) + 0.5) * len(arr) / k).astype(int)
    return [float(v) for v in arr[idx]]


# -- what a basis hands the verdict, and which device a comparison is on: here, below every
# module that makes a basis, so each can make one without importing the others.


def same_device(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def is_cpu(device: str) -> bool:
    return device.strip().casefold().startswith("cpu")


@dataclass
class Basis:
    """The samples to compare, their tolerance, and how to word and show the change."""

    text: str  # the verdict's basis
    tolerance: float
    now: list[float]
    ref: list[float]
    ratio: float  # now / baseline of the compared quantity's median
    unit: str = ""  # after "slower by 3.1%": " relative to the clock anchor"
    detail: str = ""  # after the tolerance inside the parentheses
    # CPU anchor: the load is cancelled by the anchor, so an oversubscribed timing is no
    # reason for "suspect"; `widened` says why the tolerance is above the threshold,
    # `unusable` why the anchor shows the measurement cannot gate.
    load_cancelled: bool = False
    # The fastest decile's tolerance when not the basis's (the CPU anchor: a tolerance widened
    # for between-session noise would ask the noisy decile for more than the median).
    low_tolerance: float | None = None
    widened: str | None = None
    unusable: str | None = None
    # The `VerdictPart` fields of the same names (record.py says what each holds), which
    # `verdict_fields` hands over.
    gated_label: str | None = None
    gated_now_s: float | None = None
    gated_baseline_s: float | None = None
    sm_mhz: float | None = None
    baseline_sm_mhz: float | None = None
    raw_change: float | None = None
    clock_limited: str | None = None
    anchor: str | None = None
    anchor_change: float | None = None

    def gated(self, label: str, now_s: float, baseline_s: float) -> None:
        """Name the time this basis compares when it is not the wall median."""
        self.gated_label, self.gated_now_s, self.gated_baseline_s = label, now_s, baseline_s

    def verdict_fields(self) -> dict[str, Any]:
        """The Verdict fields this basis sets (those it left unset stay the Verdict's None)."""
        names = (
            "gated_label", "gated_now_s", "gated_baseline_s", "sm_mhz", "baseline_sm_mhz",
            "raw_change", "clock_limited", "anchor", "anchor_change",
        )  # fmt: skip
        return {name: getattr(self, name) for name in names}


@dataclass
class Incomparable:
    """No gate on this pair: the basis, the reason and the change where one exists."""

    text: str
    reason: str
    tolerance: float
    change: float | None = None


class BaselineError(KernelproError):
    """A baseline file is missing, empty, corrupt or of another schema version."""


# What each key of an entry must hold, checked by msgspec when a file is read; the description
# is what its error says was expected. A number's `le` bound is the largest float: msgspec has
# no "finite" constraint, and NaN fails every bound.
_FINITE = sys.float_info.max
Seconds = Annotated[float, Meta(gt=0, le=_FINITE, description="a positive number of seconds")]
_Positive = Annotated[float, Meta(gt=0, le=_FINITE)]
PositiveList = Annotated[
    list[_Positive], Meta(min_length=1, description="a non-empty list of positive numbers")
]
SecondsList = Annotated[
    list[_Positive], Meta(min_length=1, description="a non-empty list of positive seconds")
]
Number = Annotated[float, Meta(ge=0, le=_FINITE, description="a number or null")]
Text = Annotated[str, Meta(description="a string")]
_CHOICES = "a list of mappings with a kernel name and a config"


@dataclass(kw_only=True)
class BaselineEntry:
    """What the gate keeps of one kernel's measurement."""

    name: Text = ""
    median_s: Seconds
    samples_s: SecondsList
    device: Text = ""
    kernel: Text = ""
    q1_s: Number | None = None
    q3_s: Number | None = None
    n: Annotated[int, Meta(ge=1, description="a positive integer")] = 0  # samples in the median
    efficiency: Number | None = None
    roofline_time_s: Number | None = None
    method: Text | None = None
    # The clock the samples ran at (gate/clock_basis.py); absent for CPU timings.
    sm_mhz: Number | None = None  # mean SM clock over the NVML readings during the samples
    max_sm_mhz: Number | None = None  # the GPU's maximum SM clock
    clock_capped_share: Number | None = None  # share of samples under a power/thermal limit
    bound: Text | None = None  # the reference's roofline bound
    # The anchored samples of a capped measurement (measure/timing/anchor.py): the
    # anchor's identity, its median, and kernel / anchor per pair (gate/clock_basis.py).
    anchor: Text | None = None
    anchor_median_s: (
        Annotated[float, Meta(gt=0, le=_FINITE, description="a positive number or null")] | None
    ) = None
    anchor_ratios: PositiveList | None = None
    # What the kernel's autotuners chose in the baseline's process (measure/autotune_capture.py:
    # kernel, key, flat config, ...), the library settings that choose algorithms, and the
    # versions that change generated code (measure/environment.py). Absent in older files.
    autotune: Annotated[list[dict[str, Any]], Meta(description=_CHOICES)] | None = None
    library: Annotated[dict[str, Any], Meta(description="a mapping")] | None = None
    environment: (
        Annotated[dict[str, str], Meta(description="a mapping of names to version strings")] | None
    ) = None
    # A CPU timing's pairs with the CPU anchor (measure/timing/on_cpu.py): the kernel's and the
    # anchor's on-CPU times, and why the machine counted as busy.
    cpu_kernel_s: SecondsList | None = None
    cpu_anchor_s: SecondsList | None = None
    cpu_busy: Text | None = None
    cpu_memory_s: SecondsList | None = None  # the memory anchor's on-CPU times

    def differs_beside_code(self, record: KernelRecord) -> bool:
        """Whether `record`'s autotune picks, code-changing versions or library settings may
        differ from this entry's (`gate/run_differences.py` names them); False only where
        none can: no choices of its own against recorded ones, the same versions and library
        settings, and cuDNN's per-process algorithm pick off."""
        autotune = record.autotune
        library = autotune.library if autotune else None
        versions = record.environment.versions() if record.environment else None
        return bool(
            (autotune and autotune.choices)
            or self.autotune is None
            or versions != self.environment
            or library != self.library
            or (library or {}).get("cudnn.benchmark") is True
        )


def parse_entry(raw: Any) -> BaselineEntry:
    """One kernel's entry of a baseline file; ValueError names the key, its value and what it
    should hold (a hand-edited or merged file must fail here, not in the comparison)."""
    if not isinstance(raw, dict):
        raise ValueError(f"the entry is a {type(raw).__name__}, expected a mapping")
    try:
        entry = msgspec.convert(raw, BaselineEntry)
    except msgspec.ValidationError as exc:
        raise ValueError(_what_is_wrong(raw, exc)) from None
    for choice in entry.autotune or ():
        if not isinstance(choice.get("kernel"), str) or not isinstance(choice.get("config"), dict):
            raise ValueError(f"autotune is {_short(entry.autotune)}, expected {_CHOICES}")
        if choice.get("key") is not None and not isinstance(choice["key"], list):
            raise ValueError(
                f"autotune key of {choice['kernel']} is {_short(choice['key'])}, "
                "expected a list or null"
            )
    if "n" not in raw:
        entry.n = len(entry.samples_s)
    return entry


def _what_is_wrong(raw: dict[str, Any], error: msgspec.ValidationError) -> str:
    """msgspec's `error` as "KEY is VALUE, expected WHAT (msgspec's words)"."""
    import msgspec.inspect

    found = re.search(r"`\$\.(\w+)|field `(\w+)`", str(error))
    key = found and (found[1] or found[2])
    fields = {f.name: f.type for f in msgspec.inspect.type_info(BaselineEntry).fields}
    if key not in fields:
        return str(error)
    value = _short(raw[key]) if key in raw else "missing"
    kinds = getattr(fields[key], "types", (fields[key],))  # T | None: its T
    expected = next(k.extra_json_schema for k in kinds if isinstance(k, msgspec.inspect.Metadata))
    return f"{key} is {value}, expected {expected['description']} ({error})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def finite_positive(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@dataclass
class Baseline:
    """A loaded (or just written) baseline file."""

    path: str
    device: str
    commit: str | None
    created: str
    tool: str
    entries: dict[str, BaselineEntry] = field(default_factory=dict)  # by node id
    schema_version: int = BASELINE_SCHEMA_VERSION

    def entry_for(self, record: KernelRecord) -> BaselineEntry | None:
        """The entry of this record: by node id, else by item name when that is unique (after a
        test file was moved, every kernel must not turn "new": a silently passing gate)."""
        entry = self.entries.get(record.nodeid)
        if entry is not None:
            return entry
        same_name = [e for e in self.entries.values() if e.name == record.name]
        return same_name[0] if len(same_name) == 1 else None


def detect_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit being measured: KERNELPRO_COMMIT, else `git rev-parse HEAD`, else GITHUB_SHA
    (on `pull_request` events GITHUB_SHA is the synthetic merge commit, not the one measured)."""
    explicit = os.environ.get("KERNELPRO_COMMIT")
    if explicit:
        return explicit.strip()
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("GITHUB_SHA") or None


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Read and validate a baseline; every problem is a `BaselineError` naming the fix."""
    import yaml

    target = Path(path)
    hint = _SAVE_HINT.format(path=target)

    def fail(what: str) -> BaselineError:
        return BaselineError(f"kernelpro baseline {target}: {what}. Fix: {hint}.")

    if not target.exists():
        raise fail("the file does not exist")
    if target.is_dir():
        raise fail("is a directory, not a YAML file")
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot be read ({exc.__class__.__name__}: {exc})") from exc
    if not text.strip():
        raise fail("the file is empty")
    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise fail(f"is not valid YAML{at} ({getattr(exc, 'problem', exc)})") from exc
    if data is None:
        raise fail("the file is empty")
    if not isinstance(data, dict):
        raise fail(f"the top level is a {type(data).__name__}, expected a mapping")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise fail(f"schema_version is {version!r}, expected an integer")
    if version < BASELINE_SCHEMA_VERSION:
        raise fail(
            f"it has schema version {version}, older than the version "
            f"{BASELINE_SCHEMA_VERSION} this pytest-kernelpro {__version__} reads"
        )
    if version > BASELINE_SCHEMA_VERSION:
        raise BaselineError(
            f"kernelpro baseline {target}: it has schema version {version}, newer than the "
            f"version {BASELINE_SCHEMA_VERSION} this pytest-kernelpro {__version__} reads. "
            f"Fix: upgrade pytest-kernelpro, or {hint}."
        )
    kernels = data.get("kernels")
    if not isinstance(kernels, dict):
        raise fail(f"'kernels' is {type(kernels).__name__}, expected a mapping")
    if not kernels:
        raise fail("'kernels' is empty, so every kernel would pass as new")
    entries: dict[str, BaselineEntry] = {}
    for key, raw in kernels.items():
        try:
            entries[str(key)] = parse_entry(raw)
        except ValueError as exc:
            raise fail(f"kernel {key!r}: {exc}") from None
    for name in ("device", "created", "tool"):
        if data.get(name) is not None and not isinstance(data.get(name), str):
            raise fail(f"{name} is {data.get(name)!r}, expected a string")
    commit = data.get("commit")
    if commit is not None and not isinstance(commit, str):
        raise fail(f"commit is {commit!r}, expected a string or null")
    return Baseline(
        path=str(target),
        device=data.get("device") or "",
        commit=commit,
        created=str(data.get("created") or ""),
        tool=str(data.get("tool") or ""),
        entries=entries,
        schema_version=version,
    )


def _unique_key_loader() -> type:
    """A SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last
    without a word, so a kernel entered twice by a bad merge would gate on either copy)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {seen[key] + 1}); each kernel "
                        "may appear once",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def unmatched(baseline: Baseline, records: Iterable[KernelRecord]) -> tuple[list[str], list[str]]:
    """(baseline entries no record of this run matched, records with no baseline entry): the
    check reports both, so neither a removed nor a new kernel passes without a word."""
    records = list(records)
    matched: set[int] = set()
    without: list[str] = []
    by_id = {id(entry): key for key, entry in baseline.entries.items()}
    for record in records:
        entry = baseline.entry_for(record)
        if entry is None:
            if record.timing:
                without.append(record.name)
        else:
            matched.add(id(entry))
    left = sorted(key for ident, key in by_id.items() if ident not in matched)
    return left, sorted(without)
