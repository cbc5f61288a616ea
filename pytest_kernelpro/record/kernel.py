"""`KernelRecord`: the record of one kernel item, what every report, the gate and xdist
merging consume.

One record per kernel item, built by the item as it runs (each stage sets its own part) and
carried to the controller (also across pytest-xdist workers) as JSON in
`report.user_properties`. `to_dict` / `from_dict` are the one conversion to and from the
JSON form (the report, the records log, the xdist transport); the parts are typed
(`record.parts`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pytest_kernelpro.record.parts import (
    AutotunePart,
    CorrectnessPart,
    EnvironmentPart,
    Part,
    ProfilePart,
    RooflinePart,
    TimingPart,
    VerdictPart,
)

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

    def __setattr__(self, name: str, value: Any) -> None:
        # A part given in its JSON form (to the constructor or assigned) is read into its
        # type: the parts are always typed, whoever built the record.
        part = PARTS.get(name)
        if part is not None and isinstance(value, Mapping):
            value = part.from_dict(value)
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
