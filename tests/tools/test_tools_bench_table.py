"""bench/tools_table.py on the probe capture: the table, the expectations, the ncu comparison."""

from __future__ import annotations

from pathlib import Path

from bench_scripts import load_bench_script
from tools_factories import PROBE_DIR


def load_script():  # noqa: ANN201
    return load_bench_script("tools_table")


def test_tools_table_on_probe_capture(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "tools_table.md"
    rc = load_script().main([str(PROBE_DIR), "--out", str(out), "--date", "2026-11-30"])
    assert rc == 0  # every expectation in kernels.yaml holds
    text = out.read_text()
    assert text.startswith("# Micro-profiling tools on captured kernels\n\n- Date: 2026-11-30")
    assert "- Kernels: 18 (first profiled launch of each name)" in text
    assert "| `global_coalescing` |" in text
    assert text.count("| PASS |") == 8
    assert "**FAIL**" not in text
    assert "### `naive_softmax_kernel`" in text
    assert "| OPT UncoalescedGlobalAccess (87.08%) |" in text
    assert "ours only |" in text  # e.g. HMMA-without-wgmma, which ncu has no rule for
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].endswith("8 pass, 0 fail")
