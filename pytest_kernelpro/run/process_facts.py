"""What an item's process chose and ran with: its autotune picks, the library settings that
choose algorithms, the versions that change generated code; and the timing-only run of the
fresh process that confirms a regression (`fresh_process.py`).

The capture (`measure.environment.AutotuneCapture`) watches the correctness trials, where an
autotuner tunes at its first call, and reads what the timing tuned afterwards; the record's
`autotune` and `environment` parts are set from it (`record_process_facts`). In the fresh
process the baseline's choices are pinned before the kernel's first call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.environment import (
    AutotuneCapture,
    Pin,
    code_versions,
    library_choices,
    load_triton_if_used,
)
from pytest_kernelpro.record import AutotunePart, EnvironmentPart

if TYPE_CHECKING:
    import pytest

    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.run.context import ItemRun


def extra_autotuners(config: pytest.Config) -> list[type]:
    """Autotuner classes a conftest names (`pytest_kernelpro_autotuners`)."""
    found: list[type] = []
    for contributed in config.hook.pytest_kernelpro_autotuners():
        found.extend(c for c in contributed or () if isinstance(c, type))
    return found


def read_pins(path: Any) -> list[Pin]:
    """The pins file of a re-measuring child: a JSON list of recorded choices."""
    try:
        data = json.loads(open(path, encoding="utf-8").read())  # noqa: SIM115
    except (OSError, ValueError) as exc:
        raise KernelproError(f"cannot read the autotune pins {path}: {exc}") from exc
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
        raise KernelproError(f"the autotune pins {path} are not a JSON list of choices")
    return [Pin.from_choice(c) for c in data]


def autotune_capture(run: ItemRun, pins_path: Any, classes: list[type]) -> AutotuneCapture:
    """The item's capture: the pins of a re-measuring child (`pins_path`), none otherwise;
    `classes` are the autotuners a conftest adds."""
    load_triton_if_used(run.problem.language)
    pins = read_pins(pins_path) if pins_path is not None else []
    return AutotuneCapture(pins=pins, classes=classes)


def record_process_facts(run: ItemRun, capture: AutotuneCapture) -> None:
    """The record's autotune choices, library settings and code-changing versions."""
    record = run.record
    record.autotune = AutotunePart.from_dict({**capture.to_dict(), "library": library_choices()})
    record.environment = EnvironmentPart.from_dict(code_versions(record.device_kind))


def remeasure_only(
    run: ItemRun,
    config: KernelproConfig,
    kernel: Any,
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    grad_mode: Callable[[], Any],
    capture: AutotuneCapture,
) -> None:
    """The fresh process of a confirmation: one call with the pins applied (the autotuners
    take the baseline's configs from their caches from then on), then the timing, made the
    way the item's own timing is (the same inputs, fresh ones per call checked against the
    reference)."""
    from pytest_kernelpro.errors import describe_exception
    from pytest_kernelpro.run.stages import time_item

    inputs = make_inputs(1_000_003)  # the item's timing inputs
    with capture.watching(), grad_mode():
        try:
            kernel(*inputs)
        except Exception as exc:
            raise KernelproError(
                f"{run.name} raised {describe_exception(exc)} in the re-measuring process"
            ) from exc
    record_process_facts(run, capture)
    time_item(run, config, kernel, inputs, grad_mode, reference=reference, make_inputs=make_inputs)
    capture.after_timing()
    record_process_facts(run, capture)
    run.record.extra["remeasure_child"] = True
