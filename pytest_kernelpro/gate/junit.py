"""JUnit properties: what each kernel's test case carries in pytest's `--junitxml` file.

The plugin appends `junit_properties(record)` to `item.user_properties`; pytest's junitxml
plugin writes them as `<property name="kernelpro.*" value="..."/>` (any junit_family, no
`record_property` warning). `read_junit_records` turns them back into KernelRecords, enough
for `kernelpro comment JUNIT.xml` (no timing samples: those stay in the JSON report).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from pytest_kernelpro.errors import KernelproError
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

PREFIX = "kernelpro."
_RECORD_FIELDS = ("nodeid", "name", "kernel", "shape", "language", "device", "device_kind")
_STATS = ("median_s", "q1_s", "q3_s", "iqr_s", "ci_low_s", "ci_high_s", "rel_ci_halfwidth", "n")
_ROOFLINE = (
    "flops",
    "min_bytes",
    "intensity",
    "ridge",
    "bound",
    "peak_name",
    "roofline_time_s",
)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "nan"
    return str(value)


def junit_properties(record: KernelRecord) -> list[tuple[str, str]]:
    """(name, value) pairs for `item.user_properties`; values are strings, None is left out.

    The verdict travels as one compact JSON property (`kernelpro.gate`) so no field of it is
    lost; the scalar fields are also flat, for CI dashboards that read JUnit properties.
    """
    props: list[tuple[str, str]] = []

    def add(key: str, value: Any) -> None:
        if value is not None and value != "":
            props.append((PREFIX + key, _text(value)))

    for key in _RECORD_FIELDS:
        add(key, getattr(record, key))
    # The JUnit edge: each part in its JSON form.
    timing = msgspec.to_builtins(record.timing) if record.timing else {}
    stats = timing.get("stats") or {}
    for key in _STATS:
        add(key, stats.get(key))
    add("method", timing.get("method"))
    roofline = msgspec.to_builtins(record.roofline) if record.roofline else {}
    for key in _ROOFLINE:
        add(key, roofline.get(key))
    add("efficiency", record.efficiency)
    if record.peak_used:
        add("peak_used", json.dumps(record.peak_used, separators=(",", ":"), default=str))
    add("threshold", record.threshold)
    add("min_roofline", record.min_roofline)
    gate = msgspec.to_builtins(record.gate) if record.gate else {}
    add("verdict", gate.get("status"))
    add("change", gate.get("change"))
    add("p_value", gate.get("p_value"))
    add("baseline_median_s", gate.get("baseline_median_s"))
    add("basis", gate.get("basis"))
    # The time the verdict compared where it was not the wall median (gate/verdict.py).
    add("gated_label", gate.get("gated_label"))
    add("gated_median_s", gate.get("gated_now_s"))
    add("gated_baseline_median_s", gate.get("gated_baseline_s"))
    add("autotune_note", gate.get("autotune_note"))
    add("environment_note", gate.get("environment_note"))
    if gate:
        add("gate", json.dumps(gate, separators=(",", ":"), default=str))
    # What the item's autotuners chose and the versions it ran with (measure/environment.py),
    # as compact JSON.
    if record.autotune:
        add(
            "autotune",
            json.dumps(msgspec.to_builtins(record.autotune), separators=(",", ":"), default=str),
        )
    if record.environment:
        add("environment", json.dumps(record.environment.versions(), separators=(",", ":")))
    add("guidance", record.guidance)
    for section in record.sections:  # other plugins' properties (the optimizer's search)
        for key, value in section.junit:
            add(key, value)
    return props


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
    stats = {k: _num(get(k)) for k in _STATS if get(k) is not None}
    timing = {"stats": stats, "method": get("method"), "samples_s": []} if stats else None
    roofline: dict[str, Any] | None = {}
    for key in _ROOFLINE:
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
