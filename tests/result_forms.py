"""The JSON form a measured result had before the record's parts held it (`record.part_of`
writes the parts from the results' attributes): what a test compares a part with. And the
record's parts by their field on `KernelRecord` (`PARTS`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pytest_kernelpro.record import (
    AutotunePart,
    CorrectnessPart,
    EnvironmentPart,
    Part,
    ProfilePart,
    RooflinePart,
    TimingPart,
    VerdictPart,
)

PARTS: dict[str, type[Part]] = {
    "correctness": CorrectnessPart,
    "timing": TimingPart,
    "roofline": RooflinePart,
    "gate": VerdictPart,
    "profile": ProfilePart,
    "autotune": AutotunePart,
    "environment": EnvironmentPart,
}


def correctness_json(result: Any) -> dict[str, Any]:
    """A `CorrectnessResult` as JSON-safe builtins: non-finite errors as "inf"/"nan" text,
    the rule's state (a live object, not a result) left out."""
    data = dataclasses.asdict(dataclasses.replace(result, rule_state=None))
    data.pop("rule_state")
    for key in ("max_abs_err", "max_rel_err", "worst_ratio", "kernel_error", "reference_error"):
        if data[key] is not None and not math.isfinite(data[key]):
            data[key] = str(data[key])
    data["worst_index"] = None if result.worst_index is None else list(result.worst_index)
    data["notes"] = list(result.notes)
    return data
