"""Finished build-cache entries shipped between Dask workers.

A build task compiles a candidate's fast-path builds into its worker's cache
(`dask_tasks.build_task`); `pack_entries` packs the finished entries as one tar that travels
with the task's result, and the evaluating worker adds the ones its own cache lacks with
`install_entries` (on one machine they are already there). Each entry appears whole (one
rename) or not at all, as if that cache had built it; members that would land outside the
cache (absolute paths, `..`, links) are never extracted.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Build results bigger than this are not shipped between workers (the evaluating worker
# builds such a candidate itself, as a local search would without the prebuild).
MAX_SHIPPED_BUILD_BYTES = 256 * 1024 * 1024


def pack_entries(cache: Any, keys: Sequence[str]) -> bytes | None:
    """The complete cache entries of `keys` as one tar (None when there are none or they
    are too big to ship)."""
    buffer = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for key in dict.fromkeys(keys):
            entry = cache.lookup(key)
            if entry is None:
                continue
            tar.add(str(entry.path), arcname=f"{key[:2]}/{key}")
            count += 1
            if buffer.tell() > MAX_SHIPPED_BUILD_BYTES:
                return None
    return buffer.getvalue() if count else None


def install_entries(root: Path, packed: bytes) -> int:
    """Add the shipped entries this cache lacks; each appears whole (one rename) or not at
    all, like an entry the cache built itself. Returns how many were added."""
    root.mkdir(parents=True, exist_ok=True)
    added = 0
    with tempfile.TemporaryDirectory(dir=root, prefix="shipped-") as scratch:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            members = [m for m in tar.getmembers() if _safe_member(m)]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(scratch, members=members, filter="data")
            else:  # Python < 3.10.12: the members were checked above
                tar.extractall(scratch, members=members)  # noqa: S202
        for shard in Path(scratch).iterdir():
            for entry in shard.iterdir():
                target = root / shard.name / entry.name
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(entry, target)
                    added += 1
                except OSError:  # built or installed meanwhile by someone else
                    pass
    return added


def _safe_member(member: tarfile.TarInfo) -> bool:
    name = member.name
    return (
        not name.startswith(("/", "\\"))
        and ".." not in Path(name).parts
        and (member.isfile() or member.isdir())
    )


def cache_root(cache_dir: str | None) -> Path:
    """The build cache's folder: `cache_dir`, else the default one."""
    from pytest_kernelpro.optimize.build.cache import default_cache_dir

    return Path(cache_dir) if cache_dir else default_cache_dir()
