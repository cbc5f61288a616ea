"""Where the test suite keeps the machine's measured ceilings (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path


def suite_ceilings_dir(basetemp: Path, xdist_worker: str | None) -> Path:
    """The ceilings cache folder of one test run: one for all its xdist workers, in the
    controller's base temporary folder (each worker's own is a folder in it, `popen-gwN`), so
    the machine is probed once per run, not once per worker; without xdist, a folder in the
    session's base temporary folder (never its parent, which holds other runs' folders).
    Either way private to this run."""
    root = basetemp.parent if xdist_worker else basetemp
    return root / "ceilings-cache"
