"""The profiled program `python -m pytest_kernelpro.profile.target <spec>`, run for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kernelpro.profile.target import EXIT_BAD_SPEC, EXIT_PROBLEM_FAILED, load_spec, main

PROBLEM = """
import pytest
import torch


def inputs(device):
    return (torch.arange(6, dtype=torch.float32, device=device),)


@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=inputs)
def double(x):
    return x * 2
"""


def run_target(spec: dict | str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argument = spec if isinstance(spec, str) else json.dumps(spec)
    return subprocess.run(
        [sys.executable, "-m", "pytest_kernelpro.profile.target", argument],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


def test_load_spec_inline_and_file(tmp_path: Path) -> None:
    spec = {"problem_file": "k.py", "qualname": "double", "shape_index": None}
    assert load_spec(json.dumps(spec)) == spec
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    assert load_spec(str(path))["qualname"] == "double"
    with pytest.raises(ValueError, match="no 'qualname'"):
        load_spec('{"problem_file": "k.py"}')


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_BAD_SPEC
    assert main(["{not json"]) == EXIT_BAD_SPEC
    assert "bad spec" in capsys.readouterr().err


def test_timeline_mode_loads_the_problem_and_reports_no_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only answer")
    problem = tmp_path / "test_double.py"
    problem.write_text(PROBLEM, encoding="utf-8")
    output = tmp_path / "events.json"
    spec = {
        "problem_file": str(problem),
        "qualname": "double",
        "shape_index": None,
        "device": "cpu",
        "mode": "timeline",
        "output": str(output),
    }
    completed = run_target(spec, tmp_path)
    assert completed.returncode == 0, completed.stderr
    payload = json.loads(output.read_text(encoding="utf-8"))
    assert "no CUDA device" in payload["not_collected"]


def test_failing_problem_exits_3_with_the_reason(tmp_path: Path) -> None:
    spec = {"problem_file": str(tmp_path / "missing.py"), "qualname": "nope", "mode": "ncu"}
    completed = run_target(spec, tmp_path)
    assert completed.returncode == EXIT_PROBLEM_FAILED
    assert completed.stderr.startswith("kernelpro target: ")
    assert "missing.py" in completed.stderr


def test_the_in_process_timeline_answers_as_the_child_does(tmp_path: Path) -> None:
    """`profile_kernel_item(timeline_in_process=True)`'s timeline (the candidate profiler's:
    no second interpreter) gives what the timeline child gives: here, without a GPU, the same
    reason; and a problem that fails says so instead of raising."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only answer")
    from pytest_kernelpro.profile.collect import _run_timeline_child, _timeline_here

    (tmp_path / "k.py").write_text(PROBLEM, encoding="utf-8")
    spec = {"problem_file": str(tmp_path / "k.py"), "qualname": "double", "mode": "timeline",
            "device": "cpu", "runs": 2, "output": str(tmp_path / "events.json")}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    here = _timeline_here(str(tmp_path / "spec.json"), spec["output"])
    child = _run_timeline_child(sys.executable, str(tmp_path / "spec.json"), spec["output"], 300)
    assert here == child
    assert "no CUDA device" in here.why
    broken = {**spec, "qualname": "missing"}
    (tmp_path / "broken.json").write_text(json.dumps(broken), encoding="utf-8")
    failed = _timeline_here(str(tmp_path / "broken.json"), str(tmp_path / "none.json"))
    assert failed.why.startswith("the kineto run failed: ")


def test_the_target_imports_the_project_package_through_the_sessions_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A src/ layout whose test module imports the project's package: pytest's `pythonpath =
    # ["src"]` ini put src/ on the session's sys.path, the profiler's child did not have it
    # and failed with "No module named 'liger_kernel'" (Liger-Kernel's layout, on the H200).
    # The spec carries the session's project entries now.
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only answer")
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.profile.collect import _spec

    package = tmp_path / "src" / "doubler"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def double(x):\n    return x * 2\n", encoding="utf-8")
    problem = tmp_path / "kernels" / "test_double.py"
    problem.parent.mkdir()
    problem.write_text(
        PROBLEM.replace("return x * 2\n", "return doubler.double(x)\n").replace(
            "import torch\n", "import torch\n\nimport doubler\n", 1
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path / "src"))  # what the `pythonpath` ini does
    output = tmp_path / "events.json"
    spec = _spec(
        ProblemLocator(str(problem), "double", None), "cpu", "timeline", output=str(output)
    )
    assert str(tmp_path / "src") in spec["sys_path"]
    completed = run_target(spec, tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "no CUDA device" in json.loads(output.read_text(encoding="utf-8"))["not_collected"]

    del spec["sys_path"]  # as the spec was before: the child cannot import the package
    failed = run_target(spec, tmp_path)
    assert failed.returncode == EXIT_PROBLEM_FAILED
    assert "No module named 'doubler'" in failed.stderr
