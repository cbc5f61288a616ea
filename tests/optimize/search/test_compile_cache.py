"""Each candidate's compile caches, kept from its evaluation for its later runs and never
shared with another candidate (optimize/sandbox/compile_cache.py, wired into the sandbox evaluator,
the candidate profiler and the re-measurement)."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest

from pytest_kernelpro.analysis import RooflineFacts
from pytest_kernelpro.optimize.candidate_profile.evaluator import CandidateProfiler, ProfileFailed
from pytest_kernelpro.optimize.sandbox.compile_cache import (
    CACHE_DIRS,
    CompileCaches,
    code_key,
    point_caches,
)
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

TRITON = CACHE_DIRS["TRITON_CACHE_DIR"]


def _home_with(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    home = tmp_path / name
    for rel, data in files.items():
        path = home / TRITON / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return home


def test_kept_caches_seed_only_the_same_code(tmp_path: Path) -> None:
    caches = CompileCaches(tmp_path / "store")
    (tmp_path / "store").mkdir()
    home = _home_with(tmp_path, "eval", {"abc/kernel.cubin": b"\x7fELF", "abc/launcher.so": b"so"})
    assert caches.keep("code A", home) == 6
    assert not (home / TRITON).exists()  # moved out of the scratch, not copied
    fresh = tmp_path / "profile"
    assert caches.seed("code A", fresh)
    assert (fresh / TRITON / "abc" / "kernel.cubin").read_bytes() == b"\x7fELF"
    # What the later process writes goes away with its scratch: the kept copy is unchanged.
    (fresh / TRITON / "abc" / "kernel.cubin").write_bytes(b"poisoned")
    again = tmp_path / "retime"
    assert caches.seed("code A", again)
    assert (again / TRITON / "abc" / "kernel.cubin").read_bytes() == b"\x7fELF"
    # Another candidate's code gets nothing.
    other = tmp_path / "other"
    assert not caches.seed("code B", other)
    assert not other.exists()
    assert caches.seeded == 2
    assert caches.kept == {code_key("code A"): 6}


def test_links_and_oversized_caches_are_not_kept(tmp_path: Path) -> None:
    caches = CompileCaches(tmp_path / "store", max_bytes=100)
    (tmp_path / "store").mkdir()
    linked = _home_with(tmp_path, "linked", {"k/ok.bin": b"1"})
    os.symlink("/etc/passwd", linked / TRITON / "k" / "passwd")
    assert caches.keep("code A", linked) == 0
    big = _home_with(tmp_path, "big", {"k/huge.bin": b"x" * 101})
    assert caches.keep("code B", big) == 0
    assert not caches.seed("code A", tmp_path / "a")
    assert not caches.seed("code B", tmp_path / "b")


def test_the_store_is_removed_on_close_and_stays_on_this_machine(tmp_path: Path) -> None:
    caches = CompileCaches()
    home = _home_with(tmp_path, "eval", {"k/a.bin": b"1"})
    assert caches.keep("code", home) == 1
    root = caches.root
    assert (root / code_key("code")).is_dir()
    # Pickled (a Dask worker's copy of the profiler): an empty store, not this path.
    copy = pickle.loads(pickle.dumps(caches))
    assert not copy.seed("code", tmp_path / "remote")
    caches.close()
    assert not root.exists()


def test_the_caches_point_into_the_processes_own_home(tmp_path: Path) -> None:
    env = {"TRITON_CACHE_DIR": "/home/user/.triton/cache"}  # a session's own setting
    point_caches(env, tmp_path / "home")
    assert env == {name: str(tmp_path / "home" / rel) for name, rel in CACHE_DIRS.items()}


ISOLATION = Isolation.probe()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)
REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(256)]


def get_init_inputs():
    return []
"""
FACTS = RooflineFacts(bound="memory", min_bytes=2048.0, flops=256.0, roofline_time_s=1e-7)


# How a write to the store is refused: hidden by the allow-list view, or visible read-only.
_REFUSED = r"(Read-only file system|No such file or directory)"


def _cache_probe(store: Path, tag: str) -> str:
    """A correct candidate that leaves a mark in its Triton cache, and fails (saying what it
    saw) when it starts with a mark there already or can write the store."""
    return f"""import os
from torch import nn

_dir = os.environ["TRITON_CACHE_DIR"]
_seen = sorted(os.listdir(_dir)) if os.path.isdir(_dir) else []
os.makedirs(_dir, exist_ok=True)
open(os.path.join(_dir, "mark-{tag}"), "w").write("{tag}")
try:
    open(os.path.join({str(store)!r}, "planted"), "w").write("x")
    _store = "writable"
except OSError as exc:
    _store = exc.strerror
if _seen or _store == "writable":
    raise RuntimeError(f"CACHE seen={{_seen}} store={{_store}}")


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x
"""


@needs_namespaces
@pytest.mark.slow
def test_a_profile_starts_from_its_own_candidates_caches_and_no_one_elses() -> None:
    task = KernelBenchTask(
        REFERENCE,
        name="double",
        device="cpu",
        timing={"warmup_ms": 1.0, "max_time_s": 0.02, "min_samples": 5, "max_samples": 10},
    )
    sandbox = SandboxEvaluator(task, SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0))
    try:
        store = sandbox.compile_caches.root
        a = Candidate(_cache_probe(store, "a"))
        first = sandbox.evaluate(a)
        assert first.status == "correct", first.reason
        assert first.metrics["compile_cache"] == "cold"
        assert code_key(a.code) in sandbox.compile_caches.kept
        profiler = CandidateProfiler(
            REFERENCE, FACTS, device="cpu", timeout_s=120, caches=sandbox.compile_caches
        )
        # Candidate a's profile starts with a's mark (warm) and cannot write the store. The
        # allow-list view (optimize/sandbox/view.py) hides /tmp, where the store lives, so the
        # write fails as "No such file or directory" rather than "Read-only file system";
        # either is a refusal (and nothing is planted, checked below).
        with pytest.raises(ProfileFailed, match=rf"CACHE seen=\['mark-a'\] store={_REFUSED}"):
            profiler(a, first)
        # Candidate b starts cold: a's cache is not its own.
        b = Candidate(_cache_probe(store, "b"))
        result = profiler(b, Evaluation(status="correct"))
        assert result["compile_cache"] == "cold"
        # a evaluated again (the same code at another node) starts warm too.
        again = sandbox.evaluate(a)
        assert again.metrics["compile_cache"].startswith("warm")
        assert again.status == "build_error"  # raised at import: its build phase
        assert re.search(rf"CACHE seen=\['mark-a'\] store={_REFUSED}", again.reason + again.logs)
        assert not (store / "planted").exists()
    finally:
        sandbox.close()
    assert not store.exists()
