"""The suite's garbage-collector settings (tests/conftest.py): the collected suite frozen,
pytester's parsed configs without the unraisable plugin's collections."""

from __future__ import annotations

import gc

import pytest
from _pytest.unraisableexception import gc_collect_iterations_key


def test_what_was_alive_after_collection_is_frozen() -> None:
    # Torch alone is hundreds of thousands of objects; a freeze that ran holds them.
    assert gc.get_freeze_count() > 100_000


def test_a_parsed_config_skips_the_unraisable_plugins_collections(
    pytester: pytest.Pytester,
) -> None:
    config = pytester.parseconfigure()
    assert config.stash[gc_collect_iterations_key] == 0
