"""Live progress of a search: phase, evaluations of the budget, best speedup over the
current kernel, spend and elapsed time, for the kernel being optimized.

On a terminal it is one rich line redrawn in place; otherwise (CI logs, pytester) a plain
line per evaluation. pytest captures output while a test runs, so every write goes through
`suspend` (the capture manager's `global_and_fixture_disabled`). Updates happen on events
only (a phase change of the sandbox worker, an evaluation, a model call): no thread.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

# The sandbox worker's phases (optimize/sandbox/worker.py) as the user reads them.
WORKER_PHASES = {
    "start": "building",
    "import": "building",
    "reference": "building",
    "build": "building",
    "built": "checking",
    "correctness": "checking",
    "checks": "checking",
    "shapes": "checking",
    "timing": "timing",
    "done": "timing",
    "profile": "profiling",
    "profiling": "profiling",
}
PHASES = ("preparing", "generating", "building", "checking", "timing", "profiling", "ranking")


class SearchProgress:
    """Progress of one kernel's search (module doc)."""

    def __init__(
        self,
        kernel: str,
        budget: str,
        *,
        write_line: Callable[[str], None],
        live: bool = False,
        suspend: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        clock: Callable[[], float] = time.monotonic,
        max_evaluations: int | None = None,
    ) -> None:
        self.kernel = kernel
        self.budget = budget
        self.write_line = write_line
        self.suspend = suspend
        self.clock = clock
        self.started = clock()
        self.phase_name = "preparing"
        self.evaluations = 0
        self.max_evaluations = max_evaluations
        self.best: float | None = None  # best speedup over the current kernel
        self.usd = 0.0
        self._live: Any = None
        if live:
            self._start_live()

    # ----- events -----

    def phase(self, name: str) -> None:
        shown = WORKER_PHASES.get(name, name)
        if shown != self.phase_name:
            self.phase_name = shown
            self._refresh()

    def spent(self, usd: float) -> None:
        self.usd = usd

    def evaluated(
        self, status: str, speedup: float | None, *, label: str = "", note: str = ""
    ) -> None:
        """One more evaluation; `speedup` is over the current kernel (None: not correct);
        `note` is said after the outcome (what profiling the candidate cost)."""
        self.evaluations += 1
        if speedup is not None and (self.best is None or speedup > self.best):
            self.best = speedup
        if self._live is None:
            outcome = f"{speedup:.2f}x the current kernel" if speedup is not None else status
            self._line(f"{label + ' ' if label else ''}{outcome}{'; ' + note if note else ''}")
        else:
            self._refresh()

    def note(self, text: str) -> None:
        """A line that stays (start, resume, interruption)."""
        self._line(text, stay=True)

    def close(self, text: str | None = None) -> None:
        if self._live is not None:
            with self.suspend():
                self._live.update(self._render(), refresh=True)
                self._live.stop()
            self._live = None
        if text:
            self._line(text, stay=True)

    # ----- output -----

    def status_text(self) -> str:
        used = (
            f"{self.evaluations}/{self.max_evaluations}"
            if self.max_evaluations
            else str(self.evaluations)
        )
        best = f"{self.best:.2f}x" if self.best is not None else "-"
        elapsed = self.clock() - self.started
        return (
            f"kernelpro optimize {self.kernel}: {self.phase_name}, {used} evaluations "
            f"(budget {self.budget}), best {best} over the current kernel, ${self.usd:.2f}, "
            f"{_clock(elapsed)}"
        )

    def _line(self, text: str, stay: bool = False) -> None:
        if self._live is not None and stay:
            with self.suspend():
                self._live.console.print(
                    f"kernelpro optimize {self.kernel}: {text}", highlight=False
                )
            return
        if self._live is None:
            prefix = f"kernelpro optimize {self.kernel}: "
            body = text if stay else f"{text} [{self._counts()}]"
            with self.suspend():
                self.write_line(prefix + body)

    def _counts(self) -> str:
        used = (
            f"{self.evaluations}/{self.max_evaluations}"
            if self.max_evaluations
            else str(self.evaluations)
        )
        best = f"{self.best:.2f}x" if self.best is not None else "-"
        return f"{used} evaluations, best {best}, ${self.usd:.2f}, {_clock(self.clock() - self.started)}"

    def _render(self) -> Any:
        from rich.text import Text

        return Text(self.status_text())

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live

        with self.suspend():
            console = Console(highlight=False)
            self._live = Live(self._render(), console=console, auto_refresh=False, transient=False)
            console.print()
            self._live.start(refresh=True)

    def _refresh(self) -> None:
        if self._live is not None:
            with self.suspend():
                self._live.update(self._render(), refresh=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def pytest_progress(
    config: Any, kernel: str, budget: str, max_evaluations: int | None
) -> SearchProgress:
    """A `SearchProgress` writing to pytest's terminal past its output capture."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    suspend = capman.global_and_fixture_disabled if capman is not None else _nothing
    writer = getattr(reporter, "_tw", None)
    live = bool(getattr(writer, "hasmarkup", False)) and bool(
        getattr(getattr(writer, "_file", None), "isatty", lambda: False)()
    )

    def write_line(text: str) -> None:
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(text)
        else:  # no terminal reporter (-p no:terminal): still say it
            sys.stdout.write(text + "\n")

    return SearchProgress(
        kernel,
        budget,
        write_line=write_line,
        live=live,
        suspend=suspend,
        max_evaluations=max_evaluations,
    )
