"""Reading a JSON report back (`gate/report.py` writes it and describes its layout): one file
checked (`load_report`), its records (`records_of`), several merged (`merge_report_dicts`). A
report of another schema version is refused with both versions named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.report import REPORT_KIND, REPORT_SCHEMA_VERSION, build_report
from pytest_kernelpro.record import KernelRecord, record_from_builtins


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
