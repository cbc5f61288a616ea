"""The content-addressed build cache: one directory per build key, never half written.

An entry is `ROOT/<key[:2]>/<key>/` holding the build's files and `entry.json` (status,
what was built, the compiler's log, how long it took). It is built in a temporary directory
under `ROOT/tmp/` and moved into place with one `rename`, so a reader sees either no entry
or a complete one, also when the builder is killed. Builders of the same key take an
exclusive `flock` on `ROOT/locks/<key>.lock` first and look again once they hold it: of two
concurrent builds of one source, one compiles and the other waits and gets its entry.

A compiler error is cached too (status "failed", with its message), so an identical broken
candidate is not compiled twice either; a timeout or a killed compiler is not cached.

A read-only cache (`writable=False`, the sandboxed worker's view) serves hits and builds
misses in a private temporary directory that it never publishes: code running in the
sandbox cannot put an entry there that a later candidate would load.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError

ENTRY_FILE = "entry.json"
CACHE_ENV = "KERNELPRO_BUILD_CACHE"
READONLY_ENV = "KERNELPRO_BUILD_CACHE_READONLY"
FORMAT_VERSION = 1  # bump when an entry's layout changes: old entries are not read


class BuildError(KernelproError):
    """A build failed. `message` is trimmed for a prompt; `log` is the compiler's output."""

    def __init__(self, message: str, log: str = "", *, cached: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.log = log
        self.cached = cached


class CacheableBuildError(BuildError):
    """A build failure that depends only on the inputs (a compiler error): cached."""


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`KERNELPRO_BUILD_CACHE`, else `$XDG_CACHE_HOME/kernelpro/build` (~/.cache/...)."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelpro" / "build"


def build_key(inputs: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of everything that decides a build's output."""
    canonical = json.dumps({"format": FORMAT_VERSION, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """A complete entry: its directory and its `entry.json`."""

    key: str
    path: Path
    meta: dict[str, Any]
    hit: bool  # found already built (by another build, or an earlier one)
    waited_s: float = 0.0  # time spent waiting for a concurrent builder of the same key
    published: bool = True  # False: built privately by a read-only cache

    @property
    def failed(self) -> bool:
        return self.meta.get("status") == "failed"


Producer = Callable[[Path], Mapping[str, Any]]
# Turns a compiler's command line into one that runs it in the candidates' sandbox:
# (command, scratch directory, other writable directories) -> the wrapped command line.
Confinement = Callable[[list[str], Path, list[Path]], list[str]]


SANDBOX_LINE = "kernelpro sandbox: "  # what the sandbox's setup prints once it holds


def sandbox_outcome(log: str) -> tuple[bool, str]:
    """(whether the sandbox's setup finished, the log without its lines) of a confined
    compile: a compile whose sandbox did not start failed for no fault of its source and
    must not be cached as a compiler error."""
    lines = log.splitlines(keepends=True)
    ours = [line for line in lines if line.startswith(SANDBOX_LINE)]
    started = any("setup failed" not in line for line in ours)
    return started, "".join(line for line in lines if not line.startswith(SANDBOX_LINE))


def confined_env(scratch: Path) -> dict[str, str]:
    """HOME and TMPDIR of a confined compile: fresh directories in its scratch folder (the
    rest of the file system is read-only there); PYTHONPATH with this package first, since
    the sandbox's setup (`python -m pytest_kernelpro.optimize.sandbox.isolation`) runs
    before the compiler, also where the package is importable only through PYTHONPATH."""
    package_root = str(Path(__file__).resolve().parents[3])
    env = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p
        )
    }
    for name, sub in (("HOME", ".home"), ("TMPDIR", ".tmp")):
        path = scratch / sub
        path.mkdir(exist_ok=True)
        env[name] = str(path)
    return env


class BuildCache:
    """See the module doc. `producer(dir)` writes a build's files into `dir` and returns the
    metadata to record; it raises `CacheableBuildError` for a failure worth caching."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, writable: bool | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        if writable is None:
            writable = os.environ.get(READONLY_ENV, "") not in ("1", "true", "yes")
        self.writable = writable
        # Set by the search's evaluator: its builds ahead of the worker run their compilers in
        # the candidates' sandbox (a candidate's source and flags are its input).
        self.confine: Confinement | None = None

    def __repr__(self) -> str:
        return f"BuildCache({str(self.root)!r}, writable={self.writable})"

    def path_of(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> CacheEntry | None:
        """The complete entry of `key`, or None."""
        path = self.path_of(key)
        try:
            meta = json.loads((path / ENTRY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return CacheEntry(key, path, meta, hit=True)

    def get_or_build(self, key: str, producer: Producer) -> CacheEntry:
        """The entry of `key`, built by `producer` unless it exists (or appears while this
        call waits for a concurrent builder). A cached failure raises its `BuildError`."""
        entry = self.lookup(key)
        if entry is None and not self.writable:
            entry = self._build_private(key, producer)
        elif entry is None:
            entry = self._build_locked(key, producer)
        if entry.failed:
            raise BuildError(
                str(entry.meta.get("message") or "build failed"),
                str(entry.meta.get("log") or ""),
                cached=entry.hit,
            )
        return entry

    def _build_locked(self, key: str, producer: Producer) -> CacheEntry:
        locks = self.root / "locks"
        try:
            locks.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KernelproError(
                f"build cache {self.root} is not writable ({exc}); set {CACHE_ENV} to a "
                "writable directory"
            ) from exc
        started = time.monotonic()
        with open(locks / f"{key}.lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            waited = time.monotonic() - started
            try:
                entry = self.lookup(key)  # built by whoever held the lock before us
                if entry is not None:
                    return CacheEntry(key, entry.path, entry.meta, hit=True, waited_s=waited)
                return self._build_into(key, producer, publish=True, waited=waited)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _build_private(self, key: str, producer: Producer) -> CacheEntry:
        folder = Path(tempfile.mkdtemp(prefix=f"kernelpro-build-{key[:12]}-"))
        return self._build_into(key, producer, publish=False, folder=folder)

    def _build_into(
        self,
        key: str,
        producer: Producer,
        *,
        publish: bool,
        waited: float = 0.0,
        folder: Path | None = None,
    ) -> CacheEntry:
        if folder is None:
            tmp_root = self.root / "tmp"
            tmp_root.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=f"{key[:16]}.", dir=tmp_root))
        started = time.monotonic()
        try:
            meta: dict[str, Any] = {"status": "ok", **producer(folder)}
        except CacheableBuildError as exc:
            meta = {"status": "failed", "message": exc.message, "log": exc.log}
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        meta.setdefault("build_s", time.monotonic() - started)
        meta["key"] = key
        _write_json_synced(folder / ENTRY_FILE, meta)
        if not publish:
            return CacheEntry(key, folder, meta, hit=False, published=False)
        final = self.path_of(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(folder, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                shutil.rmtree(folder, ignore_errors=True)
                raise
            # A complete entry got there first (a builder that took no lock): keep it.
            shutil.rmtree(folder, ignore_errors=True)
            existing = self.lookup(key)
            if existing is not None:
                return existing
            raise
        _fsync_dir(final.parent)
        return CacheEntry(key, final, meta, hit=False, waited_s=waited)


def _write_json_synced(path: Path, data: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, default=str)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
