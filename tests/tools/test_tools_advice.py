"""The tools' words are data (`pytest_kernelpro/tools/advice.yaml`): every entry a tool looks
up exists, every entry is used by some tool, and a missing one fails with its name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pytest_kernelpro.tools as tools_pkg
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.tools import ToolRegistry, advice

SOURCES = {
    p.name: p.read_text(encoding="utf-8") for p in Path(tools_pkg.__file__).parent.glob("*.py")
}
ACTION_CALL = re.compile(
    r'action\(\s*"([a-z0-9_]+)",\s*(?:"([a-z0-9_]+)" if \w+ else "([a-z0-9_]+)"|"([a-z0-9_]+)")'
)
EXAMPLE_CALL = re.compile(r'example\("([a-z0-9_]+)"\)')


def _used_actions() -> set[tuple[str, str]]:
    used = set()
    for text in SOURCES.values():
        for m in ACTION_CALL.finditer(text):
            for key in m.groups()[1:]:
                if key:
                    used.add((m.group(1), key))
    return used


def test_every_action_looked_up_exists_and_every_action_is_used() -> None:
    used = _used_actions()
    data = {(tool, key) for tool, texts in advice.ACTIONS.items() for key in texts}
    assert len(data) >= 40
    assert used == data
    assert set(advice.ACTIONS) <= set(ToolRegistry.builtin().names())


def test_every_example_looked_up_exists_and_every_example_is_used() -> None:
    used = {m.group(1) for text in SOURCES.values() for m in EXAMPLE_CALL.finditer(text)}
    stall_codes = {a.code for a in advice.STALL_ADVICE.values() if a.code}
    by_text = {v: k for k, v in advice.EXAMPLES.items()}
    assert used | {by_text[c] for c in stall_codes} == set(advice.EXAMPLES)


def test_missing_entries_name_what_exists() -> None:
    with pytest.raises(
        KernelproError, match="No recommendation 'nope' for tool 'small_grid'.*more_blocks"
    ):
        advice.action("small_grid", "nope")
    with pytest.raises(KernelproError, match="No code example 'nope'.*float4"):
        advice.example("nope")


def test_fields_are_filled_from_measured_values() -> None:
    text = advice.action("launch_overhead", "fuse_distinct_kernels", distinct="3")
    assert text.startswith("Fuse the 3 distinct kernels of each call")
    assert "{" not in text
