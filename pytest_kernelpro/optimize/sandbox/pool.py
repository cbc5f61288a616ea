"""Warm sandboxed processes for the evaluator: each worker and judge process is started
ahead, inside the sandbox, with torch and the project imported, and waits for its task.

Why: every evaluation ran two fresh interpreters (the worker, then the judge), each paying
torch's import (3-5 s on the H200 machine) on the critical path of the search. A `Standby`
(`standby.py`) pays it while the search does something else (the model generating the next
candidate, the previous candidate's profile), and the evaluation hands it its task.

Why a process started ahead and not a child forked from a warm parent inside the namespaces:
a forked child shares its parent's memory image and namespaces, so every candidate would run
beside a long-lived process holding the state of all earlier ones (and CUDA cannot be used in
a child forked after its parent started CUDA, so the parent could never touch the GPU). A
standby is one fresh process per candidate, in its own namespaces, killed with everything it
started exactly as a freshly launched worker is (`SandboxEvaluator._watch`, `kill_group`);
the only difference is when its interpreter started. It serves one order and exits.

The pool keeps `size` standbys; `take` hands one over (None when none was started: the
evaluator launches a fresh process as before). A standby's scratch directory is the
evaluation's (`scratch_dir`), so the task, the outputs and the kept caches go where the
sandbox lets it write. What its warm start cost and how long it waited is in
`Evaluation.metrics["standby"]`; the evaluation's `wall_s` (and so the search's wall split)
counts from the hand-over, and whatever import was still running then is inside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pytest_kernelpro.optimize.sandbox.processes import (
    ProcessRun,
    die_with_parent,
    kill_group,
    log_tail,
    remove_tree,
)
from pytest_kernelpro.optimize.sandbox.standby import ENTRY_POINTS

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.sandbox.evaluator import SandboxEvaluator

ORDER = "order.json"
READY = "ready"


@dataclass
class Standby:
    """One started process waiting for its order."""

    proc: subprocess.Popen[bytes]
    workdir: Path
    launched: float  # monotonic, when it was started
    logs: list[IO[bytes]] = field(default_factory=list)

    def ready_after_s(self) -> float | None:
        """Seconds from its start to 'imported, waiting' (None: not there yet)."""
        try:
            at, _ = (self.workdir / READY).read_text(encoding="utf-8").split()
        except (OSError, ValueError):
            return None
        return max(0.0, float(at) - self.launched)

    def close(self) -> None:
        for handle in self.logs:
            handle.close()
        self.logs = []


class StandbyPool:
    """Started-ahead sandboxed processes of one `SandboxEvaluator` (see the module doc)."""

    def __init__(self, evaluator: SandboxEvaluator, size: int) -> None:
        self.evaluator = evaluator
        self.size = max(0, int(size))
        self._idle: list[Standby] = []
        self._given: dict[Path, Standby] = {}  # scratch directory -> standby handed over
        self._lock = threading.Lock()
        self._handovers: dict[Path, dict[str, Any]] = {}
        self.started = 0
        self.used = 0

    # ----- the pool -----

    def fill(self) -> None:
        """Start standbys until `size` wait (each start is a Popen: milliseconds)."""
        while True:
            with self._lock:
                if len(self._idle) >= self.size:
                    return
            standby = self._start()
            with self._lock:
                self._idle.append(standby)

    def _start(self) -> Standby:
        ev = self.evaluator
        workdir = Path(tempfile.mkdtemp(prefix="kernelpro-standby-"))
        command = [
            ev.limits.python,
            "-m",
            "pytest_kernelpro.optimize.sandbox.standby",
            "--order",
            str(workdir / ORDER),
            "--ready",
            str(workdir / READY),
        ]
        ev.extensions_dir.mkdir(parents=True, exist_ok=True)
        wrapped = ev.isolation.wrap(
            command, scratch=workdir, writable=[ev.extensions_dir], python=ev.limits.python
        )
        wrapped = [*die_with_parent(), *wrapped]
        env = ev.environment(workdir)
        out = open(workdir / "stdout.log", "wb")  # noqa: SIM115 - closed with the standby
        err = open(workdir / "stderr.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            wrapped,
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.started += 1
        return Standby(proc, workdir, time.monotonic(), [out, err])

    def scratch_dir(self, prefix: str) -> Path:
        """A scratch directory for the next process: a waiting standby's (handed over by
        `launch`), else a new empty one."""
        while True:
            with self._lock:
                standby = self._idle.pop(0) if self._idle else None
            if standby is None:
                return Path(tempfile.mkdtemp(prefix=prefix))
            if standby.proc.poll() is None:
                with self._lock:
                    self._given[standby.workdir] = standby
                return standby.workdir
            self._discard(standby)  # died while waiting (killed, out of memory): not used

    def release(self, workdir: Path) -> None:
        """Forget a scratch directory that will not be launched (its standby is killed)."""
        with self._lock:
            standby = self._given.pop(workdir, None)
        if standby is not None:
            self._discard(standby)

    def close(self) -> None:
        with self._lock:
            standbys = self._idle + list(self._given.values())
            self._idle, self._given = [], {}
        for standby in standbys:
            self._discard(standby)

    def _discard(self, standby: Standby) -> None:
        kill_group(standby.proc)
        standby.proc.wait()
        standby.close()
        remove_tree(standby.workdir)

    # ----- handing one over -----

    def launch(
        self, command: list[str], workdir: Path, progress_path: Path, result_path: Path
    ) -> ProcessRun | None:
        """Run `command` (`python -m <worker or judge> ...`) in the standby waiting in
        `workdir`, watched as `SandboxEvaluator._launch` watches a fresh process; None when
        no standby waits there (the caller launches one)."""
        with self._lock:
            standby = self._given.pop(workdir, None)
        if standby is None:
            return None
        if len(command) < 3 or command[1] != "-m" or command[2] not in ENTRY_POINTS:
            self._discard(standby)
            return None
        ev = self.evaluator
        handed = time.monotonic()
        ready = standby.ready_after_s()
        order = workdir / (ORDER + ".tmp")
        order.write_text(json.dumps({"module": command[2], "argv": command[3:]}), "utf-8")
        os.replace(order, workdir / ORDER)  # atomic: the standby reads a whole order
        self.used += 1
        try:
            killed, phase, peak_mb = ev._watch(standby.proc, progress_path, result_path, handed)
        except BaseException:
            kill_group(standby.proc)
            standby.proc.wait()
            standby.close()
            raise
        wall = time.monotonic() - handed
        standby.close()
        logs = log_tail(workdir / "stdout.log", workdir / "stderr.log", ev.limits.log_chars)
        with self._lock:
            self._handovers[workdir] = {
                # Started this long before its task came (its import ran meanwhile).
                "started_before_s": round(handed - standby.launched, 3),
                # Its imports took this long after its start (None: not done at hand-over,
                # the rest of them is inside the run's wall time).
                "imported_after_s": None if ready is None else round(ready, 3),
            }
        return ProcessRun(standby.proc.returncode, killed, phase, peak_mb, wall, logs)

    def handover(self, workdir: Path) -> dict[str, Any] | None:
        """What the standby run in `workdir` started with (once; None: a fresh launch)."""
        with self._lock:
            return self._handovers.pop(workdir, None)

    def describe(self) -> dict[str, Any]:
        return {"size": self.size, "started": self.started, "used": self.used}
