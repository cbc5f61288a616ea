"""The record of one kernel item: what every report, the gate and xdist merging consume.

One `KernelRecord` per kernel item, built by the item as it runs and carried to the
controller (also across pytest-xdist workers) as JSON in `report.user_properties`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

RECORD_PROPERTY = "kernelpro_record"  # user_properties key that carries the JSON record
SCHEMA_VERSION = 1


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
    correctness: dict[str, Any] | None = None  # CorrectnessResult.to_dict()
    timing: dict[str, Any] | None = None  # TimingResult.to_dict(), includes samples_s
    roofline: dict[str, Any] | None = None  # ReferenceAnalysis.to_dict()
    efficiency: float | None = None  # roofline time / measured median, 0..1 (can exceed 1)
    threshold: float = 0.05
    min_roofline: float | None = None
    gate: dict[str, Any] | None = None  # Verdict.to_dict()
    profile: dict[str, Any] | None = None  # ProfileReport.to_dict()
    guidance: str | None = None  # Markdown "Automated Bottleneck Analysis"
    wall_s: float = 0.0  # time the plugin spent on this item
    extra: dict[str, Any] = field(default_factory=dict)
    # Each setting a marker can override: {"value": ..., "source": "marker threshold=" | the
    # command line, environment, ini or conftest setting it came from | "built-in: ..."}
    # (`run.context.ItemSettings.to_dict`); None before the item chose its device.
    settings: dict[str, dict[str, Any]] | None = None

    @property
    def median_s(self) -> float | None:
        if not self.timing:
            return None
        stats = self.timing.get("stats") or {}
        value = stats.get("median_s")
        return None if value is None else float(value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> KernelRecord:
        return cls.from_dict(json.loads(text))
