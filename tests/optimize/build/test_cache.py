"""The content-addressed cache: hits, misses, concurrent builders, failures, kills."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.build.cache import (
    ENTRY_FILE,
    BuildCache,
    BuildError,
    CacheableBuildError,
    build_key,
)


def writer(calls: list[str], text: str = "built"):
    def produce(folder: Path) -> dict:
        calls.append(folder.name)
        (folder / "out.bin").write_text(text)
        return {"what": text}

    return produce


def test_key_changes_with_every_input() -> None:
    base = {"source": "s", "flags": ["-O3"], "arch": "sm_90a", "compiler": "13.0", "torch": "2.11"}
    keys = {build_key(base)}
    for field, value in [("source", "s2"), ("flags", ["-O2"]), ("arch", "sm_80"),
                         ("compiler", "12.8"), ("torch", "2.10")]:  # fmt: skip
        keys.add(build_key({**base, field: value}))
    assert len(keys) == 6
    assert build_key(dict(reversed(list(base.items())))) == build_key(base)  # order-free


def test_miss_builds_once_then_hits(cache: BuildCache) -> None:
    calls: list[str] = []
    first = cache.get_or_build("ab" * 32, writer(calls))
    second = cache.get_or_build("ab" * 32, writer(calls))
    assert (first.hit, second.hit) == (False, True)
    assert len(calls) == 1
    assert second.path == first.path == cache.path_of("ab" * 32)
    assert (second.path / "out.bin").read_text() == "built"
    assert second.meta["what"] == "built"
    assert second.meta["status"] == "ok"
    other = cache.get_or_build("cd" * 32, writer(calls, "other"))
    assert not other.hit
    assert len(calls) == 2


def test_two_concurrent_builders_of_one_key_build_once(cache: BuildCache) -> None:
    """Threads open the lock file separately, so flock excludes them like processes."""
    calls: list[str] = []
    started, release = threading.Event(), threading.Event()

    def slow(folder: Path) -> dict:
        calls.append(folder.name)
        started.set()
        release.wait(30)
        (folder / "out.bin").write_text("slow")
        return {}

    results = {}

    def run(label: str) -> None:
        results[label] = cache.get_or_build("ef" * 32, slow)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second builder must wait for the first one's lock"
    release.set()
    first.join(30)
    second.join(30)
    assert len(calls) == 1
    assert results["first"].hit is False
    assert results["second"].hit is True
    assert results["second"].path == results["first"].path
    assert (results["second"].path / "out.bin").read_text() == "slow"


def test_failed_producer_leaves_no_entry(cache: BuildCache) -> None:
    def broken(folder: Path) -> dict:
        (folder / "half.bin").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cache.get_or_build("aa" * 32, broken)
    assert cache.lookup("aa" * 32) is None
    assert not list((cache.root / "tmp").iterdir())
    assert cache.get_or_build("aa" * 32, writer([])).hit is False  # a later build works


def test_compiler_errors_are_cached_with_their_message(cache: BuildCache) -> None:
    calls: list[str] = []

    def failing(folder: Path) -> dict:
        calls.append("x")
        raise CacheableBuildError("kernel.cu(3): error: bad", "full log")

    with pytest.raises(BuildError) as first:
        cache.get_or_build("bb" * 32, failing)
    with pytest.raises(BuildError) as second:
        cache.get_or_build("bb" * 32, failing)
    assert calls == ["x"]
    assert (first.value.cached, second.value.cached) == (False, True)
    assert second.value.message == "kernel.cu(3): error: bad"
    assert second.value.log == "full log"


def test_a_killed_builder_leaves_no_half_written_entry(cache: BuildCache, tmp_path: Path) -> None:
    """SIGKILL in the middle of writing: no entry appears, and the next build succeeds."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from pytest_kernelpro.optimize.build.cache import BuildCache
        def produce(folder):
            (folder / "out.bin").write_text("partial")
            os.kill(os.getpid(), signal.SIGKILL)
        BuildCache({str(cache.root)!r}).get_or_build({"cc" * 32!r}, produce)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), timeout=120)
    assert done.returncode == -9
    assert cache.lookup("cc" * 32) is None
    assert not cache.path_of("cc" * 32).exists()
    entry = cache.get_or_build("cc" * 32, writer([]))
    assert not entry.hit
    assert (entry.path / ENTRY_FILE).is_file()


def test_read_only_cache_serves_hits_and_never_publishes(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    BuildCache(root).get_or_build("dd" * 32, writer([], "published"))
    reader = BuildCache(root, writable=False)
    assert reader.get_or_build("dd" * 32, writer([])).hit
    private = reader.get_or_build("ee" * 32, writer([], "private"))
    assert not private.hit
    assert not private.published
    assert (private.path / "out.bin").read_text() == "private"
    assert BuildCache(root).lookup("ee" * 32) is None
    assert not (root / "locks").exists() or not list((root / "locks").glob("ee*"))


def test_read_only_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KERNELPRO_BUILD_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("KERNELPRO_BUILD_CACHE_READONLY", "1")
    cache = BuildCache()
    assert cache.root == tmp_path / "c"
    assert not cache.writable
