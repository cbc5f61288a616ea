"""The order the suite's files go out to the xdist workers (tests/suite_order.py,
tests/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from suite_order import LONGEST_FILES, TESTS_DIR, file_rank


def test_every_listed_file_exists_once() -> None:
    assert LONGEST_FILES
    missing = [name for name in LONGEST_FILES if not (TESTS_DIR / name).is_file()]
    assert missing == []
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)


def test_listed_files_go_first_in_their_order_then_slow_files_then_the_rest() -> None:
    longest = ("plugin/test_b.py", "plugin/test_a.py")
    a, b = TESTS_DIR / "plugin" / "test_a.py", TESTS_DIR / "plugin" / "test_b.py"
    slow, plain = TESTS_DIR / "test_slow.py", TESTS_DIR / "test_plain.py"
    outside = Path("/elsewhere/plugin/test_b.py")  # not under tests/: never a listed file
    ranks = {p: file_rank(p, {slow, a, outside}, longest) for p in (a, b, slow, plain, outside)}
    assert sorted(ranks, key=ranks.__getitem__) == [b, a, slow, outside, plain]


class _Item(SimpleNamespace):
    def get_closest_marker(self, name: str) -> object:
        return object() if name in self.markers else None

    def add_marker(self, marker: object) -> None:
        self.added.append(marker)


def test_the_suites_hook_puts_the_longest_file_first_each_files_tests_in_order(
    pytestconfig: pytest.Config,
) -> None:
    """tests/conftest.py's own hook (a copy of the module, loaded apart), on items collected
    plain file first and the longest file last."""
    spec = importlib.util.spec_from_file_location("suite_conftest_copy", TESTS_DIR / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    longest = TESTS_DIR / LONGEST_FILES[0]
    slow = TESTS_DIR / "test_suite_order.py"  # not listed; one test marked slow below
    plain = TESTS_DIR / "test_errors.py"
    assert slow.relative_to(TESTS_DIR).as_posix() not in LONGEST_FILES
    items = [
        _Item(name="plain-1", path=plain, markers=(), added=[]),
        _Item(name="slow-1", path=slow, markers=(), added=[]),
        _Item(name="long-1", path=longest, markers=(), added=[]),
        _Item(name="plain-2", path=plain, markers=(), added=[]),
        _Item(name="slow-2", path=slow, markers=("slow",), added=[]),
        _Item(name="long-2", path=longest, markers=(), added=[]),
    ]
    conftest.pytest_collection_modifyitems(pytestconfig, items)
    assert [i.name for i in items] == ["long-1", "long-2", "slow-1", "slow-2", "plain-1", "plain-2"]
