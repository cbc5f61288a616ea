"""The chunked passes keep no tensor per chunk (`output_rule._two_stage_pass`): a small tensor
kept per chunk sat in the heap among the chunk's freed temporaries, so glibc could not reuse
their space for the next chunk's and the heap grew by about a chunk's temporaries per chunk."""

from __future__ import annotations

import weakref
from typing import Any

import pytest

from pytest_kernelpro.measure import output_rule

torch = pytest.importorskip("torch")


def test_no_chunks_row_or_place_outlives_its_chunk_and_the_table_is_the_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(output_rule, "COMPARE_CHUNK", 8)
    flat = torch.arange(40.0)  # chunks of 8: each chunk's first element is its start
    rows: list[Any] = []  # weak references to every row and place `quick` returned
    made: list[Any] = []  # their values, to compare the table with

    def quick(lo: int) -> tuple[Any, Any]:
        alive = [ref for ref in rows if ref() is not None]
        assert not alive, f"{len(alive)} tensors of earlier chunks still held at chunk {lo}"
        row = torch.tensor([float(lo), lo / 8.0, 0.5], dtype=torch.float64)
        at = torch.tensor(lo // 8 + 1)
        rows.extend([weakref.ref(row), weakref.ref(at)])
        made.append((row.clone(), int(at)))
        return row, at

    def full(lo: int) -> tuple[Any, Any]:  # the chunk at 16 is taken again
        return torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64), torch.tensor(7)

    def chunk(views: tuple[Any, ...], screen: bool) -> tuple[Any, Any]:
        (part,) = views
        lo = int(part[0])
        return full(lo) if screen else quick(lo)

    table, best = output_rule._two_stage_pass(
        torch, (flat,), chunk, lambda row: float(row[0]) != 16.0
    )
    expected = torch.stack([row for row, _ in made])
    expected[2] = -1.0
    assert torch.equal(table, expected)
    assert table.device.type == "cpu"
    # Each chunk's place made a flat index: its start plus the place in the chunk.
    assert best.device.type == "cpu"
    assert best.tolist() == [0 + 1, 8 + 2, 16 + 7, 24 + 4, 32 + 5]


def test_places_stay_none_where_the_pass_finds_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output_rule, "COMPARE_CHUNK", 8)
    table, best = output_rule._two_stage_pass(
        torch,
        (torch.arange(16.0),),
        lambda views, screen: (torch.tensor([0.0 if screen else float(views[0][0])]), None),
        lambda row: True,
    )
    assert table.tolist() == [[0.0], [8.0]]
    assert best is None
