"""Run folders: every search of a kernel gets its own folder, earlier ones are kept.

    .kernelpro/optimize/<kernel>/
        LATEST                      name of the newest run folder
        run-20261201-091502/        one search
            trajectory.jsonl        every evaluated node, appended as it happens
            llm-calls.jsonl         every model call (a replay recording)
            summary.json            the summary, rewritten after every evaluation
            patches/candidate-N.patch, patches/best.patch (the ranked winner's only;
                                    interim-N.patch while the search runs)

`--kernelpro-resume` continues the folder LATEST names (its trajectory and budget); without
it a new folder starts, so a second run never collides with the first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_text

LATEST = "LATEST"


@dataclass(frozen=True)
class RunFolder:
    path: Path
    resumed: bool

    @property
    def trajectory(self) -> Path:
        return self.path / "trajectory.jsonl"

    @property
    def llm_calls(self) -> Path:
        return self.path / "llm-calls.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def patches(self) -> Path:
        return self.path / "patches"


def latest_run(kernel_dir: Path) -> Path | None:
    """The newest run folder of a kernel (LATEST, else the last by name), or None."""
    pointer = kernel_dir / LATEST
    if pointer.is_file():
        named = kernel_dir / pointer.read_text(encoding="utf-8").strip()
        if named.is_dir():
            return named
    runs = sorted(p for p in kernel_dir.glob("run-*") if p.is_dir())
    return runs[-1] if runs else None


def open_run(kernel_dir: Path, *, resume: bool, clock: float | None = None) -> RunFolder:
    """A new run folder, or with `resume` the latest one (a KernelproError if there is none
    with a trajectory to continue)."""
    if resume:
        last = latest_run(kernel_dir)
        if last is None or not (last / "trajectory.jsonl").is_file():
            raise KernelproError(
                f"--kernelpro-resume: no earlier search to continue in {kernel_dir}; run "
                "without --kernelpro-resume to start one"
            )
        return RunFolder(last, resumed=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock))
    path = kernel_dir / f"run-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = kernel_dir / f"run-{stamp}-{n}"
    path.mkdir(parents=True)
    atomic_write_text(kernel_dir / LATEST, path.name + "\n")
    return RunFolder(path, resumed=False)
