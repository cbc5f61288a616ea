"""ncu raw-page parsing on the real H200 capture, plus locale-formatted numbers."""

from __future__ import annotations

import csv
import io

import pytest

from pytest_kernelpro.profile.ncu_csv import (
    detect_decimal_separator,
    find_header_line,
    first_launch_per_kernel,
    kernel_rows_by_name,
    parse_dim3,
    parse_ncu_raw_csv,
    parse_ncu_raw_table,
    parse_number,
    unable_to_access_metrics,
)

SPILL = "spill_kernel(const float *, float *, const int *, int)"
WMMA = "wmma_matmul_kernel(const __half *, const __half *, float *, int)"
NAIVE_SOFTMAX = "naive_softmax_kernel(const float *, float *, int, int)"
TRITON_SOFTMAX = "softmax_kernel"
CUBLAS_WGMMA = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


@pytest.fixture(scope="module")
def launches(probe_csv: str):
    return first_launch_per_kernel(parse_ncu_raw_csv(probe_csv))


def test_table_skips_program_output_and_reads_units(probe_csv: str) -> None:
    table = parse_ncu_raw_table(probe_csv)
    assert len(table.rows) == 51
    assert any(line.startswith("==PROF== Connected") for line in table.preamble)
    assert any("RESULTS {" in line for line in table.preamble)
    assert table.decimal_separator == "."
    assert table.units["gpu__time_duration.sum"] == "ns"
    assert table.units["dram__bytes_read.sum"] == "byte"
    assert table.rows[0].launch_id == 0
    assert table.rows[0].compute_capability == "9.0"


def test_spill_kernel_local_memory_traffic(launches) -> None:
    spill = launches[SPILL]
    assert spill.get("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum") == 63_476_927
    assert spill.get("l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum") == 8_391_828
    assert spill.get("smsp__sass_inst_executed_op_local_ld.sum") == 2_097_152
    assert spill.get("launch__registers_per_thread") == 20
    assert spill.metrics["gpu__time_duration.sum"].value == 198_560
    assert spill.metrics["gpu__time_duration.sum"].unit == "ns"
    assert spill.block_size == (256, 1, 1)
    assert spill.grid_size == (4096, 1, 1)
    # a kernel without local memory reads zero on the same counters
    assert launches[WMMA].get("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum") == 0


def test_wmma_uses_hmma_not_wgmma_while_cublas_uses_wgmma(launches) -> None:
    wmma = launches[WMMA]
    assert wmma.get("sm__inst_executed_pipe_tensor_op_hmma.sum") == 4_194_304
    assert wmma.get("sm__inst_executed_pipe_tensor_op_gmma.sum") == 0
    cublas = launches[CUBLAS_WGMMA]
    assert cublas.get("sm__inst_executed_pipe_tensor_op_gmma.sum") == 262_144
    assert cublas.get("launch__registers_per_thread") == 168


def test_naive_softmax_has_poor_sectors_per_request(launches) -> None:
    def sectors_per_request(name: str) -> float:
        k = launches[name]
        return k.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") / k.get(
            "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
        )

    # one thread per row: every lane of a 4-byte load hits its own 32-byte sector
    assert sectors_per_request(NAIVE_SOFTMAX) == 32.0
    # Triton's 128-bit loads: 32 lanes x 16 B = 512 B = 16 fully used sectors
    assert sectors_per_request(TRITON_SOFTMAX) == 16.0
    assert launches[NAIVE_SOFTMAX].get("sm__warps_active.avg.pct_of_peak_sustained_active") == 6.24


def test_strings_stay_strings(launches) -> None:
    spill = launches[SPILL]
    assert spill.text("launch__cluster_scheduling_policy") == "PolicySpread"
    assert spill.get("launch__cluster_scheduling_policy") is None
    assert spill.get("not_a_metric", 7.0) == 7.0
    assert "launch__grid_size" in spill


def test_repeated_launches_grouped_in_order(probe_csv: str) -> None:
    kernels = parse_ncu_raw_csv(probe_csv)
    groups = kernel_rows_by_name(kernels)
    assert sum(len(v) for v in groups.values()) == 51
    add = "void at::vectorized_elementwise_kernel<4, at::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3)"
    grids = [k.grid_size for k in groups[add]]
    assert grids == [
        (4096, 1, 1),
        (4096, 1, 1),
        (32768, 1, 1),
        (32768, 1, 1),
        (65536, 1, 1),
        (65536, 1, 1),
        (4096, 1, 1),
    ]
    assert first_launch_per_kernel(kernels)[add].grid_size == (4096, 1, 1)


def test_keep_and_requested_report_missing(probe_csv: str) -> None:
    requested = [
        "gpu__time_duration.sum",
        "sm__pipe_tma_cycles_active.avg.pct_of_peak_sustained_active",
    ]
    kernels = parse_ncu_raw_csv(probe_csv, keep=requested, requested=requested)
    assert set(kernels[0].metrics) == {"gpu__time_duration.sum"}
    assert kernels[0].missing == ("sm__pipe_tma_cycles_active.avg.pct_of_peak_sustained_active",)


def _relocalize(text: str, style: str) -> str:
    """The same table with every number rewritten in a European style."""
    lines = text.splitlines()
    start = find_header_line(lines)
    records = list(csv.reader(lines[start:]))
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(records[0])
    writer.writerow(records[1])
    for record in records[2:]:
        cells = []
        for i, cell in enumerate(record):
            if i >= 11 and parse_number(cell) is not None:
                if style == "de":
                    cell = cell.replace(",", "\0").replace(".", ",").replace("\0", ".")
                else:  # fr: narrow no-break space for thousands, comma for decimals
                    cell = cell.replace(",", "\u202f").replace(".", ",")
            cells.append(cell)
        writer.writerow(cells)
    return "\n".join(lines[:start]) + "\n" + out.getvalue()


@pytest.mark.parametrize("style", ["de", "fr"])
def test_european_locales_parse_to_the_same_values(probe_csv: str, style: str) -> None:
    original = parse_ncu_raw_table(probe_csv)
    localized_text = _relocalize(probe_csv, style)
    assert "1.056" in localized_text if style == "de" else "1\u202f056" in localized_text
    localized = parse_ncu_raw_table(localized_text)
    assert localized.decimal_separator == ","
    assert len(localized.rows) == len(original.rows)
    for a, b in zip(original.rows, localized.rows, strict=True):
        assert a.metrics.metrics == b.metrics.metrics


@pytest.mark.parametrize(
    ("cell", "decimal", "expected"),
    [
        ("1,234.5", ".", 1234.5),
        ("1.234,5", ",", 1234.5),
        ("1 234", ".", 1234.0),
        ("1\u00a0234,25", ",", 1234.25),
        ("1'234.5", ".", 1234.5),
        ("12,345,678", ".", 12345678.0),
        ("-0.5", ".", -0.5),
        ("1.5e+03", ".", 1500.0),
        ("n/a", ".", None),
        ("N/A", ",", None),
        ("(256, 1, 1)", ".", None),
        ("PolicySpread", ".", None),
        ("", ".", None),
    ],
)
def test_parse_number(cell: str, decimal: str, expected: float | None) -> None:
    assert parse_number(cell, decimal) == expected


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        (["13,472", "63.22"], "."),
        (["1.234.567", "0"], ","),
        (["0,02", "1.056"], ","),
        (["1,234.5"], "."),
        (["1.234,5"], ","),
        (["1,234"], "."),  # ambiguous alone: the default
        ([], "."),
    ],
)
def test_detect_decimal_separator(cells: list[str], expected: str) -> None:
    assert detect_decimal_separator(cells) == expected


def test_output_without_table_is_empty_and_trailing_lines_ignored(probe_csv: str) -> None:
    assert parse_ncu_raw_csv("==PROF== Connected\n==WARNING== No kernels were profiled.\n") == []
    tail = probe_csv + '\n==PROF== Disconnected from process 1\n"not","a","row"\n'
    assert len(parse_ncu_raw_csv(tail)) == 51


def test_unable_to_access_warning() -> None:
    # verbatim from the H200 `--set full` run (ncu_full_details.txt)
    line = (
        "==WARNING== Unable to access the following 6 metrics: ctc__rx_bytes_data_user.sum, "
        "ctc__rx_bytes_data_user.sum.pct_of_peak_sustained_elapsed, "
        "ctc__rx_bytes_data_user.sum.per_second, ctc__tx_bytes_data_user.sum, "
        "ctc__tx_bytes_data_user.sum.pct_of_peak_sustained_elapsed, "
        "ctc__tx_bytes_data_user.sum.per_second."
    )
    names = unable_to_access_metrics("==PROF== x\n" + line + "\n")
    assert len(names) == 6
    assert names[0] == "ctc__rx_bytes_data_user.sum"
    assert names[-1] == "ctc__tx_bytes_data_user.sum.per_second"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [("(256, 1, 1)", (256, 1, 1)), ("(2, 64, 1)", (2, 64, 1)), ("256", None), ("", None)],
)
def test_parse_dim3(cell: str, expected) -> None:
    assert parse_dim3(cell) == expected
