"""Shared test configuration: pytester, a GPU skip, fixed ceilings for exact roofline checks."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]


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
