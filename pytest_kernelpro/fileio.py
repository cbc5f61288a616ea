"""Atomic file writes: a report or baseline is either the old file or the whole new one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same directory and a rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; reports and baselines are shared files: honour the umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write `data` as indented JSON, atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def append_jsonl(path: str | os.PathLike[str], record: Any) -> None:
    """Append one JSON line and flush it to disk, so a crash loses at most the line in flight."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
