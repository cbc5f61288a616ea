"""JSON report (build, write, load, merge), the terminal table, the roofline plot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from gate_factories import make_record

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.render_session import render_terminal_table
from pytest_kernelpro.gate.report import REPORT_SCHEMA_VERSION, build_report
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import VerdictPart, part_of
from pytest_kernelpro.review.plot import roofline_plot, roofline_points
from pytest_kernelpro.review.report_load import load_report, merge_report_dicts, records_of

US = 1e-6
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def gated(name: str, scale: float, **kw: object):
    entry = entry_from_record(make_record(name, seed=99))
    rec = make_record(name, median_s=50 * US * scale, seed=1, **kw)  # type: ignore[arg-type]
    rec.gate = part_of(VerdictPart, decide_verdict(rec, entry))
    return rec


def test_build_write_load(tmp_path: Path) -> None:
    records = [
        gated("a[1]", 1.0),
        gated("b[1]", 1.2),
        make_record("c[1]", timed=False, outcome="failed"),
    ]
    meta = {"torch": "2.11.0", "commit": "abc", "wall_s": 12.5, "options": {"check": True}}
    report = build_report(records, meta=meta)
    assert report["schema_version"] == REPORT_SCHEMA_VERSION
    assert report["kind"] == "kernelpro-report"
    assert report["meta"]["devices"] == ["NVIDIA H200"]
    assert report["meta"]["options"] == {"check": True}
    assert report["summary"]["kernels"] == 3
    assert report["summary"]["by_status"] == {"failed": 1, "ok": 1, "regressed": 1}
    assert report["summary"]["failed"] == 2
    assert sorted(report["summary"]["failed_names"]) == ["b[1]", "c[1]"]
    path = atomic_write_json(tmp_path / ".kernelpro" / "kernelpro-report.json", report)
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(json.dumps(report))
    loaded = load_report(path)
    again = records_of(loaded)
    assert [r.name for r in again] == ["a[1]", "b[1]", "c[1]"]
    assert again[1].gate.status == "regressed"
    assert again[0].timing.samples_s == records[0].timing.samples_s


def test_load_report_errors(tmp_path: Path) -> None:
    with pytest.raises(KernelproError, match="does not exist.*--kernelpro-json"):
        load_report(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(KernelproError, match="cannot be read as JSON"):
        load_report(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"records": []}', encoding="utf-8")
    with pytest.raises(KernelproError, match="not a pytest-kernelpro JSON report"):
        load_report(tmp_path / "y.json")
    future = build_report([], meta={})
    future["schema_version"] = 99
    atomic_write_json(tmp_path / "z.json", future)
    with pytest.raises(KernelproError, match="schema version 99"):
        load_report(tmp_path / "z.json")


def test_merge_worker_reports(tmp_path: Path) -> None:
    gw0 = build_report(
        [gated("a[1]", 1.0)], meta={"wall_s": 30.0, "commit": "c1", "devices": ["NVIDIA H200"]}
    )
    other = gated("b[1]", 1.0, device="NVIDIA H100 80GB HBM3")
    gw1 = build_report([other], meta={"wall_s": 41.0, "commit": "c1"})
    rerun = gated("a[1]", 1.3)
    gw2 = build_report([rerun], meta={"wall_s": 5.0, "commit": "c2"})
    paths = [atomic_write_json(tmp_path / f"gw{i}.json", r) for i, r in enumerate((gw0, gw1, gw2))]
    merged = merge_report_dicts([load_report(p) for p in paths])
    assert {r["name"] for r in merged["records"]} == {"a[1]", "b[1]"}
    a = next(r for r in merged["records"] if r["name"] == "a[1]")
    assert a["gate"]["status"] == "regressed"  # the later report wins for the same node id
    assert merged["meta"]["wall_s"] == 41.0  # workers run in parallel
    assert merged["meta"]["devices"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert merged["meta"]["commits"] == ["c1", "c2"]
    assert merged["meta"]["merged_from"] == 3
    assert merged["summary"]["kernels"] == 2
    with pytest.raises(KernelproError, match="no reports"):
        merge_report_dicts([])


def _table_records() -> list:
    long_name = "fused_attention_with_a_long_name[8x16x4096x128]"
    return [
        gated("softmax[8192x4096]", 1.2),
        gated("matmul[4096]", 0.8, bound="compute"),
        gated(long_name, 1.0),
        make_record("fast[1]", median_s=812e-9, roofline_time_s=400e-9, seed=2),
        make_record("slow[1]", median_s=3.2e-3, roofline_time_s=1e-3, seed=3),
    ]


@pytest.mark.parametrize("width", [80, 100, 120])
def test_terminal_table_fits_and_shows_everything(width: int) -> None:
    skipped = make_record("triton_add[1]", timed=False, outcome="skipped", roofline_time_s=None)
    skipped.device = ""  # skipped before a device was chosen
    text = render_terminal_table([*_table_records(), skipped], width=width, color=False)
    assert not ANSI.search(text)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    joined = "\n".join(lines)
    assert "softmax[8192x4096]" in joined
    assert "REGRESSED +" in joined
    assert "improved −" in joined
    assert "812 ns" in joined
    assert "3.20 ms" in joined
    assert "60%" in joined  # 30 µs roofline / 50 µs median
    assert "compute" in joined
    assert "6 kernel(s) on H200" in lines[-1]
    assert "device" not in lines[0]  # one device: named under the table, not in a column
    if width >= 100:
        assert "30.0 µs" in joined  # the roofline time column
    if width >= 120:
        assert "fused_attention_with_a_long_name[8x16x4096x128]" in joined
    # The regression is listed first.
    body = [line for line in lines if "[" in line]
    assert body[0].startswith("softmax")


@pytest.mark.parametrize("width", [60, 80])
def test_a_terminal_too_narrow_gets_a_wider_table_never_a_cut_verdict(width: int) -> None:
    """Cells that cannot fold (a long bound note, the verdict with its change) beside a long
    name on a narrow terminal: rich cropped the last columns (`verdi`, `REGRES`) to fit."""
    regressed = gated("fused_attention_with_a_long_name[8x16x4096x128]", 1.2)
    regressed.peak_used = {"note": "faster than any ceiling", "problem": "count"}
    text = render_terminal_table([regressed, gated("matmul[4096]", 0.8)], width=width)
    lines = text.splitlines()
    assert lines[0].split()[-1] == "verdict"
    assert "memory (above every ceiling)" in text
    assert re.search(r"REGRESSED \+\d+\.\d%", text)
    assert re.search(r"improved −\d+\.\d%", text)
    # The name keeps one line, shortened in the middle (its start and its shape kept).
    row = lines[2]
    name = row.split()[0]
    assert name.startswith("fused_")
    assert "…" in name
    assert name.endswith("128]")
    assert lines[3].startswith("matmul")
    # Under -v the name is whole, folded over lines, never cut.
    full = render_terminal_table(
        [regressed, gated("matmul[4096]", 0.8)], width=width, verbose=True
    ).splitlines()
    folded = full[2 : next(i for i, line in enumerate(full) if line.startswith("matmul"))]
    assert "".join(line.split()[0] for line in folded) == regressed.name  # folded, not cut


def test_a_log_table_takes_the_width_of_its_content() -> None:
    long_name = "fused_attention_with_a_long_name[8x16x4096x128]"
    text = render_terminal_table([gated(long_name, 1.2), gated("matmul[4096]", 0.8)], width=None)
    lines = text.splitlines()
    assert lines[0].split() == [
        "kernel", "median", "±IQR/2", "roofline", "of", "roofline", "bound", "verdict"
    ]  # fmt: skip
    assert lines[2].startswith(long_name + " ")  # whole, on one line
    assert re.search(r"REGRESSED \+\d+\.\d%$", lines[2].rstrip())
    assert "30.0 µs" in lines[2]  # the roofline time column is kept


def test_terminal_table_color_and_other_device() -> None:
    recs = _table_records()
    recs.append(gated("gelu[1]", 1.0, device="NVIDIA H100 80GB HBM3"))
    text = render_terminal_table(recs, width=120, color=True)
    assert ANSI.search(text)
    plain = ANSI.sub("", text)
    assert "H100 80GB HBM3" in plain
    assert "device" in plain
    assert "* other device than the baseline: compared by % of roofline, wider tolerance" in plain
    verbose = ANSI.sub("", render_terminal_table(recs, width=120, color=True, verbose=True))
    assert "compared by efficiency (time relative to the roofline)" in verbose


def test_roofline_plot_png(tmp_path: Path) -> None:
    records = _table_records()
    records.append(make_record("copy[1]", flops=0, seed=4))
    records.append(make_record("broken[1]", timed=False, outcome="failed"))
    points, skipped = roofline_points(records)
    assert len(points) == 5
    assert {s.split(" ")[0] for s in skipped} == {"copy[1]", "broken[1]"}
    soft = next(p for p in points if p.label == "softmax[8192x4096]")
    # Memory-bound: bandwidth = min_bytes / roofline_time; peak = ridge * bandwidth.
    assert soft.bandwidth_Bps == pytest.approx(2.7e8 / 30e-6)
    assert soft.peak_flops == pytest.approx(989e12 / 4.8e12 * 2.7e8 / 30e-6)
    path = roofline_plot(records, tmp_path / "plots" / "roofline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    assert [p.name for p in path.parent.iterdir()] == ["roofline.png"]


def test_roofline_plot_uses_explicit_ceilings_and_refuses_an_empty_plot(tmp_path: Path) -> None:
    rec = make_record("gemm[1]", flops=2e12, min_bytes=1e9, bound="compute", seed=5)
    rec.roofline = msgspec.structs.replace(rec.roofline, peak_flops=900e12, bandwidth_Bps=4.8e12)
    (point,), _ = roofline_points([rec])
    assert (point.peak_flops, point.bandwidth_Bps) == (900e12, 4.8e12)
    with pytest.raises(KernelproError, match="nothing to draw"):
        roofline_plot([make_record("x[1]", timed=False)], tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()
