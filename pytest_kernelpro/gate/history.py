"""Run history: one JSON report per pytest run under `.kernelpro/history/`.

Each run's report (the same JSON as `--kernelpro-json`, samples included) is kept as
`<UTC time>-<commit>-<machine>.json`, so runs are keyed by commit and machine and sort by
time. `kernelpro history` lists them and `kernelpro compare` takes two of them by reference
(`review/runs.py`).
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
from pathlib import Path
from typing import Any

from pytest_kernelpro.fileio import atomic_write_json

DEFAULT_HISTORY_DIR = Path(".kernelpro") / "history"


def machine_name() -> str:
    """The machine a run was measured on: its host name."""
    return platform.node() or "unknown-host"


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:limit] or "x"


def save_run(history_dir: str | Path, report: dict[str, Any]) -> Path:
    """Write `report` as a new history entry (atomically) and return its path."""
    meta = report.get("meta") or {}
    now = _dt.datetime.now(_dt.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    commit = str(meta.get("commit") or "nocommit")[:12]
    machine = _slug(str(meta.get("machine") or machine_name()))
    path = Path(history_dir) / f"{stamp}-{_slug(commit)}-{machine}.json"
    return atomic_write_json(path, report)
