"""Shared test configuration: pytester, a GPU skip, one ceilings cache for the suite."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import _pytest.pytester
import pytest
from suite_ceilings import suite_ceilings_dir

pytest_plugins = ["pytester", "left_running"]


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Files with a slow test first, each file's own order kept: `.ci/run`'s `--dist loadfile
    # --no-loadscope-reorder` hands whole files to the two workers in collection order, so a
    # long file left near the end keeps one worker busy while the other has nothing to take.
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)
    if _has_gpu() or os.environ.get("KERNELPRO_FORCE_GPU_TESTS"):
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU (set KERNELPRO_FORCE_GPU_TESTS=1 to run anyway)"
    )
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _inner_runs_without_pytest_benchmark(request: pytest.FixtureRequest) -> None:
    """pytest-benchmark (often preinstalled) breaks inner pytester runs under xdist: it
    warns in pytest_configure when it sees a worker. Inner runs are about this plugin only.
    pytester clears PYTEST_ADDOPTS when it starts, so this sets it afterwards. Its snapshots
    of sys.modules keep torch's modules (`_SnapshotKeepingTorch`)."""
    if "pytester" not in request.fixturenames:
        return
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr(_pytest.pytester, "SysModulesSnapshot", _SnapshotKeepingTorch)
    request.getfixturevalue("pytester")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:benchmark")


class _SnapshotKeepingTorch(_pytest.pytester.SysModulesSnapshot):
    """pytester's sys.modules snapshot, never dropping a torch module: one first imported
    during an inner run (torch._dynamo, by a reference's torch.manual_seed) leaves its
    operators registered in torch's C++ library; dropped and imported again by a later test,
    it fails there ("Only a single TORCH_LIBRARY can be used to register the namespace
    _inductor_test"), which turned 59 later tests of one process red."""

    def __init__(self, preserve: Callable[[str], bool] | None = None) -> None:
        def keep(name: str) -> bool:
            return name == "torch" or name.startswith("torch.") or bool(preserve and preserve(name))

        super().__init__(preserve=keep)


@pytest.fixture(scope="session", autouse=True)
def _one_ceilings_cache_for_the_suite(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Every plugin run of the suite shares one ceilings cache (KERNELPRO_CACHE_DIR, one for
    the whole run, xdist workers included: `suite_ceilings_dir`): the first run that needs
    the machine's ceilings measures them, the others read them, as a user's sessions do; a
    worker arriving during the other's probe waits for it (the probe's lock) instead of
    probing beside it, so the probe runs once and without the other probe as its load.
    Never the user's own cache (~/.cache): the suite neither reads numbers a user measured
    nor leaves its own behind. A test about the cache itself sets its own folder."""
    from pytest_kernelpro.measure.ceilings import CACHE_DIR_ENV

    folder = suite_ceilings_dir(
        tmp_path_factory.getbasetemp(), os.environ.get("PYTEST_XDIST_WORKER")
    )
    folder.mkdir(exist_ok=True)
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_DIR_ENV, str(folder))
    yield
    patch.undo()
