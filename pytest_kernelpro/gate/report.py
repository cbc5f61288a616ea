"""The files a session writes of its records: the JSON report (one file, mergeable across
xdist workers and runs), its copy in the run history, and the records log.

JSON layout (schema 1)::

    {"schema_version": 1, "kind": "kernelpro-report", "tool": "pytest-kernelpro 0.1.0",
     "created": "...", "meta": {device(s), torch, commit, wall_s, options...},
     "summary": {"kernels": N, "failed": N, "by_status": {"ok": N, ...}},
     "records": [KernelRecord, ...]}

The records are written and read with msgspec at the file's edge (`record.record_builtins`,
`record.record_from_builtins`); a record that is not of the record's types is an error
naming the file and the record.

The run history keeps each run's report (samples included) as
`<UTC time>-<commit>-<machine>.json` under `.kernelpro/history/`, so runs are keyed by commit
and machine and sort by time; `kernelpro history` lists them and `kernelpro compare` takes two
of them by reference (`review/runs.py`).

**The records log** holds every finished kernel record, appended to a JSONL file as it
finishes. A session that is killed (SIGKILL, a CI timeout, an out-of-memory kill), crashes (a segfault)
or ends through `os._exit` never reaches pytest's session end, so the JSON report and the
JUnit file are never written. The log is written as the work goes, one fsync'd line per
event, so it keeps every record that finished:

    {"kind": "session", "schema_version": 1, "created": ..., "pid": ..., "args": [...]}
    {"kind": "collected", "nodeids": [...]}                               after collection
    {"kind": "record", "record": {...KernelRecord...}}                    one per item
    {"kind": "finished", "exitstatus": 0, "created": ...}                 at the session end

`kernelpro report LOG.jsonl` rebuilds the JSON report and a JUnit file from it
(`review/records_report.py`); a parent process reads its isolated child's records from it
(`run/isolate.py`). A log of another schema version is refused with both versions named (a
log from before the version was written reads as version 1: its lines are the same).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import append_jsonl, atomic_write_json
from pytest_kernelpro.gate.format import record_status
from pytest_kernelpro.record import (
    SCHEMA_VERSION,
    KernelRecord,
    record_builtins,
    record_from_builtins,
)

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
    """The report dict of one session: schema, session meta, summary and every record.

    `meta` is what the plugin knows about the session (device(s), torch version, commit,
    wall time, options); it is copied as given, with `devices` filled in from the records
    when missing.
    """
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


def write_json_report(path: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    """Write the report atomically (a reader never sees half a file)."""
    return atomic_write_json(path, report)


DEFAULT_HISTORY_DIR = Path(".kernelpro") / "history"


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


def records_of(report: dict[str, Any], source: str = "kernelpro report") -> list[KernelRecord]:
    """The KernelRecords of a report dict; `source` names the report in the error of a record
    that is not of the record's types."""
    records = report.get("records") or []
    return [
        record_from_builtins(r, source=f"{source}: records[{i}]") for i, r in enumerate(records)
    ]


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check one JSON report; a bad file is a KernelproError naming it."""
    target = Path(path)
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KernelproError(
            f"kernelpro report {target} does not exist; write it with "
            "`pytest --kernelpro-json=PATH` (default .kernelpro/kernelpro-report.json)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KernelproError(f"kernelpro report {target} cannot be read as JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise KernelproError(
            f"kernelpro report {target} is not a pytest-kernelpro JSON report (no "
            f"'kind': '{REPORT_KIND}'); pass the file written by --kernelpro-json"
        )
    version = data.get("schema_version")
    if type(version) is not int or version != REPORT_SCHEMA_VERSION:  # true == 1, 1.0 == 1
        raise KernelproError(
            f"kernelpro report {target} has schema version {version!r} (written by "
            f"{data.get('tool') or 'an unknown tool'}); this pytest-kernelpro {__version__} "
            f"reads version {REPORT_SCHEMA_VERSION}. Fix: write it again with "
            "`pytest --kernelpro-json` of this version, or read it with the version that wrote it"
        )
    if not isinstance(data.get("records"), list):
        raise KernelproError(f"kernelpro report {target}: 'records' is not a list")
    records_of(data, f"kernelpro report {target}")  # a record of the wrong types: named here
    return data


def merge_report_dicts(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge reports of xdist workers, shards or several runs into one.

    Records are keyed by node id; when two reports hold the same kernel, the later report
    wins (a re-run replaces the earlier result). The merged meta keeps the first report's
    options, the union of devices, the longest wall time (workers run in parallel) and the
    list of commits when they differ.
    """
    if not reports:
        raise KernelproError("kernelpro: no reports to merge")
    by_id: dict[str, dict[str, Any]] = {}
    for report in reports:
        for rec in report.get("records") or []:
            by_id[str(rec.get("nodeid"))] = rec
    metas = [r.get("meta") or {} for r in reports]
    meta = dict(metas[0])
    devices = sorted({d for m in metas for d in (m.get("devices") or [])})
    if devices:
        meta["devices"] = devices
    walls = [m.get("wall_s") for m in metas if isinstance(m.get("wall_s"), (int, float))]
    if walls:
        meta["wall_s"] = max(walls)
    commits = sorted({m.get("commit") for m in metas if m.get("commit")})
    if len(commits) > 1:
        meta["commits"] = commits
    meta["merged_from"] = len(reports)
    records = records_of({"records": list(by_id.values())}, "merged kernelpro reports")
    return build_report(records, meta=meta)


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
