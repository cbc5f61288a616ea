"""Every tool's findings on every H200 capture in tests/data are what they were before the
tools became self-contained rules (`golden_findings.py` says what is snapshotted and how to
regenerate it after an intended change)."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from golden_findings import GOLDEN, snapshot


@functools.cache
def _now() -> dict[str, Any]:
    return snapshot()


@functools.cache
def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def _cases() -> list[tuple[str, ...]]:
    golden = _golden()
    cases = [
        ("captures", folder, kernel) for folder, ks in golden["captures"].items() for kernel in ks
    ]
    return cases + [("example_repo", name) for name in golden["example_repo"]]


@pytest.mark.parametrize("path", _cases(), ids=lambda p: "/".join(p[1:])[:90])
def test_findings_match_the_snapshot(path: tuple[str, ...]) -> None:
    want: Any = _golden()
    got: Any = _now()
    for key in path:
        want, got = want[key], got.get(key)
    assert got == want


def test_snapshot_covers_every_capture_and_fires_tools() -> None:
    now, golden = _now(), _golden()
    assert {f: sorted(ks) for f, ks in now["captures"].items()} == {
        f: sorted(ks) for f, ks in golden["captures"].items()
    }
    assert (
        sorted(now["example_repo"])
        == sorted(golden["example_repo"])
        == [
            "cuda_row_rms",
            "softmax_rows",
            "triton_softmax",
        ]
    )
    fired = {
        f["tool"]
        for ks in golden["captures"].values()
        for entry in ks.values()
        for run in entry.values()
        for f in run["findings"]
    }
    # Most built-in tools fire somewhere on the captures, so the snapshot pins their text.
    assert len(fired) >= 15
