"""Re-measuring one kernel item in a fresh process, to confirm a provisional regression.

A process is a sample: autotuners pick their configs in it, the caching allocator places the
buffers, libraries choose algorithms. A slowdown that belongs to one process reproduces in
that process, so the confirmation re-measures in a new one: pytest itself on the item,
started the way `--kernelpro-isolate` starts an item's child, with the hidden
`--kernelpro-remeasure-child=PINS_JSON`. That child calls the kernel once with the baseline's
autotune choices pinned, times it with the session's timing budget and writes its record; it
compares nothing with the baseline. It checks the sampled timed outputs by the parent's
calibrated rule (`rule_payload`, written beside the pins): the dtype's default tolerance
refused an honest algebraic rewrite whose error the parent's trials had calibrated.

Its cost is bounded like the in-process confirmation's: one re-timing with the same budget per
provisional regression, plus the process start (Python, pytest, torch, the kernel's build and
compile); the child gets the item time limit plus `isolate.STARTUP_ALLOWANCE_S` and is killed
(its process group) past it. The wall time is recorded with the confirmation.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import AutotunePart, TimingPart
from pytest_kernelpro.run.context import TIMING_SEED, record_process_facts, watching
from pytest_kernelpro.run.isolate import (
    CHILD_FLAG,
    RELEASE_WAIT_S,
    STARTUP_ALLOWANCE_S,
    child_command,
    child_record_for,
    run_child,
    wait_released,
)
from pytest_kernelpro.run.stages import time_item

if TYPE_CHECKING:
    from pytest_kernelpro.measure.output_rule import CorrectnessRule
    from pytest_kernelpro.run.context import ItemRun
    from pytest_kernelpro.run.item_runner import BuiltKernel
    from pytest_kernelpro.run.items import KernelItem
    from pytest_kernelpro.run.session import KernelproSession

REMEASURE_FLAG = "--kernelpro-remeasure-child"
# Flags of the parent's command that the re-measuring child must not get: it only times.
_PARENT_ONLY = ("--kernelpro-check", "--kernelpro-profile")
_PARENT_ONLY_PREFIXES = ("--kernelpro-optimize=", "--kernelpro-save-baseline=")
OUTPUT_TAIL_CHARS = 1500
RULE_FILE = "correctness_rule.json"  # beside the pins file: the parent's calibrated rule


@dataclass(frozen=True)
class FreshMeasurement:
    """What the fresh process gave back: its timing and autotune parts or why there are none."""

    timing: TimingPart | None
    autotune: AutotunePart | None
    wall_s: float
    returncode: int | None
    error: str | None = None


def remeasure_command(
    item: KernelItem, session: KernelproSession, json_path: Path, pins_path: Path
) -> list[str]:
    """The isolated child's command, timing only, with the pins file."""
    cmd = [
        arg
        for arg in child_command(item, session, json_path)
        if arg not in _PARENT_ONLY and not arg.startswith(_PARENT_ONLY_PREFIXES)
    ]
    assert CHILD_FLAG in cmd  # the child never isolates or re-measures in a child of its own
    return [*cmd, f"{REMEASURE_FLAG}={pins_path}"]


def rule_payload(rule: CorrectnessRule) -> dict[str, Any]:
    """JSON-safe: what the child needs to judge later calls by the parent's `rule`."""
    return {
        "rtol": rule.rtol,
        "atol": rule.atol,
        "factor": rule.factor,
        "reduced": rule.reduced,
        "calibrated": {
            path: {"tolerance": asdict(c.tolerance), "limits": asdict(c.limits)}
            for path, c in rule.calibrated.items()
        },
    }


def rule_from_payload(data: Mapping[str, Any]) -> CorrectnessRule:
    """The rule again from its `rule_payload` (KeyError or TypeError on another shape)."""
    from pytest_kernelpro.measure.output_rule import (
        Calibration,
        CorrectnessRule,
        InformationLimits,
        Tolerance,
    )

    rule = CorrectnessRule(rtol=data.get("rtol"), atol=data.get("atol"))
    if isinstance(data.get("factor"), (int, float)):
        rule.factor = float(data["factor"])
    rule.reduced = data.get("reduced")
    for path, c in (data.get("calibrated") or {}).items():
        rule.calibrated[str(path)] = Calibration(
            Tolerance(**c["tolerance"]), InformationLimits(**c["limits"])
        )
    return rule


def read_rule(pins_path: str | Path | None) -> CorrectnessRule | None:
    """The parent's rule written beside the child's pins file, or None without one."""
    if pins_path is None:
        return None
    path = Path(pins_path).with_name(RULE_FILE)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return rule_from_payload(data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise KernelproError(f"the parent's correctness rule {path} is unreadable: {exc}") from exc


def remeasure_in_fresh_process(
    item: KernelItem,
    session: KernelproSession,
    pins: Iterable[Mapping[str, Any]],
    rule: CorrectnessRule | None = None,
    *,
    limit: float | None,
) -> FreshMeasurement:
    """Time `item` again in a new process with `pins` imposed, its sampled outputs checked by
    the parent's `rule`, within `limit` (None: none) plus the start-up allowance."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernelpro-confirm-") as tmp:
        json_path = Path(tmp) / "remeasure.json"
        pins_path = Path(tmp) / "pins.json"
        pins_path.write_text(json.dumps([dict(p) for p in pins]), encoding="utf-8")
        if rule is not None:
            (Path(tmp) / RULE_FILE).write_text(json.dumps(rule_payload(rule)), encoding="utf-8")
        cmd = remeasure_command(item, session, json_path, pins_path)
        try:
            proc, output, killed = run_child(cmd, session, limit)
        except OSError as exc:
            return FreshMeasurement(None, None, time.perf_counter() - started, None, str(exc))
        timed_out = killed is not None
        if killed is not None:
            wait_released(killed, RELEASE_WAIT_S)
        child = child_record_for(json_path.with_suffix(".jsonl"), item.nodeid, item.name)
    wall = time.perf_counter() - started
    if timed_out:
        error = f"it ran past the item time limit of {limit:g} s plus {STARTUP_ALLOWANCE_S:g} s"
        return FreshMeasurement(None, None, wall, proc.returncode, error)
    timing = child.timing if child is not None else None
    if timing is None or not timing.samples_s:
        tail = (output or "").strip()[-OUTPUT_TAIL_CHARS:]
        what = (child.message if child is not None else None) or (
            f"exit status {proc.returncode}, no timing in its record"
        )
        return FreshMeasurement(None, None, wall, proc.returncode, f"{what}; output: {tail}")
    return FreshMeasurement(timing, child.autotune, wall, proc.returncode)


def remeasure_only(run: ItemRun, built: BuiltKernel) -> None:
    """The fresh process of a confirmation: one call with the pins applied (the autotuners
    take the baseline's configs from their caches from then on), then the timing, made the
    way the item's own timing is."""
    kernel, capture = built.kernel, built.capture
    inputs = built.make_inputs(TIMING_SEED)  # the item's timing inputs
    with watching(capture), built.grad_mode():
        try:
            kernel(*inputs)
        except Exception as exc:
            raise KernelproError(
                f"{run.name} raised {describe_exception(exc)} in the re-measuring process"
            ) from exc
    record_process_facts(run, capture)
    # The parent's calibrated rule checks the sampled outputs (module docstring); without it,
    # the dtype's default tolerance would.
    rule = read_rule(run.session_settings.remeasure_pins)
    parent = None if rule is None else SimpleNamespace(rule_state=rule, tf32=False)
    time_item(
        run, kernel, inputs, built.grad_mode,
        reference=built.reference, make_inputs=built.make_inputs, correctness=parent,
    )  # fmt: skip
    if capture is not None:
        capture.after_timing()
    record_process_facts(run, capture)
    run.record.extra["remeasure_child"] = True
