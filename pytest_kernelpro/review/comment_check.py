"""The type check of a report artifact before the PR comment reads it.

The report comes from a job that ran the pull request's code. Every field the comment reads
must have the type written in the tables below; a wrong type is an error that names the field
(`report.records[0].gate.change is '+10%' (str), expected a number`), and nothing is posted.
"""

from __future__ import annotations

from typing import Any

from pytest_kernelpro.errors import KernelproError

# What the comment reads from a report, and the type each must have: "num" (int or float,
# not bool), "int", "str", "bool", "dict", "list" (of str). None is always allowed.
_RECORD_FIELDS = {
    "name": "str",
    "outcome": "str",
    "message": "str",
    "device": "str",
    "efficiency": "num",
    "guidance": "str",
    "roofline": "dict",
    "timing": "dict",
    "gate": "dict",
}
_GATE_FIELDS = {
    "status": "str",
    "basis": "str",
    "reason": "str",
    "message": "str",
    "baseline_device": "str",
    "change": "num",
    "baseline_median_s": "num",
    "baseline_efficiency": "num",
    "tolerance": "num",
    "p_value": "num",
    "alpha": "num",
    "n_baseline": "int",
    "n_current": "int",
    "failed": "bool",
    "confirmation": "dict",
    "autotune_note": "str",
    "environment_note": "str",
    "environment_change": "dict",
}
_CONFIRMATION_FIELDS = {
    "current_median_s": "num",
    "n": "int",
    "reproduced": "bool",
    "change": "num",
    "p_value": "num",
}
_META_FIELDS = {
    "baseline_entries_without_kernel": "list",
    "kernels_without_baseline_entry": "list",
    "devices": "list",
    "device": "str",
    "commit": "str",
    "baseline_commit": "str",
    "torch": "str",
    "wall_s": "num",
}
_KIND_WORDS = {
    "num": "a number",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "dict": "an object",
    "list": "a list of strings",
}


def _type_ok(value: Any, kind: str) -> bool:
    if value is None:
        return True
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, {"str": str, "bool": bool, "dict": dict}[kind])


def _check_fields(data: Any, table: dict[str, str], where: str) -> None:
    if not isinstance(data, dict):
        raise KernelproError(
            f"kernelpro comment: {where} is {type(data).__name__}, expected an object; the "
            "report artifact is malformed (not written by pytest-kernelpro)"
        )
    for key, kind in table.items():
        value = data.get(key)
        if not _type_ok(value, kind):
            raise KernelproError(
                f"kernelpro comment: {where}.{key} is {value!r:.80} ({type(value).__name__}), "
                f"expected {_KIND_WORDS[kind]}; the report artifact is malformed (not written "
                "by pytest-kernelpro, or edited): nothing was posted"
            )


def check_report(report: Any) -> None:
    """Raise `KernelproError` naming the first field the comment needs that has a wrong type."""
    if not isinstance(report, dict):
        raise KernelproError(
            f"kernelpro comment: the report is {type(report).__name__}, expected an object"
        )
    records = report.get("records") or []
    if not isinstance(records, list):
        raise KernelproError(
            f"kernelpro comment: report.records is {type(records).__name__}, expected a list"
        )
    if report.get("meta") is not None:
        _check_fields(report["meta"], _META_FIELDS, "report.meta")
    for i, record in enumerate(records):
        where = f"report.records[{i}]"
        _check_fields(record, _RECORD_FIELDS, where)
        if not isinstance(record.get("name"), str):
            raise KernelproError(f"kernelpro comment: {where}.name is missing or not a string")
        if record.get("gate") is not None:
            _check_fields(record["gate"], _GATE_FIELDS, f"{where}.gate")
            if record["gate"].get("confirmation") is not None:
                _check_fields(
                    record["gate"]["confirmation"],
                    _CONFIRMATION_FIELDS,
                    f"{where}.gate.confirmation",
                )
        stats = (record.get("timing") or {}).get("stats")
        if stats is not None:
            _check_fields(stats, {"median_s": "num"}, f"{where}.timing.stats")
        if record.get("roofline") is not None:
            _check_fields(record["roofline"], {"bound": "str"}, f"{where}.roofline")
