"""The records log: every finished kernel record, appended to a JSONL file as it finishes.

A session that is killed (SIGKILL, a CI timeout, an out-of-memory kill), crashes (a segfault)
or ends through `os._exit` never reaches pytest's session end, so the JSON report and the
JUnit file are never written. The log is written as the work goes, one fsync'd line per
event, so it keeps every record that finished:

    {"kind": "session", "schema_version": 1, "created": ..., "pid": ..., "args": [...]}
    {"kind": "collected", "nodeids": [...]}                               after collection
    {"kind": "record", "record": {...KernelRecord...}}                    one per item
    {"kind": "finished", "exitstatus": 0, "created": ...}                 at the session end

`kernelpro report LOG.jsonl` rebuilds the JSON report and a JUnit file from it; a collected
kernel without a record (the session ended before it finished) is listed as missing, and
`--check` fails on missing records, on a session that never finished and on failed kernels,
so a CI step that runs it cannot pass a gate whose process died without saying so. A log of
another schema version is refused with both versions named (a log from before the version was
written reads as version 1: its lines are the same).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import append_jsonl, atomic_write_text
from pytest_kernelpro.record import (
    SCHEMA_VERSION,
    KernelRecord,
    record_builtins,
    record_from_builtins,
)

MISSING_KEY = "missing_record"  # record.extra flag of a kernel that left no record
RECORDS_LOG_SCHEMA_VERSION = SCHEMA_VERSION  # the records' (record.py)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RecordsLog:
    """Appends the session's events to one JSONL file (started fresh by each session)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def start(self, args: Sequence[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("", encoding="utf-8")  # a new session: the old log goes
        self._append(
            {
                "kind": "session",
                "schema_version": RECORDS_LOG_SCHEMA_VERSION,
                "created": _now(),
                "pid": os.getpid(),
                "args": list(args),
            }
        )

    def collected(self, nodeids: Sequence[str]) -> None:
        self._append({"kind": "collected", "nodeids": list(nodeids)})

    def record(self, record: KernelRecord) -> None:
        self._append({"kind": "record", "record": record_builtins(record)})

    def finished(self, exitstatus: int) -> None:
        self._append({"kind": "finished", "exitstatus": int(exitstatus), "created": _now()})

    def _append(self, event: dict[str, Any]) -> None:
        append_jsonl(self.path, event)


@dataclass
class LoggedSession:
    """What a records log holds: the records, the collected kernels, whether it finished."""

    records: list[KernelRecord] = field(default_factory=list)
    collected: list[str] | None = None  # None: the log has no collection line (xdist)
    finished: bool = False
    exitstatus: int | None = None
    created: str | None = None
    torn_lines: int = 0  # a last line cut off by the kill, not a record

    @property
    def missing(self) -> list[str]:
        """Collected kernels with no record: they did not finish."""
        if self.collected is None:
            return []
        done = {r.nodeid for r in self.records}
        return [n for n in self.collected if n not in done]


def read_records_log(path: str | os.PathLike[str]) -> LoggedSession:
    """Parse a records log; a torn last line (the kill hit mid-write) is counted, not fatal."""
    target = Path(path)
    try:
        lines = target.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise KernelproError(
            f"records log {target} does not exist; pytest writes it next to the JSON report "
            "(--kernelpro-json=PATH writes PATH with the suffix .jsonl)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KernelproError(f"records log {target} cannot be read: {exc}") from exc
    logged = LoggedSession()
    by_nodeid: dict[str, KernelRecord] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            if number == len(lines):
                logged.torn_lines += 1
                continue
            raise KernelproError(
                f"records log {target} line {number} is not JSON: {line[:80]!r}; the file "
                "was edited or written by something else"
            ) from None
        kind = event.get("kind") if isinstance(event, dict) else None
        if kind == "session":
            _check_version(target, event.get("schema_version", RECORDS_LOG_SCHEMA_VERSION))
            logged.created = event.get("created")
        elif kind == "collected":
            logged.collected = [str(n) for n in event.get("nodeids") or []]
        elif kind == "record":
            record = record_from_builtins(
                event.get("record"), source=f"records log {target} line {number}"
            )
            by_nodeid[record.nodeid] = record  # a re-run item (pytest-rerunfailures): last wins
        elif kind == "finished":
            logged.finished = True
            logged.exitstatus = event.get("exitstatus")
    logged.records = list(by_nodeid.values())
    return logged


def _check_version(path: Path, version: Any) -> None:
    if type(version) is int and version == RECORDS_LOG_SCHEMA_VERSION:  # not true, not 1.0
        return
    from pytest_kernelpro import __version__

    raise KernelproError(
        f"records log {path} has schema version {version!r}; this pytest-kernelpro "
        f"{__version__} reads version {RECORDS_LOG_SCHEMA_VERSION}. Read it with the "
        "pytest-kernelpro that wrote it, or run the session again with this one"
    )


def missing_record(nodeid: str, finished: bool) -> KernelRecord:
    """The record a rebuilt report gives a collected kernel that left none."""
    why = (
        "the session finished without a record for it (its process was replaced or the item "
        "never ran)"
        if finished
        else "the session ended before this kernel finished (killed, crashed, os._exit or "
        "out of memory); its record was never written"
    )
    name = nodeid.rsplit("::", 1)[-1]
    return KernelRecord(
        nodeid=nodeid,
        name=name,
        kernel=name.split("[")[0],
        outcome="failed",
        message=f"no record: {why}",
        extra={MISSING_KEY: True},
    )


def junit_xml(records: Sequence[KernelRecord]) -> str:
    """A JUnit XML document with one test case per record and the `kernelpro.*` properties."""
    import xml.etree.ElementTree as ET

    from pytest_kernelpro.gate.junit import junit_properties

    failed = [r for r in records if r.outcome in ("failed", "error")]
    skipped = [r for r in records if r.outcome == "skipped"]
    suite = ET.Element(
        "testsuite",
        name="kernelpro",
        tests=str(len(records)),
        failures=str(len(failed)),
        errors="0",
        skipped=str(len(skipped)),
        time=f"{sum(r.wall_s for r in records):.3f}",
    )
    for record in records:
        path, _, name = record.nodeid.rpartition("::")
        case = ET.SubElement(
            suite,
            "testcase",
            classname=path.removesuffix(".py").replace("/", "."),
            name=name or record.name,
            time=f"{record.wall_s:.3f}",
        )
        props = ET.SubElement(case, "properties")
        for key, value in junit_properties(record):
            ET.SubElement(props, "property", name=key, value=value)
        if record.outcome in ("failed", "error"):
            ET.SubElement(case, "failure", message=(record.message or record.outcome)[:2000])
        elif record.outcome == "skipped":
            ET.SubElement(case, "skipped", message=(record.message or "")[:2000])
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def report_main(argv: Sequence[str]) -> int:
    """`kernelpro report LOG.jsonl [--json OUT] [--junit OUT] [--check]`."""
    from pytest_kernelpro.gate.report import build_report, write_json_report

    parser = argparse.ArgumentParser(
        prog="kernelpro report",
        description="Rebuild the JSON report and a JUnit file from a session's records log "
        "(written as the kernels finish, so it survives a killed or crashed session)",
    )
    parser.add_argument("log", help="the records log, e.g. .kernelpro/kernelpro-report.jsonl")
    parser.add_argument("--json", dest="json_out", help="write the rebuilt JSON report here")
    parser.add_argument("--junit", dest="junit_out", help="write a JUnit XML file here")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a collected kernel has no record, the session never finished, or a "
        "kernel failed",
    )
    args = parser.parse_args(list(argv))
    try:
        logged = read_records_log(args.log)
    except KernelproError as exc:
        sys.stderr.write(f"kernelpro report: {exc}\n")
        return 2
    records = logged.records + [missing_record(n, logged.finished) for n in logged.missing]
    meta = {
        "rebuilt_from": str(args.log),
        "session_created": logged.created,
        "finished": logged.finished,
        "exitstatus": logged.exitstatus,
        "missing": logged.missing,
    }
    if args.json_out:
        write_json_report(args.json_out, build_report(records, meta=meta))
    if args.junit_out:
        atomic_write_text(args.junit_out, junit_xml(records))
    failed = [r for r in logged.records if r.outcome in ("failed", "error")]
    out = sys.stdout
    out.write(
        f"kernelpro report: {len(logged.records)} record(s), {len(logged.missing)} missing, "
        f"{len(failed)} failed; session {'finished' if logged.finished else 'did NOT finish'}"
        + (f" (exit status {logged.exitstatus})" if logged.finished else "")
        + "\n"
    )
    for nodeid in logged.missing:
        out.write(f"  missing: {nodeid}\n")
    if logged.torn_lines:
        out.write(f"  {logged.torn_lines} torn last line skipped (the process died writing it)\n")
    if not args.check:
        return 0
    problems = []
    if logged.missing:
        problems.append(f"{len(logged.missing)} collected kernel(s) have no record")
    if not logged.finished:
        problems.append("the session did not finish (killed, crashed or exited early)")
    elif logged.exitstatus not in (0, None):
        problems.append(f"the session exited with status {logged.exitstatus}")
    if failed:
        problems.append(f"{len(failed)} kernel(s) failed")
    for problem in problems:
        sys.stderr.write(f"kernelpro report --check: {problem}\n")
    return 1 if problems else 0
