"""The record of a kernel item: `KernelRecord` and its typed, frozen parts.

`kernel.py` holds the record, `parts.py` the parts (correctness, timing, roofline, verdict,
profile, autotune, environment) and their one conversion to and from the JSON form. The record imports nothing of
the package above it; the texts made from a record are `gate/`'s (format.py:
`item_section`, `terminal_row`; comment.py, ...).
"""

from pytest_kernelpro.record.kernel import PARTS, RECORD_PROPERTY, SCHEMA_VERSION, KernelRecord
from pytest_kernelpro.record.parts import (
    AutotunePart,
    CorrectnessPart,
    EnvironmentPart,
    Part,
    ProfilePart,
    RooflinePart,
    StatsPart,
    TimingPart,
    TolerancePart,
    VerdictPart,
)

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
    "StatsPart",
    "TimingPart",
    "TolerancePart",
    "VerdictPart",
]
