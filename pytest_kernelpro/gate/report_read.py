"""Reading back the records log `report.py` writes (its layout is described there). A log of
another schema version is refused with both versions named (a log from before the version was
written reads as version 1: its lines are the same). Kept apart from the writer: a session
writes this file and never reads it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.report import (
    RECORDS_LOG_SCHEMA_VERSION,
)
from pytest_kernelpro.record import KernelRecord, record_from_builtins


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
    raise KernelproError(
        f"records log {path} has schema version {version!r}; this pytest-kernelpro "
        f"{__version__} reads version {RECORDS_LOG_SCHEMA_VERSION}. Read it with the "
        "pytest-kernelpro that wrote it, or run the session again with this one"
    )
