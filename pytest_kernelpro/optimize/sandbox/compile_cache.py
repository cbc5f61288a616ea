"""Each candidate's own compile caches, kept from its evaluation for its later runs.

A sandboxed process writes only its scratch directory, where HOME and TMPDIR point, so every
process used to start with cold caches: Triton's (`~/.triton/cache`: the kernels, and the C
launcher and `cuda_utils` modules it builds with the host compiler for each one), CUDA's JIT
ComputeCache (`~/.nv`) and torch inductor's. A candidate's profile, its re-timing as the winner
and its final re-measurement compiled again what its evaluation had compiled.

`CompileCaches` keeps them per candidate without letting one candidate write another's:

- every process gets the caches in its own scratch directory (`environment()` points
  TRITON_CACHE_DIR, CUDA_CACHE_PATH and TORCHINDUCTOR_CACHE_DIR there explicitly, so a
  session's own TRITON_CACHE_DIR never leaks in as a read-only path);
- after a candidate's evaluation the trusted side moves those directories out of its scratch
  into a store keyed by the SHA-256 of the candidate's code (`keep`); the store is never
  mounted writable into any sandbox;
- a later process for the same code (`seed`) starts with a copy of them in its own scratch:
  warm, and whatever it writes there goes away with that scratch.

So the only cache a process can write is its own copy, and the only one it starts from is
what the same code wrote before. Content that grew too large (`MAX_BYTES`), links and
anything but plain files and directories are not kept. The store is a temporary directory
removed by `close()` (and at exit).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import threading
import weakref
from collections.abc import MutableMapping
from pathlib import Path

from pytest_kernelpro.optimize.sandbox.safe_read import plain_dir

# Inside a process's scratch directory (relative to the directory HOME points at).
CACHE_DIRS = {
    "TRITON_CACHE_DIR": ".triton/cache",
    "CUDA_CACHE_PATH": ".nv/ComputeCache",
    "TORCHINDUCTOR_CACHE_DIR": ".cache/torchinductor",
}
MAX_BYTES = 512 * 1024 * 1024  # a candidate's caches above this are not kept


def code_key(code: str) -> str:
    """The store's key of a candidate: the SHA-256 of its code."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()[:32]


def point_caches(env: MutableMapping[str, str], home: Path) -> None:
    """Point the compile caches of `env` into `home` (a process's scratch HOME)."""
    for name, rel in CACHE_DIRS.items():
        env[name] = str(home / rel)


def _plain_size(root: Path, limit: int) -> int | None:
    """Bytes of the plain files under `root`; None when it holds anything else (a link, a
    device, a socket) or more than `limit` bytes."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                return None
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_nlink != 1:  # a hard link to a file outside: not the candidate's
                return None
            total += st.st_size
            if total > limit:
                return None
    return total


class CompileCaches:
    """The per-candidate store (module doc). Thread-safe; one per search."""

    def __init__(self, root: Path | None = None, *, max_bytes: int = MAX_BYTES) -> None:
        self._root = root
        self._owned = root is None
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.kept: dict[str, int] = {}  # key -> bytes kept
        self.seeded = 0  # processes started from a kept cache
        self._finalizer: weakref.finalize | None = None

    @property
    def root(self) -> Path:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="kernelpro-compile-caches-"))
                self._finalizer = weakref.finalize(
                    self, shutil.rmtree, str(self._root), ignore_errors=True
                )
            return self._root

    def keep(self, code: str, home: Path) -> int:
        """Move the caches a process of `code` wrote under `home` into the store (replacing
        what was kept for that code); the bytes kept (0: nothing, or not kept)."""
        # Directories all the way down from `home`: a link on the way (`.triton` pointing
        # at a directory of the user's) would move that directory into the store.
        found = [(rel, home / rel) for rel in CACHE_DIRS.values() if plain_dir(home, rel)]
        if not found:
            return 0
        total = 0
        for _, path in found:
            size = _plain_size(path, self.max_bytes - total)
            if size is None:
                return 0
            total += size
        key = code_key(code)
        target = self.root / key
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        for rel, path in found:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(staging / rel))
        with self._lock:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
            self.kept[key] = total
        return total

    def seed(self, code: str, home: Path) -> bool:
        """Copy what was kept for `code` into `home` (a new process's scratch HOME); False
        when nothing was kept."""
        if self._root is None:
            return False
        source = self._root / code_key(code)
        with self._lock:
            if not source.is_dir():
                return False
            for rel in CACHE_DIRS.values():
                if (source / rel).is_dir():
                    (home / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copytree(source / rel, home / rel, symlinks=True, dirs_exist_ok=True)
            self.seeded += 1
        return True

    def close(self) -> None:
        """Remove the store."""
        if self._owned and self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, object]:
        # Sent to a Dask worker with the profiler: the store stays on this machine.
        return {"_root": None, "_owned": True, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(None, max_bytes=int(state.get("max_bytes") or MAX_BYTES))  # type: ignore[misc]


__all__ = ["CACHE_DIRS", "MAX_BYTES", "CompileCaches", "code_key", "point_caches"]
