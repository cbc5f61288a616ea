"""bench/item_path.py's counting, on a made-up package: the gate path's lines, the calls and
files one phase crosses, and the refusal to measure a package imported from elsewhere."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_bench_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "item_path.py"


def load_script():  # noqa: ANN201
    return load_bench_script("item_path")


def write(path: Path, lines: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"x{i} = {i}\n" for i in range(lines)), encoding="utf-8")


def test_gate_path_counts_top_level_run_problem_measure_gate_only(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    write(package / "plugin.py", 10)
    write(package / "run" / "a.py", 20)
    write(package / "problem" / "b.py", 30)
    write(package / "measure" / "timing" / "c.py", 40)  # nested: still measure/
    write(package / "gate" / "d.py", 50)
    write(package / "optimize" / "e.py", 1000)  # not on the gate path
    write(package / "tools" / "f.py", 500)
    (package / "gate" / "notes.txt").write_text("not python\n" * 99, encoding="utf-8")
    sizes = load_script().package_sizes(package)
    assert sizes["gate path"] == {"modules": 5, "lines": 150}
    assert sizes["total"] == {"modules": 7, "lines": 1650}
    assert sizes["measure"] == {"modules": 1, "lines": 40}


def test_tracer_counts_calls_functions_and_files_per_phase_and_from_collection_on(
    tmp_path: Path,
) -> None:
    package = tmp_path / "tracedpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "inner.py").write_text("def leaf(n):\n    return n + 1\n", encoding="utf-8")
    (package / "outer.py").write_text(
        "from tracedpkg.inner import leaf\n\n"
        "def run(times):\n    total = 0\n    for i in range(times):\n        total += leaf(i)\n"
        "    return total\n",
        encoding="utf-8",
    )
    sys.path.insert(0, str(tmp_path))
    try:
        outer = importlib.import_module("tracedpkg.outer")
        script = load_script()
        tracer = script.PathTracer(package.resolve())
        tracer._start()
        try:
            tracer.phase = "configure"
            outer.run(0)  # run() alone: before collection, outside the record's span
            tracer.phase = "collection"
            outer.run(2)
            tracer.phase = "item"
            outer.run(5)
            len([1, 2, 3])  # a call outside the package is not counted
        finally:
            tracer._stop()
        outer.run(100)  # after the stop: not counted
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.split(".")[0] == "tracedpkg"]:
            del sys.modules[name]
    summary = tracer.summary()
    # run() once per phase, leaf() once per step
    assert summary["per_phase"]["collection"] == {"calls": 3, "functions": 2, "files": 2}
    assert summary["per_phase"]["item"] == {"calls": 6, "functions": 2, "files": 2}
    assert summary["per_phase"]["configure"] == {"calls": 1, "functions": 1, "files": 1}
    assert summary["calls"] == 10
    assert summary["files"] == 2
    assert summary["calls_per_file"] == {"inner.py": 7, "outer.py": 3}
    # collection to the JSON record: configure's call left out
    assert summary["record_span"] == {"calls": 9, "files": 2}


def test_a_package_imported_from_another_checkout_is_refused(tmp_path: Path) -> None:
    """PYTHONPATH points at this checkout; --repo at another one: the child must not measure
    this checkout's package under the other's name."""
    other = tmp_path / "other-checkout"
    other.mkdir()
    out = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repo", str(other), "--child-out", str(out)]
        + ["--child-baseline", "b.yaml", "--child-scratch", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert f"--repo {other}" in done.stderr  # named in the refusal
    assert not out.exists()


@pytest.mark.parametrize("runs", ["0", "-1"])
def test_runs_below_one_is_a_usage_error(runs: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", runs],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"--runs {runs}: give 1 or more" in done.stderr
