"""The files that hold records: each carries a schema version, reads back the records it was
written with, and refuses a file of another version or a corrupt one with an error naming the
file (and for a version: both versions and the fix). And the package keeps the record typed:
no module converts a record or a part to its dict form and back (checked from the source)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import msgspec
import pytest
from result_forms import PARTS

import pytest_kernelpro
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.baseline import BaselineError, load_baseline
from pytest_kernelpro.gate.baseline_save import save_baseline
from pytest_kernelpro.gate.report import REPORT_SCHEMA_VERSION, RecordsLog, build_report
from pytest_kernelpro.gate.report_read import read_records_log
from pytest_kernelpro.record import (
    CorrectnessPart,
    KernelRecord,
    SectionPart,
    StatsPart,
    TimingPart,
    VerdictPart,
    record_from_builtins,
)
from pytest_kernelpro.review.report_load import load_report, merge_report_dicts, records_of

PACKAGE = Path(pytest_kernelpro.__file__).parent
STORED = Path(__file__).parent.parent / "data" / "record" / "h200_records.json"


def _records() -> list[KernelRecord]:
    """The two stored H200 records and a CPU record with every kind of value the record
    holds (a section, an infinite error kept as text, settings, extra)."""
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    records = [record_from_builtins(d, source="h200_records.json") for d in stored]
    cpu = KernelRecord(
        nodeid="t.py::neg[64]",
        name="neg[64]",
        kernel="neg",
        device="cpu",
        outcome="failed",
        correctness=CorrectnessPart(passed=False, max_abs_err=float("inf"), trials=2),
        timing=TimingPart(samples_s=(1e-3, 2e-3), stats=StatsPart(median_s=1.5e-3, n=2)),
        gate=VerdictPart(status="new", failed=False, reason="no baseline"),
        settings={"threshold": {"value": 0.1, "source": "marker threshold="}},
        extra={"ceilings_trusted": True},
        sections=[SectionPart(title="t", terminal_lines=("a",), junit=(["k", "v"],))],
    )
    return [*records, cpu]


# -- round trips --


def test_the_json_report_gives_back_the_records_it_was_written_with(tmp_path: Path) -> None:
    records = _records()
    path = atomic_write_json(tmp_path / "r.json", build_report(records, meta={}))
    data = load_report(path)
    assert data["schema_version"] == REPORT_SCHEMA_VERSION
    assert records_of(data) == records
    assert records_of(data)[2].correctness.max_abs_err == "inf"


def test_merged_reports_keep_every_record_typed(tmp_path: Path) -> None:
    first, second, cpu = _records()
    a = atomic_write_json(tmp_path / "a.json", build_report([first, cpu], meta={}))
    b = atomic_write_json(tmp_path / "b.json", build_report([second], meta={}))
    merged = merge_report_dicts([load_report(a), load_report(b)])
    assert sorted(r.nodeid for r in records_of(merged)) == sorted(
        r.nodeid for r in (first, second, cpu)
    )
    assert {r.nodeid: r for r in records_of(merged)}[cpu.nodeid] == cpu


def test_the_records_log_gives_back_its_records(tmp_path: Path) -> None:
    records = _records()
    log = RecordsLog(tmp_path / "log.jsonl")
    log.start(["-x"])
    log.collected([r.nodeid for r in records])
    for record in records:
        log.record(record)
    log.finished(0)
    logged = read_records_log(log.path)
    assert logged.records == records
    assert logged.finished
    assert logged.missing == []


def test_a_history_run_is_a_report_and_carries_its_version(tmp_path: Path) -> None:
    from pytest_kernelpro.gate.report import save_run

    path = save_run(tmp_path / "history", build_report(_records(), meta={"commit": "abc"}))
    assert json.loads(path.read_text(encoding="utf-8"))["schema_version"] == REPORT_SCHEMA_VERSION
    assert records_of(load_report(path)) == _records()


# -- another version: refused, naming the file, both versions and the fix --


def test_a_report_of_another_version_names_both_versions_and_the_fix(tmp_path: Path) -> None:
    report = build_report(_records(), meta={})
    report["schema_version"] = REPORT_SCHEMA_VERSION + 1
    report["tool"] = "pytest-kernelpro 9.0.0"
    path = atomic_write_json(tmp_path / "r.json", report)
    with pytest.raises(KernelproError) as caught:
        load_report(path)
    text = str(caught.value)
    assert str(path) in text
    assert f"schema version {REPORT_SCHEMA_VERSION + 1}" in text
    assert f"reads version {REPORT_SCHEMA_VERSION}" in text
    assert "pytest-kernelpro 9.0.0" in text  # who wrote it
    assert "--kernelpro-json" in text  # the fix


def test_a_report_without_a_version_is_refused(tmp_path: Path) -> None:
    report = build_report(_records(), meta={})
    del report["schema_version"]
    path = atomic_write_json(tmp_path / "r.json", report)
    with pytest.raises(KernelproError, match=r"schema version None.*reads version 1"):
        load_report(path)


@pytest.mark.parametrize("version", ["true", "1.0", '"1"', "null"])
def test_a_version_that_only_compares_equal_to_1_is_refused(tmp_path: Path, version: str) -> None:
    """`true == 1` and `1.0 == 1` in Python: the version must be the integer itself."""
    path = atomic_write_json(tmp_path / "r.json", build_report(_records(), meta={}))
    text = path.read_text(encoding="utf-8").replace(
        '"schema_version": 1', f'"schema_version": {version}'
    )
    path.write_text(text, encoding="utf-8")
    with pytest.raises(KernelproError, match=r"reads version 1"):
        load_report(path)
    log = RecordsLog(tmp_path / "log.jsonl")
    log.start([])
    text = log.path.read_text(encoding="utf-8").replace(
        '"schema_version":1', f'"schema_version":{version}'
    )
    log.path.write_text(text, encoding="utf-8")
    with pytest.raises(KernelproError, match=r"reads version 1"):
        read_records_log(log.path)


def test_a_value_without_a_json_type_is_written_as_its_text(tmp_path: Path) -> None:
    """A path in `extra` (what json.dumps(default=str) did before): written, never a crash."""
    (record,) = _records()[2:]
    record.extra["where"] = tmp_path
    path = atomic_write_json(tmp_path / "r.json", build_report([record], meta={}))
    assert records_of(load_report(path))[0].extra["where"] == str(tmp_path)


def test_a_records_log_of_another_version_names_both_versions(tmp_path: Path) -> None:
    log = RecordsLog(tmp_path / "log.jsonl")
    log.start([])
    lines = log.path.read_text(encoding="utf-8").splitlines()
    lines[0] = lines[0].replace('"schema_version":1', '"schema_version":7')
    log.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(KernelproError) as caught:
        read_records_log(log.path)
    text = str(caught.value)
    assert str(log.path) in text
    assert "schema version 7" in text
    assert "reads version 1" in text
    assert "run the session again" in text


def test_a_baseline_of_another_version_names_both_versions_and_the_fix(tmp_path: Path) -> None:
    path = Path(save_baseline(tmp_path / "b.yaml", _records()[:1], commit="c").path)
    text = path.read_text(encoding="utf-8").replace("schema_version: 1", "schema_version: 2")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BaselineError) as caught:
        load_baseline(path)
    message = str(caught.value)
    assert str(path) in message
    assert "schema version 2" in message
    assert "version 1" in message
    assert "--kernelpro-save-baseline" in message


# -- corrupt files: the error names the file (and where in it) --


def test_a_truncated_report_names_the_file(tmp_path: Path) -> None:
    path = atomic_write_json(tmp_path / "r.json", build_report(_records(), meta={}))
    path.write_text(path.read_text(encoding="utf-8")[:500], encoding="utf-8")
    with pytest.raises(KernelproError, match=rf"report {path} cannot be read as JSON"):
        load_report(path)


def test_a_report_record_of_the_wrong_types_names_the_file_record_and_field(
    tmp_path: Path,
) -> None:
    report = build_report(_records(), meta={})
    report["records"][2]["timing"]["stats"]["median_s"] = "fast"
    path = atomic_write_json(tmp_path / "r.json", report)
    with pytest.raises(KernelproError) as caught:
        load_report(path)
    text = str(caught.value)
    assert f"kernelpro report {path}: records[2]" in text
    assert "$.timing.stats.median_s" in text


def test_a_report_record_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    report = build_report(_records(), meta={})
    report["records"].append("not a record")
    path = atomic_write_json(tmp_path / "r.json", report)
    with pytest.raises(KernelproError, match=r"records\[3\]: not a kernel record"):
        load_report(path)


def test_a_corrupt_line_in_the_records_log_names_the_file_and_line(tmp_path: Path) -> None:
    log = RecordsLog(tmp_path / "log.jsonl")
    log.start([])
    for record in _records():
        log.record(record)
    lines = log.path.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2][:40]  # a torn line that is not the last: the file was damaged
    log.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(KernelproError, match=rf"records log {log.path} line 3 is not JSON"):
        read_records_log(log.path)


def test_a_logged_record_of_the_wrong_types_names_the_file_and_line(tmp_path: Path) -> None:
    log = RecordsLog(tmp_path / "log.jsonl")
    log.start([])
    log.record(_records()[2])
    event = {"kind": "record", "record": {"nodeid": "n", "name": "n", "kernel": "n", "gate": 3}}
    with open(log.path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(event) + "\n")
    with pytest.raises(KernelproError) as caught:
        read_records_log(log.path)
    assert f"records log {log.path} line 3: not a kernel record" in str(caught.value)
    assert "$.gate" in str(caught.value)


def test_a_logged_record_event_without_a_record_is_refused(tmp_path: Path) -> None:
    log = RecordsLog(tmp_path / "log.jsonl")
    log.start([])
    with open(log.path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "record"}\n')
    with pytest.raises(KernelproError, match=r"line 2: not a kernel record"):
        read_records_log(log.path)


# -- the record stays typed inside the package (source check) --

# The record's and its parts' class names, and the names the package gives a record or a
# part (a record's fields, `record`): a dict conversion called on one of these is the round
# trip the typed record replaced. (A producer's own result, e.g. a tool's recommendation
# `rec`, keeps its JSON form for its own files.)
RECORD_TYPES = {"KernelRecord", *(part.__name__ for part in PARTS.values()), "SectionPart"}
RECORD_NAMES = {"record", "confirmed", "child", *PARTS, "sections"}
DICT_FORM = {"to_dict", "from_dict", "to_json", "from_json"}


def _receiver_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def dict_round_trips(source: str) -> list[str]:
    """Every call in `source` that converts a record or a part to or from a dict form: a
    `to_dict`-like method called on a record type or on a name the package gives a record or
    a part, and any `X.from_dict(Y.to_dict())`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, _receiver_name(node.func.value)
        if method not in DICT_FORM:
            continue
        if receiver in RECORD_TYPES or receiver in RECORD_NAMES:
            found.append(f"line {node.lineno}: {receiver}.{method}()")
        inner = node.args[0] if node.args else None
        if (
            method == "from_dict"
            and isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr == "to_dict"
        ):
            found.append(f"line {node.lineno}: from_dict(... .to_dict()) round trip")
    return found


def test_no_package_module_converts_a_record_to_a_dict_and_back() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = dict_round_trips(path.read_text(encoding="utf-8"))
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = found
    assert offenders == {}


@pytest.mark.parametrize(
    "attack",
    [
        "record.gate = VerdictPart.from_dict(verdict.to_dict())",
        "x = KernelRecord.from_dict(data)",
        "data = run.record.to_dict()",
        "timing = self.timing.to_dict()",
        "text = record.to_json()",
        "part = TimingPart.from_dict(load())",
        "again = Whatever.from_dict(other.to_dict())",
        "value = (record.roofline.to_dict() if record.roofline else None)",
    ],
)
def test_the_source_check_catches_each_form_of_the_round_trip(attack: str) -> None:
    assert dict_round_trips(attack), attack


def test_the_source_check_leaves_a_producers_own_form_alone() -> None:
    """A producer's JSON form for its own file (the ceilings cache, the tools' findings) is
    no record."""
    assert dict_round_trips("atomic_write_json(path, ceilings.to_dict())") == []
    assert dict_round_trips("out = [rec.to_dict() for rec in self.recommendations]") == []


def test_the_record_types_have_no_dict_conversion_to_call() -> None:
    """The JSON form is msgspec's, at a file's edge: a record or a part offers none of its own."""
    for kind in (KernelRecord, SectionPart, *PARTS.values()):
        assert not DICT_FORM & set(dir(kind)), kind.__name__
        assert issubclass(kind, msgspec.Struct)
