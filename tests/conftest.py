"""Shared test configuration: pytester, a GPU skip, one ceilings cache for the suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = ["pytester", "left_running"]


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
    pytester clears PYTEST_ADDOPTS when it starts, so this sets it afterwards."""
    if "pytester" not in request.fixturenames:
        return
    request.getfixturevalue("pytester")
    request.getfixturevalue("monkeypatch").setenv("PYTEST_ADDOPTS", "-p no:benchmark")


@pytest.fixture(scope="session", autouse=True)
def _one_ceilings_cache_for_the_suite(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Every plugin run of the suite shares one ceilings cache (KERNELPRO_CACHE_DIR, one per
    xdist worker): the first run that needs the machine's ceilings measures them, the others
    read them, as a user's sessions do. Never the user's own cache (~/.cache): the suite
    neither reads numbers a user measured nor leaves its own behind. A test about the cache
    itself sets its own folder."""
    from pytest_kernelpro.measure.ceilings import CACHE_DIR_ENV

    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("ceilings-cache")))
    yield
    patch.undo()
