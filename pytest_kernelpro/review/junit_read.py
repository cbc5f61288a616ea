"""KernelRecords rebuilt from the `kernelpro.*` properties of a JUnit XML file
(`gate/junit.py` writes them): enough for `kernelpro comment JUNIT.xml`, without the timing
samples, which stay in the JSON report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.junit import PREFIX, ROOFLINE_KEYS, STATS_KEYS
from pytest_kernelpro.record import (
    AutotunePart,
    EnvironmentPart,
    KernelRecord,
    Part,
    RooflinePart,
    TimingPart,
    VerdictPart,
)

P = TypeVar("P", bound=Part)


def _num(value: str | None) -> float | int | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if number.is_integer() and "." not in value and "e" not in value.lower():
        return int(number)
    return number


def _outcome(case: Any) -> tuple[str, str | None]:
    if case.is_passed:
        return "passed", None
    results = list(case.result)
    message = results[0].message if results else None
    if case.is_skipped:
        return "skipped", message
    if case.is_error:
        return "error", message
    return "failed", message


def read_junit_records(path: str | os.PathLike[str]) -> list[KernelRecord]:
    """KernelRecords rebuilt from the `kernelpro.*` properties of a JUnit XML file.

    Test cases without kernelpro properties (ordinary tests) are ignored. The outcome comes
    from the test case's result (passed, failed, error, skipped).
    """
    from junitparser import JUnitXml, Properties, Property, TestSuite
    from junitparser.junitparser import JUnitXmlError

    target = Path(path)
    try:
        xml = JUnitXml.fromfile(str(target))
    except FileNotFoundError:
        raise KernelproError(
            f"JUnit file {target} does not exist; write it with `pytest --junitxml={target}`"
        ) from None
    except (OSError, JUnitXmlError, SyntaxError, ValueError) as exc:
        raise KernelproError(f"JUnit file {target} cannot be parsed: {exc}") from exc
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    records: list[KernelRecord] = []
    for suite in suites:
        for case in suite:
            props = {
                p.name: p.value
                for group in case.iterchildren(Properties)
                for p in group.iterchildren(Property)
                if p.name and p.name.startswith(PREFIX)
            }
            if not props:
                continue
            records.append(_record_from_props(props, case))
    return records


def _record_from_props(props: dict[str, str], case: Any) -> KernelRecord:
    def get(key: str) -> str | None:
        return props.get(PREFIX + key)

    outcome, message = _outcome(case)
    name = get("name") or case.name or "?"
    stats = {k: _num(get(k)) for k in STATS_KEYS if get(k) is not None}
    timing = {"stats": stats, "method": get("method"), "samples_s": []} if stats else None
    roofline: dict[str, Any] | None = {}
    for key in ROOFLINE_KEYS:
        raw = get(key)
        if raw is not None:
            roofline[key] = raw if key in ("bound", "peak_name") else _num(raw)
    gate = None
    if get("gate"):
        try:
            gate = json.loads(get("gate") or "")
        except json.JSONDecodeError:
            gate = None
    if gate is None and get("verdict"):
        gate = {
            "status": get("verdict"),
            "change": _num(get("change")),
            "p_value": _num(get("p_value")),
            "baseline_median_s": _num(get("baseline_median_s")),
            "basis": get("basis"),
        }
    efficiency = _num(get("efficiency"))
    try:
        peak_used = json.loads(get("peak_used") or "null")
    except json.JSONDecodeError:
        peak_used = None
    autotune, environment = _json_prop(get("autotune")), _json_prop(get("environment"))
    threshold = _num(get("threshold"))
    min_roofline = _num(get("min_roofline"))
    return KernelRecord(
        nodeid=get("nodeid") or f"{case.classname}::{case.name}",
        name=name,
        kernel=get("kernel") or name.split("[")[0],
        shape=get("shape"),
        language=get("language") or "pytorch",
        device=get("device") or "",
        device_kind=get("device_kind") or "cpu",
        outcome=outcome,
        message=message,
        timing=_part(TimingPart, timing),
        roofline=_part(RooflinePart, roofline or None),
        efficiency=None if efficiency is None else float(efficiency),
        peak_used=peak_used if isinstance(peak_used, dict) else None,
        threshold=0.05 if threshold is None else float(threshold),
        min_roofline=None if min_roofline is None else float(min_roofline),
        gate=_part(VerdictPart, gate),
        guidance=get("guidance"),
        wall_s=float(case.time or 0.0),
        autotune=_part(AutotunePart, autotune),
        environment=_part(EnvironmentPart, environment),
    )


def _part(part_type: type[P], data: Any) -> P | None:
    """The part of a JSON property (the JUnit edge), or None when absent or not of the
    part's shape (a property another tool wrote: the record keeps what it can read)."""
    if not data:
        return None
    try:
        return msgspec.convert(data, part_type)
    except msgspec.ValidationError:
        return None


def _json_prop(text: str | None) -> dict[str, Any] | None:
    """A JSON object property, or None when absent or not an object."""
    try:
        value = json.loads(text or "null")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
