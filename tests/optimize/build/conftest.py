"""Fixtures of the build tests: nvcc (or a skip), and a fresh build cache per test."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildkit import require_tool

from pytest_kernelpro.optimize.build.cache import BuildCache


@pytest.fixture
def nvcc() -> str:
    return require_tool("nvcc")


@pytest.fixture
def cache(tmp_path: Path) -> BuildCache:
    return BuildCache(tmp_path / "cache", writable=True)
