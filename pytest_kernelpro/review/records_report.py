"""`kernelpro report LOG.jsonl`: the JSON report and a JUnit file rebuilt from a session's
records log (`gate/report.py`), which survives a killed or crashed session.

A collected kernel without a record (the session ended before it finished) is listed as
missing, and `--check` fails on missing records, on a session that never finished and on
failed kernels, so a CI step that runs it cannot pass a gate whose process died without
saying so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json, atomic_write_text
from pytest_kernelpro.gate.report_read import read_records_log
from pytest_kernelpro.record import KernelRecord

MISSING_KEY = "missing_record"  # record.extra flag of a kernel that left no record


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
    from pytest_kernelpro.gate.report import build_report

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
        atomic_write_json(args.json_out, build_report(records, meta=meta))
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
