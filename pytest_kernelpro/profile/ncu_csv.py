"""Parse Nsight Compute's `--csv --page raw` output into `KernelMetrics`.

The raw page is wide: a header row (`"ID"`, ... `"CC"`, then one column per metric), a units
row that is blank under the identification columns, then one row per profiled kernel launch.
ncu prints `==PROF==`/`==WARNING==` lines and the profiled program's own stdout around it, so
the parser looks for the header instead of trusting the first line.

Numbers carry the thousands separators of the machine's locale ("1,234.5", "1.234,5",
"1 234", "1'234"); the decimal separator is decided once per table from the unambiguous
cells, then every cell is read with it. Cells that are not numbers ("n/a", "PolicySpread",
"(256, 1, 1)") stay strings, so `KernelMetrics.get` returns its default for them.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_kernelpro.profile.model import KernelMetrics, MetricValue

# The identification columns ncu puts before the metrics (2023.x .. 2025.3).
ID_COLUMNS: tuple[str, ...] = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
)
# Columns that some ncu versions add and that are never metrics.
_EXTRA_ID_COLUMNS = frozenset({"Demangled Name", "Mangled Name", "Function Name", "NVTX"})

# Spaces used as thousands separators: ASCII, no-break, narrow no-break, thin.
_SPACE_SEPARATORS = " \u00a0\u202f\u2009"
_APOSTROPHES = "'\u2019"
_NUMBER_CHARS = re.compile(r"^[+-]?[0-9][0-9.,'\u2019 \u00a0\u202f\u2009]*([eE][+-]?[0-9]+)?$")
_NOT_A_NUMBER = frozenset({"n/a", "N/A", "nan", "NaN", "-", ""})


@dataclass
class NcuRow:
    """One profiled launch: the identification columns plus its metrics."""

    ids: dict[str, str]
    metrics: KernelMetrics

    @property
    def launch_id(self) -> int | None:
        text = self.ids.get("ID", "")
        return int(text) if text.isdigit() else None

    @property
    def compute_capability(self) -> str | None:
        return self.ids.get("CC") or None


@dataclass
class NcuTable:
    """The whole raw page: rows in launch order and the decimal separator that was used."""

    rows: list[NcuRow] = field(default_factory=list)
    metric_names: tuple[str, ...] = ()
    units: dict[str, str] = field(default_factory=dict)
    decimal_separator: str = "."
    preamble: tuple[str, ...] = ()  # the ==PROF== / program lines before the header


def find_header_line(lines: Sequence[str]) -> int | None:
    """Index of the raw page's header line (the first that starts with `"ID"`), or None."""
    for index, line in enumerate(lines):
        stripped = line.lstrip("\ufeff").lstrip()
        if stripped.startswith('"ID"') or stripped.startswith("ID,"):
            return index
    return None


def detect_decimal_separator(cells: Iterable[str]) -> str:
    """Decide whether the table writes decimals with "." or "," from its unambiguous cells.

    A cell with both separators decides by which comes last; a single separator followed by
    a digit group that is not exactly three long ("0,02", "63.22", "1.5") must be decimal;
    a separator that occurs twice ("1,234,567") must be a thousands separator. "1,234"
    alone proves nothing. The majority of the evidence wins; ties and no evidence give ".".
    """
    votes = {".": 0, ",": 0}
    for raw in cells:
        if abs(votes["."] - votes[","]) >= 64:
            break  # decided; a wide table has tens of thousands of cells
        cell = raw.strip()
        if not cell or not _NUMBER_CHARS.match(cell):
            continue
        mantissa = re.split(r"[eE]", cell)[0]
        has_dot, has_comma = "." in mantissa, "," in mantissa
        if has_dot and has_comma:
            votes["." if mantissa.rfind(".") > mantissa.rfind(",") else ","] += 1
            continue
        for sep, other in ((".", ","), (",", ".")):
            count = mantissa.count(sep)
            if count == 0:
                continue
            if count > 1:
                votes[other] += 1  # repeated: thousands separator, so the decimal is the other
                continue
            tail = mantissa.rsplit(sep, 1)[1]
            if len(tail) != 3 or mantissa.lstrip("+-").startswith("0" + sep):
                votes[sep] += 1
    return "," if votes[","] > votes["."] else "."


def parse_number(cell: str, decimal_separator: str = ".") -> float | None:
    """Read one ncu value written with any thousands separator; None if it is not a number."""
    text = cell.strip()
    if text in _NOT_A_NUMBER or not _NUMBER_CHARS.match(text):
        return None
    for ch in _SPACE_SEPARATORS + _APOSTROPHES:
        text = text.replace(ch, "")
    thousands = "," if decimal_separator == "." else "."
    text = text.replace(thousands, "")
    if decimal_separator == ",":
        text = text.replace(",", ".")
    if text.count(".") > 1:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_dim3(cell: str) -> tuple[int, int, int] | None:
    """Read a block or grid size cell such as "(256, 1, 1)"; None if it has no three ints."""
    inner = cell.strip().strip("()[]")
    parts = [p for p in re.split(r"[,;]\s+|\s*;\s*|\s*x\s*", inner) if p.strip()]
    if len(parts) != 3:
        return None
    try:
        values = [int(re.sub(r"[^0-9]", "", p)) for p in parts]
    except ValueError:
        return None
    return (values[0], values[1], values[2])


def _dims_from_metrics(metrics: dict[str, MetricValue], prefix: str) -> tuple[int, int, int] | None:
    # launch__block_dim_{x,y,z} / launch__grid_dim_{x,y,z} are exact and locale-proof.
    values = []
    for axis in "xyz":
        entry = metrics.get(f"{prefix}_{axis}")
        if entry is None or isinstance(entry.value, str):
            return None
        values.append(int(entry.value))
    return (values[0], values[1], values[2])


def parse_ncu_raw_table(text: str) -> NcuTable:
    """Parse the raw page into an `NcuTable`; an output without a header gives an empty table."""
    lines = text.splitlines()
    header_at = find_header_line(lines)
    if header_at is None:
        return NcuTable(preamble=tuple(lines))
    records = list(csv.reader(lines[header_at:]))
    header = [h.strip() for h in records[0]]
    width = len(header)
    id_positions = {
        i: name for i, name in enumerate(header) if name in ID_COLUMNS or name in _EXTRA_ID_COLUMNS
    }
    metric_positions = [i for i in range(width) if i not in id_positions]

    units: dict[str, str] = {}
    body: list[list[str]] = []
    for record in records[1:]:
        if len(record) != width:
            continue  # program output or ==PROF== lines printed after the table
        first = record[0].strip()
        if not first and not units:
            units = {header[i]: record[i].strip() for i in metric_positions}
            continue
        if first.isdigit():
            body.append(record)

    decimal = detect_decimal_separator(record[i] for record in body for i in metric_positions)
    table = NcuTable(
        metric_names=tuple(header[i] for i in metric_positions),
        units=units,
        decimal_separator=decimal,
        preamble=tuple(lines[:header_at]),
    )
    for record in body:
        ids = {name: record[i].strip() for i, name in id_positions.items()}
        metrics: dict[str, MetricValue] = {}
        for i in metric_positions:
            name = header[i]
            cell = record[i].strip()
            number = parse_number(cell, decimal)
            metrics[name] = MetricValue(
                name=name, value=cell if number is None else number, unit=units.get(name, "")
            )
        block = _dims_from_metrics(metrics, "launch__block_dim") or parse_dim3(
            ids.get("Block Size", "")
        )
        grid = _dims_from_metrics(metrics, "launch__grid_dim") or parse_dim3(
            ids.get("Grid Size", "")
        )
        kernel = KernelMetrics(
            kernel_name=ids.get("Kernel Name", ""),
            metrics=metrics,
            block_size=block,
            grid_size=grid,
        )
        table.rows.append(NcuRow(ids=ids, metrics=kernel))
    return table


def parse_ncu_raw_csv(
    text: str,
    *,
    keep: Iterable[str] | None = None,
    requested: Iterable[str] | None = None,
) -> list[KernelMetrics]:
    """Parse ncu `--csv --page raw` output into one `KernelMetrics` per profiled launch.

    `keep` limits the stored metrics to those names (the raw page also carries hundreds of
    device attributes); `requested` names the metrics that were asked for, and those absent
    from the table are listed in each kernel's `missing`.
    """
    table = parse_ncu_raw_table(text)
    keep_set = None if keep is None else set(keep)
    requested_list = [] if requested is None else list(dict.fromkeys(requested))
    result: list[KernelMetrics] = []
    for row in table.rows:
        kernel = row.metrics
        if keep_set is not None:
            kernel.metrics = {k: v for k, v in kernel.metrics.items() if k in keep_set}
        if requested_list:
            present = set(table.metric_names)
            kernel.missing = tuple(name for name in requested_list if name not in present)
        result.append(kernel)
    return result


def kernel_rows_by_name(kernels: Iterable[KernelMetrics]) -> dict[str, list[KernelMetrics]]:
    """Group launches by kernel name, keeping launch order within each name."""
    groups: dict[str, list[KernelMetrics]] = {}
    for kernel in kernels:
        groups.setdefault(kernel.kernel_name, []).append(kernel)
    return groups


def first_launch_per_kernel(kernels: Iterable[KernelMetrics]) -> dict[str, KernelMetrics]:
    """The first profiled launch of every kernel name (the model's one-object-per-kernel)."""
    return {name: launches[0] for name, launches in kernel_rows_by_name(kernels).items()}


def unable_to_access_metrics(text: str) -> tuple[str, ...]:
    """Metrics named in ncu's "Unable to access the following N metrics: a, b." warning."""
    names: list[str] = []
    for match in re.finditer(r"Unable to access the following \d+ metrics?:\s*(.+)", text):
        for part in match.group(1).rstrip(". ").split(","):
            name = part.strip().rstrip(".")
            if name:
                names.append(name)
    return tuple(dict.fromkeys(names))
