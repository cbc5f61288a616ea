"""Where the confirmation re-measures (run/stages.py, run/fresh_process.py): a fresh process
by default, this process when that one gives no timing (never a lost confirmation)."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec

from pytest_kernelpro.record import AutotunePart, TimingPart
from pytest_kernelpro.run.fresh_process import FreshMeasurement, remeasure_command
from pytest_kernelpro.run.stages import _confirmation_timing

TIMING = msgspec.convert(
    {"samples_s": [1e-3, 1.1e-3], "stats": {"median_s": 1.05e-3, "n": 2}}, TimingPart
)


def _run(mode: str) -> SimpleNamespace:
    """The item's state as the gate stage reads it: the record and the session settings."""
    return SimpleNamespace(
        record=SimpleNamespace(extra={}), session_settings=SimpleNamespace(confirm_process=mode)
    )


def test_a_fresh_process_that_gives_no_timing_falls_back_to_this_one() -> None:
    run = _run("fresh")
    asked: list[list[dict]] = []

    def fresh(pins: list[dict]) -> FreshMeasurement:
        asked.append(pins)
        return FreshMeasurement(None, None, 3.0, 1, "ImportError in the child")

    timing, how = _confirmation_timing(run, lambda: TIMING, fresh, ({"k": 1},))
    assert asked == [[{"k": 1}]]
    assert timing.median_s == 1.05e-3
    assert not how.fresh
    assert "ImportError in the child" in how.fallback
    assert run.record.extra["confirmation_fresh_process_error"] == "ImportError in the child"


def test_the_fresh_processs_timing_and_pins_are_used() -> None:
    run = _run("fresh")
    choices = [{"kernel": "k", "key": [1], "config": {"num_warps": 8}, "source": "pinned"}]

    def fresh(pins: list[dict]) -> FreshMeasurement:
        return FreshMeasurement(TIMING, AutotunePart(choices=tuple(choices)), 7.5, 0)

    def never() -> None:
        raise AssertionError("re-measured in this process although the fresh one gave a timing")

    timing, how = _confirmation_timing(run, never, fresh, ({"k": 1},))
    assert how.fresh
    assert how.wall_s == 7.5
    assert how.choices == tuple(choices)
    assert timing == TIMING


def test_same_never_starts_a_process() -> None:
    run = _run("same")

    def fresh(pins: list[dict]) -> FreshMeasurement:
        raise AssertionError("started a process under --kernelpro-confirm-process=same")

    _, how = _confirmation_timing(run, lambda: TIMING, fresh, ())
    assert not how.fresh
    assert how.fallback is None


def test_the_childs_command_times_only(tmp_path) -> None:  # noqa: ANN001
    """The parent's --kernelpro-check, --kernelpro-profile and save-baseline do not reach the
    re-measuring child (it would gate, profile or write a baseline of its own)."""
    from pathlib import Path

    config = SimpleNamespace(
        rootpath=Path(tmp_path),
        inipath=None,
        getoption=lambda name, default=None: default,
        pluginmanager=SimpleNamespace(
            hasplugin=lambda name: False, list_plugin_distinfo=list, get_plugins=set
        ),
        # The optimizer plugin passes its flags on; the child must not search.
        hook=SimpleNamespace(
            pytest_kernelpro_isolated_child_args=lambda config: [["--kernelpro-optimize=3"]]
        ),
    )
    settings = SimpleNamespace(check=True, profile=True, save_baseline="b.yaml")
    session = SimpleNamespace(config=config, settings=settings)
    item = SimpleNamespace(nodeid="t.py::k")
    cmd = remeasure_command(item, session, tmp_path / "r.json", tmp_path / "pins.json")
    assert "--kernelpro-check" not in cmd
    assert "--kernelpro-profile" not in cmd
    assert "--kernelpro-optimize=3" not in cmd
    assert not any(a.startswith("--kernelpro-save-baseline") for a in cmd)
    assert cmd[-1] == f"--kernelpro-remeasure-child={tmp_path / 'pins.json'}"
    assert "--kernelpro-isolated-child" in cmd
