"""The bytes a gather must move: the rows (elements) it selects, not its whole source.

On the H200 an honest `table.index_select(0, index)` (256 Ki rows of a 1 Mi x 256 fp32
table) failed the gate as "impossible" at 194% of its roofline: the whole 1 GiB table was
counted as read. These tests pin the count on the CPU (`measure/flops.gathered_source`,
`measure/roofline.needed_bytes`) and the impossibility rule on it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure.ceilings import Ceilings  # noqa: E402
from pytest_kernelpro.measure.roofline import (  # noqa: E402
    analyze_reference,
    impossible_failure,
    price_measured,
)

TRUSTED_GPU = {
    "device": "NVIDIA H200 (test)",
    "bandwidth_Bps": 4.0e12,
    "flops": {"fp32": 60e12, "fp64": 30e12, "bf16": 900e12},
    "source": "measured",
    "measured_at": "2026-12-05T00:00:00",
    "torch_version": "test",
    "details": {},
}
ROWS, WIDTH, PICKED = 4096, 64, 1024
F32 = 4


def _analysis(reference: Any, *inputs: Any) -> Any:
    return analyze_reference(reference, inputs, ceilings=Ceilings.from_dict(TRUSTED_GPU))


def _table_and_index(distinct: int) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(ROWS, WIDTH, generator=gen)
    index = torch.randperm(ROWS, generator=gen)[:distinct].repeat(PICKED // distinct)
    return table, index


@pytest.mark.parametrize("distinct", [PICKED, 16])
def test_index_select_counts_the_distinct_rows_it_reads(distinct: int) -> None:
    table, index = _table_and_index(distinct)
    analysis = _analysis(lambda t, i: t.index_select(0, i), table, index)
    out = PICKED * WIDTH * F32
    assert analysis.compulsory_bytes == distinct * WIDTH * F32 + index.numel() * 8 + out
    assert analysis.compulsory_bytes < ROWS * WIDTH * F32  # the table was counted whole before


def test_index_select_along_columns_counts_whole_columns() -> None:
    table, index = _table_and_index(PICKED)
    analysis = _analysis(lambda t, i: t.index_select(1, i % WIDTH), table, index)
    distinct_columns = int((index % WIDTH).unique().numel())
    out = ROWS * PICKED * F32
    assert analysis.compulsory_bytes == distinct_columns * ROWS * F32 + index.numel() * 8 + out


def test_an_embedding_modules_weight_counts_its_distinct_rows_in_the_minimum() -> None:
    embedding = torch.nn.Embedding(ROWS, WIDTH)
    tokens = torch.tensor([[1, 2, 3, 3], [1, 1, 7, 9]])
    analysis = _analysis(embedding, tokens)
    out = tokens.numel() * WIDTH * F32
    assert analysis.min_bytes == 5 * WIDTH * F32 + tokens.numel() * 8 + out


def test_a_source_also_read_whole_counts_whole() -> None:
    """`t.index_select(0, i) + t.sum()`: the sum reads the whole table, so it is compulsory."""
    table, index = _table_and_index(PICKED)
    analysis = _analysis(lambda t, i: t.index_select(0, i) + t.sum(), table, index)
    assert (
        analysis.compulsory_bytes == ROWS * WIDTH * F32 + index.numel() * 8 + PICKED * WIDTH * F32
    )


def test_gather_and_advanced_indexing_count_at_most_their_output() -> None:
    table, index = _table_and_index(PICKED)
    columns = torch.randint(0, WIDTH, (ROWS, 2), generator=torch.Generator().manual_seed(1))
    gathered = _analysis(lambda t, c: t.gather(1, c), table, columns)
    assert gathered.compulsory_bytes == 2 * ROWS * F32 + columns.numel() * 8 + 2 * ROWS * F32
    indexed = _analysis(lambda t, i: t[i], table, index)
    assert indexed.compulsory_bytes == 2 * PICKED * WIDTH * F32 + index.numel() * 8


def test_a_gather_at_its_bandwidth_is_not_impossible_and_one_beyond_it_is() -> None:
    """The H200's case, scaled down: the honest gather at 80% of the bandwidth its selected
    rows need passes; the same time against a tenth of the bytes (a result cached between
    calls would look so) fails."""
    table, index = _table_and_index(PICKED)
    ceilings = Ceilings.from_dict(TRUSTED_GPU)
    analysis = _analysis(lambda t, i: t.index_select(0, i), table, index)
    flushed = type("Timing", (), {"flushed_l2": True, "flush_reason": "on"})()
    selected = 2 * PICKED * WIDTH * F32 + index.numel() * 8  # rows read, output written
    honest = selected / TRUSTED_GPU["bandwidth_Bps"] / 0.8
    priced = price_measured(analysis.to_dict(), honest)
    assert priced is not None
    assert impossible_failure(asdict(priced), ceilings=ceilings, median_s=honest, timing=flushed) is None  # fmt: skip
    too_fast = honest / 10
    priced = price_measured(analysis.to_dict(), too_fast)
    assert priced is not None
    failure = impossible_failure(asdict(priced), ceilings=ceilings, median_s=too_fast, timing=flushed)  # fmt: skip
    assert failure is not None
    assert "impossible time" in failure
