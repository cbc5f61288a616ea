"""`kernelpro history` and the run references of `kernelpro compare`: the runs kept in the
run history (`gate/report.py` writes one JSON report per pytest run) listed and resolved.

A compare reference is:

- a path to a JSON report or a baseline YAML;
- `-1` (the latest timed run), `-2` (the one before), ...: runs that timed nothing
  (`--kernelpro-correctness-only`, every kernel skipped) are listed but not counted, since
  there is nothing in them to compare;
- a run id or its prefix (`kernelpro history` shows them), or a commit prefix (the latest
  run of that commit).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelpro.errors import KernelproError

DEFAULT_HISTORY_DIR = Path(".kernelpro") / "history"  # the history setting's default


@dataclass(frozen=True)
class RunInfo:
    """One stored run: its id (the file name without .json) and what identifies it."""

    path: Path
    created: str
    commit: str | None
    machine: str
    devices: list[str]
    kernels: int
    failed: int
    timed: int  # kernels with a timing: 0 for a correctness-only run
    correctness_only: bool

    @property
    def run_id(self) -> str:
        return self.path.stem

    @property
    def untimed_reason(self) -> str | None:
        """Why `kernelpro compare` passes this run over, or None when it has timings."""
        if self.correctness_only:
            return "correctness only"
        return None if self.timed else "nothing timed"


def _info(path: Path) -> RunInfo | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("kind") != "kernelpro-report":
        return None
    meta = data.get("meta") or {}
    summary = data.get("summary") or {}
    records = [r for r in data.get("records") or [] if isinstance(r, dict)]
    return RunInfo(
        path=path,
        created=str(data.get("created") or ""),
        commit=meta.get("commit"),
        machine=str(meta.get("machine") or "?"),
        devices=list(meta.get("devices") or []),
        kernels=int(summary.get("kernels") or 0),
        failed=int(summary.get("failed") or 0),
        timed=sum(1 for r in records if r.get("timing")),
        correctness_only=bool(meta.get("correctness_only"))
        or any((r.get("extra") or {}).get("correctness_only") for r in records),
    )


def list_runs(history_dir: str | Path) -> list[RunInfo]:
    """The stored runs, oldest first (unreadable files are passed over)."""
    folder = Path(history_dir)
    if not folder.is_dir():
        return []
    runs = [info for p in sorted(folder.glob("*.json")) if (info := _info(p)) is not None]
    return sorted(runs, key=lambda r: (r.path.name, r.created))


def resolve_run(ref: str, history_dir: str | Path) -> Path:
    """The file a compare reference names (see the module docstring)."""
    as_path = Path(ref)
    looks_like_a_file = "/" in ref or ref.lower().endswith((".json", ".yaml", ".yml"))
    if as_path.is_file() or looks_like_a_file:
        return as_path  # a missing file: the loader's error names it and the fix
    runs = list_runs(history_dir)
    where = f"the run history {history_dir}"
    if re.fullmatch(r"-\d+", ref):
        back = int(ref[1:])
        timed = [r for r in runs if r.untimed_reason is None]
        if back == 0 or back > len(timed):
            passed_over = len(runs) - len(timed)
            raise KernelproError(
                f"kernelpro: {ref} asks for timed run {back} from the end, but {where} holds "
                f"{len(timed)} timed run(s)"
                + (
                    f" ({passed_over} run(s) that timed nothing, such as correctness-only "
                    "runs, are not counted)"
                    if passed_over
                    else ""
                )
                + "; `kernelpro history` lists them"
            )
        return timed[-back].path
    by_id = [r for r in runs if r.run_id.startswith(ref)]
    if not by_id:
        by_id = [r for r in runs if r.commit and r.commit.startswith(ref)]
    if not by_id:
        raise KernelproError(
            f"kernelpro: {ref!r} is neither a file nor a run id or commit in {where} "
            f"({len(runs)} run(s)); pass a report path, -1/-2, or an id from `kernelpro history`"
        )
    return by_id[-1].path


def history_main(argv: Sequence[str] | None = None) -> int:
    """`kernelpro history [--dir DIR]`: list the stored runs, oldest first."""
    parser = argparse.ArgumentParser(
        prog="kernelpro history", description="List the runs kept in the run history."
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_HISTORY_DIR,
        help=f"History directory. Default: {str(DEFAULT_HISTORY_DIR)!r}",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    runs = list_runs(args.dir)
    if not runs:
        sys.stdout.write(
            f"no runs in {args.dir}; every pytest run with kernels adds one "
            "(kernelpro_history setting)\n"
        )
        return 0
    rows = [("ref", "run id", "commit", "machine", "kernels", "failed", "")]
    back = sum(1 for run in runs if run.untimed_reason is None)
    for run in runs:
        untimed = run.untimed_reason
        rows.append(
            (
                "" if untimed else f"-{back}",
                run.run_id,
                (run.commit or "-")[:12],
                run.machine,
                str(run.kernels),
                str(run.failed),
                f"{untimed}: `kernelpro compare` passes it over" if untimed else "",
            )
        )
        back -= 0 if untimed else 1
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )
    return 0
