"""The confirmation re-measures any item wherever its file lives, by the parent's rules
(run/fresh_process.py), and a re-measurement never accuses an honest kernel
(measure/timing/fresh_inputs.py `FreshInputs.resume`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pytest_kernelpro.measure.output_rule import (
    Calibration,
    CorrectnessRule,
    InformationLimits,
    Tolerance,
)
from pytest_kernelpro.measure.timing.fresh_inputs import DishonestTiming, fresh_inputs
from pytest_kernelpro.run.fresh_process import (
    RULE_FILE,
    read_rule,
    remeasure_command,
    rule_payload,
)
from pytest_kernelpro.run.isolate import child_address, child_record_for


def _exact(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    return None if torch.equal(got, expected) else "differs"


def _honest_fresh(
    second: bool = True,
) -> tuple[object, list[torch.Tensor]]:
    inputs = [torch.randn(256)]
    fresh = fresh_inputs(
        torch,
        torch.neg,
        inputs,
        device="cpu",
        make_draw=(
            (lambda seed: [torch.randn(256, generator=torch.Generator().manual_seed(seed))])
            if second
            else None
        ),
        reference=torch.neg,
        check=_exact,
        free_bytes=1 << 30,
    )
    return fresh, inputs


def _timing(fresh: object, calls: int) -> None:
    """What a timer does: the first call without a refill, then refilled calls; all
    checked (force) so the test does not depend on the random sample."""
    fresh.after(fresh.call(), force=True)  # type: ignore[attr-defined]
    for _ in range(calls):
        fresh.before()  # type: ignore[attr-defined]
        fresh.after(fresh.call(), force=True)  # type: ignore[attr-defined]
    fresh.finish()  # type: ignore[attr-defined]


def _recheck_writes_into(inputs: list[torch.Tensor]) -> None:
    inputs[0].copy_(torch.randn(256))  # correctness_check.recheck_after_timing does this


def test_an_honest_kernel_re_measured_after_the_recheck_is_not_accused() -> None:
    fresh, inputs = _honest_fresh()
    _timing(fresh, 1)  # ends on content set 1: the ring's turn is 1
    _recheck_writes_into(inputs)
    fresh.resume()
    _timing(fresh, 2)  # the first call is checked against set 1's output: must match


def test_without_resume_the_first_checked_call_is_blamed_the_bug_it_mends() -> None:
    fresh, inputs = _honest_fresh()
    _timing(fresh, 1)
    _recheck_writes_into(inputs)
    with pytest.raises(DishonestTiming, match="timed call 3 returned a wrong output"):
        _timing(fresh, 2)


def test_without_an_input_maker_a_re_measurement_still_compares_outputs() -> None:
    """Inputs that cannot be drawn again: every call is checked, on the contents it ran on,
    and the honest kernel's re-measurement passes after the re-check wrote into them."""
    fresh, inputs = _honest_fresh(second=False)
    _timing(fresh, 1)
    _recheck_writes_into(inputs)
    fresh.resume()
    _timing(fresh, 2)
    assert fresh.checked >= 4  # type: ignore[attr-defined]


def test_a_cheat_is_still_caught_in_a_re_measurement() -> None:
    fresh, inputs = _honest_fresh()
    _timing(fresh, 1)
    _recheck_writes_into(inputs)
    fresh.resume()
    memo = fresh.call()  # type: ignore[attr-defined]
    fresh.kernel = lambda x: memo  # type: ignore[attr-defined]
    with pytest.raises(DishonestTiming):
        _timing(fresh, 2)


# ----- the fresh process: an address the child can find, the record it wrote, the rule


def _item(tmp_path: Path, nodeid: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, path=tmp_path / "problems" / "23_Softmax.py")


def test_the_child_gets_the_items_absolute_file_not_a_node_id_relative_to_elsewhere(
    tmp_path: Path,
) -> None:
    item = _item(tmp_path, "23_Softmax.py::23_Softmax")
    address = child_address(item)
    assert address == f"{(tmp_path / 'problems' / '23_Softmax.py').resolve()}::23_Softmax"
    config = SimpleNamespace(
        rootpath=tmp_path / "elsewhere",
        inipath=None,
        getoption=lambda name, default=None: default,
        pluginmanager=SimpleNamespace(
            hasplugin=lambda name: False, list_plugin_distinfo=list, get_plugins=set
        ),
        hook=SimpleNamespace(pytest_kernelpro_isolated_child_args=lambda config: []),
    )
    settings = SimpleNamespace(check=True, profile=False, save_baseline=None)
    cmd = remeasure_command(
        item, SimpleNamespace(config=config, settings=settings), tmp_path / "r.json", tmp_path / "p"
    )
    assert address in cmd
    assert "23_Softmax.py::23_Softmax" not in cmd
    parametrized = SimpleNamespace(nodeid="t.py::k[8x8]", path=tmp_path / "t.py")
    assert child_address(parametrized) == f"{(tmp_path / 't.py').resolve()}::k[8x8]"
    assert child_address(SimpleNamespace(nodeid="t.py::k", path=None)) == "t.py::k"


def test_the_childs_record_is_found_by_name_when_its_node_id_differs(tmp_path: Path) -> None:
    from pytest_kernelpro.gate.report import RecordsLog
    from pytest_kernelpro.record import KernelRecord

    log = tmp_path / "child.jsonl"
    RecordsLog(log).record(
        KernelRecord(nodeid="/abs/23_Softmax.py::23_Softmax", name="23_Softmax", kernel="Model")
    )
    found = child_record_for(log, "23_Softmax.py::23_Softmax", "23_Softmax")
    assert found is not None
    assert found.name == "23_Softmax"
    assert child_record_for(log, "x.py::other", "other") is None


def test_the_parents_calibrated_rule_reaches_the_child(tmp_path: Path) -> None:
    rule = CorrectnessRule()
    rule.reduced = "tf32"
    rule.calibrated["output"] = Calibration(
        Tolerance(1e-3, 4e-3, "float64 truth, calibrated", norm_rtol=2e-3),
        InformationLimits(1e-6, 1e-6, 0.0),
    )
    (tmp_path / RULE_FILE).write_text(json.dumps(rule_payload(rule)))
    again = read_rule(tmp_path / "pins.json")
    assert again is not None
    assert again.reduced == "tf32"
    assert again.calibrated == rule.calibrated
    assert again.for_leaf("output", torch.float32) == rule.for_leaf("output", torch.float32)
    assert read_rule(tmp_path / "nowhere" / "pins.json") is None
    (tmp_path / RULE_FILE).write_text("{not json")
    with pytest.raises(Exception, match="correctness rule .* is unreadable"):
        read_rule(tmp_path / "pins.json")


def test_a_failed_fresh_process_is_shown_under_the_table_not_only_in_the_json() -> None:
    from pytest_kernelpro.gate.process_notes import table_notes
    from pytest_kernelpro.record import KernelRecord
    from pytest_kernelpro.review.comment import comment_notes

    record = KernelRecord(nodeid="23_Softmax.py::23_Softmax", name="23_Softmax", kernel="Model")
    record.extra["confirmation_fresh_process_error"] = (
        "exit status 4, no timing in its record; output: ERROR: file or directory not found: "
        "23_Softmax.py::23_Softmax\x1b[31m\n(more output)"
    )
    (line,) = table_notes([record])
    assert line.startswith("23_Softmax: the fresh-process confirmation failed (exit status 4")
    assert "file or directory not found" in line
    assert "\x1b" not in line  # the child's output is text, never terminal control
    assert "re-measured in this process" in line
    (bullet, _) = comment_notes([record])
    assert "fresh-process confirmation failed" in bullet
