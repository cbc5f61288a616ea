"""`kernelpro compare BASE HEAD`: the gate's verdicts between two saved runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_factories import make_record

from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.baseline_save import save_baseline
from pytest_kernelpro.gate.report import build_report
from pytest_kernelpro.review.offline_gate import compare_main


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    base = [make_record("a[1]", seed=1), make_record("b[1]", seed=2)]
    head = [make_record("a[1]", seed=3), make_record("b[1]", median_s=60e-6, seed=4)]
    head.append(make_record("c[1]", seed=5))
    return (
        atomic_write_json(tmp_path / "base.json", build_report(base, meta={})),
        atomic_write_json(tmp_path / "head.json", build_report(head, meta={})),
    )


def test_compare_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, head = _runs(tmp_path)
    assert compare_main([str(base), str(head)]) == 1  # a regressed row fails by default
    captured = capsys.readouterr()
    out = captured.out
    assert captured.err.strip() == (
        "kernelpro compare: 1 kernel(s) regressed: b[1] (exit 1; --no-fail only shows)"
    )
    lines = {line.split()[0]: line for line in out.splitlines() if "[1]" in line}
    assert "REGRESSED +20" in lines["b[1]"]
    assert "ok" in lines["a[1]"]
    assert "new" in lines["c[1]"]
    assert "not confirmed" in out
    assert compare_main([str(base), str(head), "--fail"]) == 1
    assert compare_main([str(base), str(head), "--no-fail"]) == 0
    assert compare_main([str(base), str(head), "--fail", "--threshold", "0.5"]) == 0


def test_compare_against_a_baseline_yaml_as_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, head = _runs(tmp_path)
    baseline = tmp_path / "kernelpro-baseline.yaml"
    save_baseline(baseline, [make_record("b[1]", seed=7)], commit="x")
    assert compare_main([str(baseline), str(head), "--markdown"]) == 1  # b[1] regressed
    out = capsys.readouterr().out
    assert out.startswith("<!-- kernelpro-report -->")
    assert "| `b[1]` | 50.0 µs | 60.0 µs |" in out


def test_compare_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, head = _runs(tmp_path)
    assert compare_main([str(tmp_path / "none.yaml"), str(head)]) == 2
    assert "--kernelpro-save-baseline" in capsys.readouterr().err
