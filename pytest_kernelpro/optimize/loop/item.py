"""`--kernelpro-optimize`: what the guided search of one kernel item hands the user.

`optimize_search.run_search` composes the loop (Programmer Agent, sandbox, profiling
evaluator, MCTS or greedy, the final interleaved re-measurement and `SearchRanking`). This
module wraps it with what the user gets (`handoff/`), through `SearchHooks`:

1. a run folder (`optimize/loop/runs.py`; `--kernelpro-resume` continues the latest);
2. the current kernel's sandbox evaluation is checked before any model call: a kernel the
   sandbox cannot import (it runs with pytest's sys.path) stops the search there;
3. live progress (`optimize/loop/progress.py`); after every evaluation the summary (and, when the
   best changed, the patches) are written to the run folder (`optimize_state.py`), so
   Ctrl-C or a crash keeps the trajectory, the best so far and its patch;
4. the ranked candidates, one patch per candidate plus `best.patch` for a ranked winner only
   (`interim-N.patch` before the ranking; `optimize/loop/outcome.py`, `optimize/loop/patch.py`),
   and the summary in the record (terminal, JSON, JUnit, PR comment).

A requested search that did not run fails the kernel item with the reason: never a silent
pass. Problems found before any work (no API key, unreachable API, an unusable replay) are
usage errors raised by the plugin (`optimize/loop/preflight.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.optimize.loop.replay import slug as _slug
from pytest_kernelpro.optimize.loop.state import ObservedEvaluator, ObservedGenerator, SearchState

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.loop.runs import RunFolder
    from pytest_kernelpro.optimize.search.interfaces import Evaluation
    from pytest_kernelpro.record import KernelRecord
    from pytest_kernelpro.run.context import ItemRun, Services


_IMPORT_FAILURES = ("ModuleNotFoundError", "ImportError", "No module named")


def _efficiency_of(record: Any) -> Callable[[float], float | None] | None:
    """A candidate's share of the roofline from its speedup over the current kernel: its
    time (the current kernel's timed median over the speedup) priced on the item's roofline,
    at the peak its rate implies when it beats the op-level one (`measure.roofline`)."""
    from pytest_kernelpro.measure.roofline import kernel_efficiency

    median, roofline = record.median_s, record.roofline
    if not median or roofline is None:
        return None
    return lambda vs_current: kernel_efficiency(roofline, median / vs_current)


def optimize_item(run: ItemRun, services: Services) -> None:
    """Run the search within the session's budget; a search that did not run fails the item."""
    from pytest_kernelpro.optimize.loop.progress import pytest_progress
    from pytest_kernelpro.optimize.search.budget import parse_budget

    settings, record = services.settings, run.record
    budget = parse_budget(settings.optimize or "", where="--kernelpro-optimize")
    kernel_dir = settings.artifacts_dir / "optimize" / _slug(record.name)
    progress = pytest_progress(services.config, record.name, str(budget), budget.max_evaluations)
    state = SearchState(
        record.name, str(budget), progress, record.efficiency, _efficiency_of(record)
    )
    summary: dict[str, Any]
    try:
        summary = _search(run, services, kernel_dir, state)
    except KernelproError as exc:
        summary = {
            "status": "not run",
            "reason": str(exc),
            "kernel": record.name,
            "run_dir": str(state.run.path) if state.run else None,
        }
    except KeyboardInterrupt:
        summary = (
            state.summary(interrupted=True)
            if state.algorithm is not None
            else {
                "status": "not run",
                "reason": "interrupted before the search started",
                "interrupted": True,
                "kernel": record.name,
            }
        )
        _attach(record, summary)
        progress.close(f"interrupted; kept {summary.get('run_dir')}")
        record.outcome = "passed"
        record.message = "optimize interrupted"
        services.add_record(record)  # no report comes for an interrupted item
        raise
    progress.close(_closing_line(summary))
    _attach(record, summary)
    if summary["status"] == "not run":
        raise KernelproError(
            f"{record.name}: --kernelpro-optimize was requested but the search did not run: "
            f"{summary['reason']}"
        )


def _attach(record: KernelRecord, summary: dict[str, Any]) -> None:
    from pytest_kernelpro.optimize.loop.report_texts import SECTION_TITLE, section_for

    record.extra["optimize"] = summary
    others = [s for s in record.sections if s.title != SECTION_TITLE]
    record.sections = [*others, section_for(record.name, summary)]


def _closing_line(summary: dict[str, Any]) -> str:
    best = summary.get("best_speedup_vs_current")
    text = f"{summary['status']}"
    if best is not None:
        text += f", best {best:.2f}x the current kernel"
    if summary.get("best_patch"):
        text += f"; patch {summary['best_patch']}"
    elif summary.get("interim_best_patch"):
        text += f"; interim patch (not re-measured) {summary['interim_best_patch']}"
    return text


class SearchHooks:
    """How this module watches and steers `optimize_search.run_search` (see its doc)."""

    def __init__(self, settings: Any, record: KernelRecord, run: RunFolder, state: SearchState):
        self.settings = settings
        self.record = record
        self.run = run
        self.state = state
        self.resume = run.resumed

    def phase(self, name: str) -> None:
        self.state.progress.phase(name)

    def backend(self, out_dir: Path) -> Any:
        """A replay (directory or file, noise-tolerant); None: the loop's own backend."""
        backend = _backend(self.settings, self.record, self.run)
        if backend is not None:
            self.state.backend_name = getattr(backend, "name", "")
        else:
            self.state.backend_name = self.settings.llm
        return backend

    def checked_current(self, evaluation: Evaluation) -> None:
        self.state.current = evaluation
        if evaluation.ok:
            return
        reason = evaluation.reason or evaluation.status
        if any(word in (reason + evaluation.logs) for word in _IMPORT_FAILURES):
            raise KernelproError(
                f"the sandbox cannot import the kernel {self.record.name} as pytest did: "
                f"{reason}. It runs with pytest's sys.path; make the kernel's imports work from "
                "the rootdir (pythonpath ini, a package, or conftest sys.path insertions)"
            )
        self.state.progress.note(
            f"the current kernel did not pass in the sandbox ({reason}); speedups are over "
            "the reference"
        )

    def wrap(self, generator: Any, evaluator: Any) -> tuple[Any, Any]:
        return ObservedGenerator(generator, self.state), ObservedEvaluator(evaluator, self.state)

    def started(self, algorithm: Any) -> None:
        self.state.algorithm = algorithm


def _search(
    run: ItemRun, services: Services, kernel_dir: Path, state: SearchState
) -> dict[str, Any]:
    from pytest_kernelpro.optimize.loop.compose import run_search
    from pytest_kernelpro.optimize.loop.patch import PatchError
    from pytest_kernelpro.optimize.loop.runs import open_run
    from pytest_kernelpro.optimize.loop.site import kernel_site

    settings = services.settings
    folder = open_run(kernel_dir, resume=settings.resume)
    state.run = folder
    state.progress.note(("resuming " if folder.resumed else "run folder ") + str(folder.path))
    try:
        state.site, state.root = kernel_site(
            run.locator, run.problem.kind, run.module, settings.rootpath
        )
    except PatchError as exc:
        state.site_error = f"no patch can be written: {exc}"
    state.progress.phase("checking")
    hooks = SearchHooks(settings, run.record, folder, state)
    state.setup_s = time.monotonic() - state.started
    ranking, details = run_search(run, services, folder.path, hooks=hooks)
    atomic_write_json(folder.path / "ranking.json", ranking.to_dict())
    return state.final(ranking, details)


def _backend(settings: Any, record: KernelRecord, run: RunFolder) -> Any:
    """The model backend, recording every call into the run folder."""
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMError
    from pytest_kernelpro.optimize.agents.llm.replay import RecordingBackend
    from pytest_kernelpro.optimize.loop.replay import (
        NoiseTolerantReplay,
        recording_for,
        replay_source,
    )

    source = replay_source(settings.llm)
    if source is None:
        return None  # the loop builds the model backend, recording into the run folder
    try:
        path = recording_for(source, record.name, record.kernel)
        if path is None:
            raise KernelproError(
                f"the replay directory {source} has no recording for {record.name}"
            )
        replay = NoiseTolerantReplay(path)
        if run.resumed:
            # Answers whose candidates reached the trajectory; one generated but cut off by
            # the interruption before it was evaluated is served again.
            replay.skip_served(run.trajectory)
        return RecordingBackend(replay, run.llm_calls)
    except LLMError as exc:
        raise KernelproError(str(exc)) from None
