"""Baseline files: a duplicate key is an error, and concurrent saves lose nobody's entries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gate_factories import make_record

from pytest_kernelpro.gate.baseline import BaselineError, load_baseline, unmatched
from pytest_kernelpro.gate.baseline_save import save_baseline

HERE = Path(__file__).resolve().parents[1]  # tests/: gate_factories.py


def test_a_duplicate_kernel_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "kernelpro-baseline.yaml"
    save_baseline(path, [make_record("a[1]"), make_record("b[1]")], commit="c0")
    text = path.read_text(encoding="utf-8")
    block_start = text.index("  test_kernels.py::a[1]:")
    block_end = text.index("  test_kernels.py::b[1]:")
    # A bad merge: the same kernel twice, with different numbers.
    doubled = text + text[block_start:block_end].replace("median_s: ", "median_s: 9")
    path.write_text(doubled, encoding="utf-8")
    with pytest.raises(
        BaselineError,
        match=r"not valid YAML at line \d+ \(duplicate key 'test_kernels\.py::a\[1\]'",
    ):
        load_baseline(path)


def test_a_duplicate_key_inside_an_entry_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    save_baseline(path, [make_record("a[1]")], commit="c0")
    text = path.read_text(encoding="utf-8").replace(
        "    median_s:", "    median_s: 1.0e-06\n    median_s:", 1
    )
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BaselineError, match="duplicate key 'median_s'"):
        load_baseline(path)


SAVER = """
import sys
sys.path.insert(0, {here!r})
from gate_factories import make_record
from pytest_kernelpro.gate.baseline_save import save_baseline
for i in range({n}):
    save_baseline({path!r}, [make_record(f"{{sys.argv[1]}}-{{i}}[1]", n=20)], commit="c")
"""


def test_two_processes_saving_one_baseline_keep_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "kernelpro-baseline.yaml"
    n = 15
    code = SAVER.format(here=str(HERE), n=n, path=str(path))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, name], stderr=subprocess.PIPE, text=True)
        for name in ("p", "q")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    keys = set(load_baseline(path).entries)
    # Each save reads, merges and writes under the lock: no process's entry is lost.
    assert keys == {f"test_kernels.py::{who}-{i}[1]" for who in ("p", "q") for i in range(n)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernelpro-baseline.yaml"]


def test_unmatched_lists_both_directions(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    baseline = save_baseline(path, [make_record("old[1]"), make_record("kept[1]")], commit="c")
    now = [make_record("kept[1]"), make_record("new[1]"), make_record("untimed[1]", timed=False)]
    left, without = unmatched(baseline, now)
    assert left == ["test_kernels.py::old[1]"]
    assert without == ["new[1]"]  # an untimed record is not compared, so not listed
