"""The suite's one ceilings cache per run (tests/suite_ceilings.py, tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from suite_ceilings import suite_ceilings_dir

from pytest_kernelpro.measure.ceilings import CACHE_DIR_ENV


def test_both_xdist_workers_of_a_run_share_one_folder_inside_the_run(tmp_path: Path) -> None:
    run = tmp_path / "pytest-7"
    first = suite_ceilings_dir(run / "popen-gw0", "gw0")
    second = suite_ceilings_dir(run / "popen-gw1", "gw1")
    assert first == second == run / "ceilings-cache"
    # Another run's workers get their own.
    assert suite_ceilings_dir(tmp_path / "pytest-8" / "popen-gw0", "gw0") != first


def test_without_xdist_the_folder_is_inside_the_sessions_own(tmp_path: Path) -> None:
    session = tmp_path / "pytest-of-someone" / "pytest-7"
    # Not pytest-of-someone/, which holds the user's other runs.
    assert suite_ceilings_dir(session, None) == session / "ceilings-cache"


def test_this_session_uses_the_runs_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    expected = suite_ceilings_dir(tmp_path_factory.getbasetemp(), worker)
    assert Path(os.environ[CACHE_DIR_ENV]) == expected
    assert expected.is_dir()
