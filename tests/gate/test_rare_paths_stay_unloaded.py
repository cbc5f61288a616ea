"""The gate's rarer paths live in modules of their own, imported where the path starts: a CPU
kernel compared with its own baseline, shown in the table with its conditions, loads none of
them (a fresh interpreter, so nothing another test imported counts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
RARE = (
    "pytest_kernelpro.gate.clock_basis",  # a GPU under a clock limit
    "pytest_kernelpro.gate.other_device_basis",  # a baseline from another device
    "pytest_kernelpro.gate.run_differences",  # other picks, versions or library settings
    "pytest_kernelpro.gate.process_notes",  # an autotune note, a changed environment
    "pytest_kernelpro.gate.condition_notes",  # an unresolved verdict, a skipped kernel
)

SCRIPT = """
import json, sys
from types import SimpleNamespace
sys.path.insert(0, {tests!r})
from gate_factories import make_record
from pytest_kernelpro.gate.baseline import parse_entry
from pytest_kernelpro.gate.baseline_save import entry_dict, entry_from_record
from pytest_kernelpro.gate.render_session import render_terminal_table, session_conditions
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import AutotunePart, EnvironmentPart, VerdictPart, part_of

kind = sys.argv[1]
if kind == "gpu-capped":
    clocks = {{"sm_mhz": 1400.0, "max_sm_mhz": 1980.0, "capped_share": 1.0}}
    record = make_record("k[1]", device="NVIDIA H200")
    record.timing = record.timing.__class__(**{{
        **{{f: getattr(record.timing, f) for f in record.timing.__struct_fields__}},
        "clocks": clocks,
    }})
else:
    record = make_record("k[1]", device="cpu", roofline_time_s=None)
# What every item records: its (no) autotune choices, library settings and versions.
record.autotune = AutotunePart(library={{"cuda.matmul.allow_tf32": False}})
record.environment = EnvironmentPart(torch="2.13.0")
entry = parse_entry(entry_dict(entry_from_record(record)))
if kind == "other-cpu":
    entry.device = "cpu (another model)"
rare = {rare!r}
before = [m for m in rare if m in sys.modules]
verdict = decide_verdict(record, entry)
assert not entry.differs_beside_code(record)
record.gate = part_of(VerdictPart, verdict)
settings = SimpleNamespace(correctness_only=False, check=True, profile=False, save_baseline=None)
session_conditions(settings, [record])
render_terminal_table([record], width=100)
print(json.dumps({{"before": before, "after": [m for m in rare if m in sys.modules],
                   "status": verdict.status}}))
"""


def _loaded(kind: str) -> dict:
    script = SCRIPT.format(tests=str(TESTS), rare=RARE)
    done = subprocess.run(
        [sys.executable, "-c", script, kind], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cpu_kernel_like_its_baseline_loads_no_rare_path() -> None:
    found = _loaded("cpu")
    assert found["status"] == "ok"
    assert found["after"] == []


def test_a_capped_gpu_kernel_loads_the_clock_basis() -> None:
    # The same check sees an import where the path is taken.
    found = _loaded("gpu-capped")
    assert found["before"] == []
    assert found["after"] == ["pytest_kernelpro.gate.clock_basis"]


def test_a_baseline_from_another_cpu_loads_the_other_device_basis() -> None:
    found = _loaded("other-cpu")
    assert found["status"] == "incomparable"
    assert found["after"] == ["pytest_kernelpro.gate.other_device_basis"]


def test_a_baseline_every_kernel_matched_says_nothing_of_its_coverage() -> None:
    # The session imports the coverage lines only when an entry or a kernel is unmatched: an
    # empty coverage must have nothing to say, quiet or verbose.
    from pytest_kernelpro.gate.condition_notes import coverage_lines

    for verbose in (False, True):
        assert coverage_lines([], [], verbose=verbose) == []
        assert coverage_lines(["a[1]"], [], verbose=verbose)
        assert coverage_lines([], ["b[1]"], verbose=verbose)
