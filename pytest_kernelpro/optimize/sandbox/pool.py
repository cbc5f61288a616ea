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
started exactly as a freshly launched worker is (`supervise.WorkerSupervision._watch`, `kill_group`);
the only difference is when its interpreter started. It serves one order and exits.

The pool keeps `size` standbys of each kind (worker, judge: their sandbox views differ);
`scratch_dir` hands one's directory to the next evaluation (a new directory when none waits:
the evaluator launches a fresh process as before), so the task and the kept caches go where
the sandbox lets it write, and `launch` gives it its order. What its warm start cost and how long it waited is in
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
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pytest_kernelpro.optimize.sandbox.processes import (
    ProcessRun,
    kill_group,
    log_tail,
    remove_tree,
)
from pytest_kernelpro.optimize.sandbox.safe_read import create_log, read_text

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.sandbox.evaluator import SandboxEvaluator

ORDER = "order.json"
READY = "ready"
WORKER, JUDGE = (
    "pytest_kernelpro.optimize.sandbox.worker",
    "pytest_kernelpro.optimize.sandbox.judge",
)


@dataclass
class Standby:
    """One started process waiting for its order."""

    kind: str  # WORKER or JUDGE: what its sandbox view was made for
    proc: subprocess.Popen[bytes]
    workdir: Path  # its scratch directory
    launched: float  # monotonic, when it was started
    logs: list[IO[bytes]] = field(default_factory=list)

    def ready_after_s(self) -> float | None:
        """Seconds from its start to 'imported, waiting' (None: not there yet)."""
        try:
            at, _ = read_text(self.workdir / READY, 4096).split()
        except (OSError, ValueError):
            return None
        return max(0.0, float(at) - self.launched)

    def close(self) -> None:
        for handle in self.logs:
            handle.close()
        self.logs = []


class StandbyPool:
    """Started-ahead sandboxed processes of one `SandboxEvaluator` (see the module doc).

    Every evaluation's directories live under one root: per evaluation an area with its
    `scratch` (the process's working directory, watched against the scratch limit) and its
    `outputs` (the checked outputs for the judge, writable by the worker, watched against
    `SandboxLimits.outputs_limit_mb`). A worker's sandbox sees its own area only; a judge
    (trusted: it never loads candidate code) is shown the root read-only, so a judge started
    before a worker ran can read that worker's outputs."""

    def __init__(self, evaluator: SandboxEvaluator, size: int) -> None:
        self.evaluator = evaluator
        self.size = max(0, int(size))  # processes of each kind kept waiting
        self._idle: list[Standby] = []
        self._given: dict[Path, Standby] = {}  # scratch directory -> standby handed over
        self._handovers: dict[Path, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._root: Path | None = None
        self.started = 0
        self.used = 0

    # ----- directories -----

    @property
    def root(self) -> Path:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="kernelpro-evals-"))
                # An evaluator never closed still leaves no directory behind.
                weakref.finalize(self, remove_tree, self._root)
            return self._root

    def _new_area(self, prefix: str) -> Path:
        area = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))
        (area / "scratch").mkdir()
        (area / "outputs").mkdir()
        return area / "scratch"

    def outputs_of(self, scratch: Path) -> Path:
        """Where the process of `scratch` writes its checked outputs."""
        if scratch.parent.parent == self._root and scratch.name == "scratch":
            return scratch.parent / "outputs"
        return scratch / "outputs"  # a directory the pool did not make

    def remove(self, scratch: Path) -> None:
        """Remove an evaluation's directories (its area)."""
        if scratch.parent.parent == self._root and scratch.name == "scratch":
            remove_tree(scratch.parent)
        else:
            remove_tree(scratch)

    # ----- the pool -----

    def fill(self) -> None:
        """Start standbys until `size` of each kind wait (each start is a Popen)."""
        for kind in (WORKER, JUDGE):
            while True:
                with self._lock:
                    if sum(1 for s in self._idle if s.kind == kind) >= self.size:
                        break
                standby = self._start(kind)
                with self._lock:
                    self._idle.append(standby)

    def _view(self, kind: str, scratch: Path) -> tuple[list[Path], list[Path]]:
        """(writable, readable) of a `kind` process in `scratch`, besides the scratch."""
        ev = self.evaluator
        if kind == JUDGE:
            return [], [*ev.readable_paths(), self.root]
        return [self.outputs_of(scratch)], list(ev.readable_paths())

    def _start(self, kind: str) -> Standby:
        ev = self.evaluator
        workdir = self._new_area("standby-")
        command = [
            ev.limits.python,
            "-m",
            "pytest_kernelpro.optimize.sandbox.standby",
            "--order",
            str(workdir / ORDER),
            "--ready",
            str(workdir / READY),
        ]
        writable, readable = self._view(kind, workdir)
        # Read back through these descriptors, never by name (`safe_read`).
        out, err = create_log(workdir / "stdout.log"), create_log(workdir / "stderr.log")
        proc = ev.start_sandboxed(command, workdir, writable, readable, out, err)
        self.started += 1
        return Standby(kind, proc, workdir, time.monotonic(), [out, err])

    def scratch_dir(self, prefix: str, *, judge: bool = False) -> Path:
        """A scratch directory for the next worker (or judge): a waiting standby's (handed
        over by `launch`), else a new area's."""
        kind = JUDGE if judge else WORKER
        while True:
            with self._lock:
                standby = next((s for s in self._idle if s.kind == kind), None)
                if standby is not None:
                    self._idle.remove(standby)
            if standby is None:
                return self._new_area(prefix)
            if standby.proc.poll() is None:
                with self._lock:
                    self._given[standby.workdir] = standby
                return standby.workdir
            self._discard(standby)  # died while waiting (killed, out of memory): not used

    def release(self, workdir: Path) -> None:
        """End the standby handed `workdir` if it was never launched."""
        with self._lock:
            standby = self._given.pop(workdir, None)
        if standby is not None:
            self._end(standby)

    def close(self) -> None:
        with self._lock:
            standbys = self._idle + list(self._given.values())
            self._idle, self._given = [], {}
        for standby in standbys:
            self._discard(standby)
        with self._lock:
            root, self._root = self._root, None
        if root is not None:
            remove_tree(root)

    def _end(self, standby: Standby) -> None:
        kill_group(standby.proc)
        standby.proc.wait()
        standby.close()

    def _discard(self, standby: Standby) -> None:
        self._end(standby)
        self.remove(standby.workdir)

    # ----- handing one over -----

    def launch(
        self,
        command: list[str],
        workdir: Path,
        progress_path: Path,
        result_path: Path,
        *,
        readable: Sequence[Path] = (),
        writable: Sequence[Path] = (),
    ) -> ProcessRun | None:
        """Run `command` (`python -m <worker or judge> ...`) in the standby waiting in
        `workdir`, watched as `WorkerSupervision._launch` watches a fresh process; None when
        no standby waits there, or when the command needs a view the standby's sandbox was
        not made with (the standby is ended, `workdir` kept: the caller launches fresh)."""
        with self._lock:
            standby = self._given.pop(workdir, None)
        if standby is None:
            return None
        allowed_writable, allowed_readable = self._view(standby.kind, workdir)
        fits = (
            len(command) >= 3
            and command[1] == "-m"
            and command[2] == standby.kind
            and all(Path(w) in allowed_writable for w in writable)
            and all(_under(Path(r), allowed_readable) for r in readable)
        )
        if not fits:
            self._end(standby)
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
            self._end(standby)
            raise
        wall = time.monotonic() - handed
        logs = log_tail(*standby.logs, ev.limits.log_chars)
        standby.close()
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
        return {"per_kind": self.size, "started": self.started, "used": self.used}


def _under(path: Path, roots: Sequence[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == r.resolve() or r.resolve() in resolved.parents for r in roots)
