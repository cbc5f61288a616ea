"""The files a session writes of its records: the JSON report (one file, mergeable across
xdist workers and runs), its copy in the run history, and the records log.

JSON layout (schema 1)::

    {"schema_version": 1, "kind": "kernelpro-report", "tool": "pytest-kernelpro 0.1.0",
     "created": "...", "meta": {device(s), torch, commit, wall_s, options...},
     "summary": {"kernels": N, "failed": N, "by_status": {"ok": N, ...}},
     "records": [KernelRecord, ...]}

The run history keeps each run's report (samples included) as
`<UTC time>-<commit>-<machine>.json` under `.kernelpro/history/`, so runs are keyed by commit
and machine and sort by time.

**The records log** holds every finished kernel record, appended to a JSONL file as it
finishes. A session that is killed (SIGKILL, a CI timeout, an out-of-memory kill), crashes (a segfault)
or ends through `os._exit` never reaches pytest's session end, so the JSON report and the
JUnit file are never written. The log is written as the work goes, one fsync'd line per
event, so it keeps every record that finished:

    {"kind": "session", "schema_version": 1, "created": ..., "pid": ..., "args": [...]}
    {"kind": "collected", "nodeids": [...]}                               after collection
    {"kind": "record", "record": {...KernelRecord...}}                    one per item
    {"kind": "finished", "exitstatus": 0, "created": ...}                 at the session end

`kernelpro report LOG.jsonl` rebuilds the JSON report and a JUnit file from it; a parent
process reads its isolated child's records from it (`report_read.py`).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.fileio import append_jsonl, atomic_write_json
from pytest_kernelpro.gate.format import record_status
from pytest_kernelpro.record import SCHEMA_VERSION, KernelRecord, record_builtins

REPORT_SCHEMA_VERSION = SCHEMA_VERSION  # the records' (record.py)
REPORT_KIND = "kernelpro-report"


def summarize(records: Sequence[KernelRecord]) -> dict[str, Any]:
    """Counts by status, and the names of the kernels that fail the gate."""
    statuses = Counter(record_status(r) for r in records)
    failed = [r.name for r in records if (r.gate and r.gate.failed) or r.outcome == "failed"]
    return {
        "kernels": len(records),
        "failed": len(failed),
        "failed_names": failed,
        "by_status": dict(sorted(statuses.items())),
    }


def build_report(records: Iterable[KernelRecord], *, meta: dict[str, Any]) -> dict[str, Any]:
    """The report dict of one session: schema, session meta (copied as given, `devices`
    filled in from the records when missing), summary and every record."""
    recs = list(records)
    meta = dict(meta)
    meta.setdefault("devices", sorted({r.device for r in recs if r.device}))
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "tool": f"pytest-kernelpro {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "meta": meta,
        "summary": summarize(recs),
        "records": [record_builtins(r) for r in recs],
    }


def machine_name() -> str:
    """The machine a run was measured on: its host name."""
    return platform.node() or "unknown-host"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:40] or "x"


def save_run(history_dir: str | Path, report: dict[str, Any]) -> Path:
    """Write `report` as a new history entry (atomically) and return its path."""
    meta = report.get("meta") or {}
    now = _dt.datetime.now(_dt.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    commit = str(meta.get("commit") or "nocommit")[:12]
    machine = _slug(str(meta.get("machine") or machine_name()))
    path = Path(history_dir) / f"{stamp}-{_slug(commit)}-{machine}.json"
    return atomic_write_json(path, report)


# -- the records log (module docstring) --

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
