"""Watching and ending a sandboxed process: how it ended, its process group and
descendants, their resident memory, its progress file and logs, and what a killed build
leaves behind."""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, overload

from pytest_kernelpro.optimize.sandbox.safe_read import read_tail_fd, read_text
from pytest_kernelpro.optimize.sandbox.safe_read import remove_tree as safe_remove_tree


@dataclass(frozen=True)
class ProcessRun:
    """How one sandboxed process ended."""

    returncode: int | None
    killed: str | None
    phase: str
    peak_mb: float
    wall_s: float
    logs: str
    # When the parent first saw the worker's "timing" and "timed" phases, with the tree's CPU
    # time then (`outside_view.py`): what the worker's timing claim is checked against.
    phase_marks: dict[str, Any] = field(default_factory=dict)

    def how(self) -> str:
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"signal {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"signal {-self.returncode}"
        return f"exit code {self.returncode}"


def sandbox_setup_error(logs: str) -> str | None:
    for line in logs.splitlines():
        if "kernelpro sandbox: setup failed" in line:
            return line.split("setup failed", 1)[1].lstrip(", :")[:400]
    return None


@functools.cache
def die_with_parent() -> tuple[str, ...]:
    """`setpriv --pdeathsig KILL --` where util-linux has it: the kernel kills the sandbox
    when the thread that started (and watches) it exits. Empty where it is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    try:
        probe = subprocess.run(
            [*prefix, "true"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return prefix if probe.returncode == 0 else ()


class ExitWait:
    """Pauses between a watcher's polls that end the moment `proc` exits: its pidfd (Linux
    5.3+) becomes readable then, so the watcher sees the end without waiting out the pause.
    Like `exited` it never reaps the process. Without pidfds, a plain sleep."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._fd: int | None = None
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            try:
                self._fd = opener(proc.pid)
            except OSError:  # too old a kernel, or the process is gone already
                self._fd = None

    def pause(self, seconds: float) -> None:
        if self._fd is None:
            time.sleep(seconds)
        else:
            select.select([self._fd], [], [], seconds)

    def __enter__(self) -> ExitWait:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def exited(proc: subprocess.Popen[bytes]) -> bool:
    """True once the worker exited, without reaping it: until `wait`, its pid (and so its
    process group id) cannot be reused, so killing the group stays safe."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return proc.poll() is not None
    try:
        info = waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as handle:
                kids += [int(k) for k in handle.read().split()]
    except (OSError, ValueError):
        pass
    return kids


def tree_size_mb(root: Path, limit_entries: int = 100_000) -> float:
    """Megabytes of the plain files under `root` (links not followed), at most
    `limit_entries` entries looked at."""
    total, todo, seen = 0, [str(root)], 0
    while todo and seen < limit_entries:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total / (1024 * 1024)


@overload
def tree_rss_mb(pid: int, *, shared: bool = True) -> float: ...
@overload
def tree_rss_mb(pid: int, *, count: Literal[True], shared: bool = True) -> tuple[float, int]: ...


def tree_rss_mb(pid: int, *, count: bool = False, shared: bool = True) -> float | tuple[float, int]:
    """Resident memory of `pid` and all its descendants (the sandbox's `unshare` holds the
    worker as a child, and a candidate may start processes of its own); with `count`, also
    how many processes the tree holds (at most 65536 looked at); `shared=False` leaves out
    the shared-memory pages they map (the checked outputs handed over by handle, which the
    session counts once on its own)."""
    total, todo, seen = 0.0, [pid], set()
    while todo and len(seen) < 65536:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += rss_mb(current, shared=shared)
        todo += children(current)
    return (total, len(seen)) if count else total


def rss_mb(pid: int, *, shared: bool = True) -> float:
    """Resident memory of `pid` (without its mapped shared-memory pages when not `shared`)."""
    rss = shmem = 0
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssShmem:"):
                    shmem = int(line.split()[1])
    except (OSError, ValueError):
        return 0.0
    return (rss if shared else max(0, rss - shmem)) / 1024.0


# The progress file: a line per phase (a few dozen), far below this.
PROGRESS_LIMIT = 1024 * 1024


def last_phase(progress_path: Path) -> str | None:
    """The last phase the process reported (None: none, or the file is not a plain file:
    the candidate's, read without following its links, `safe_read`)."""
    try:
        text = read_text(progress_path, PROGRESS_LIMIT)
    except OSError:
        return None
    # Complete lines are "phase timestamp"; a line still being written is skipped.
    for line in reversed(text.splitlines()):
        fields = line.split()
        if len(fields) == 2:
            return fields[0]
    return None


def phase_seconds(progress_path: Path, launched: float, ended: float) -> dict[str, float]:
    """Seconds the worker spent in each phase it reported, from its progress lines ("phase
    monotonic-time"; CLOCK_MONOTONIC is the same clock in and outside the sandbox's
    namespaces): `launch` is the wait from the launch (`launched`) to its first line (the
    sandbox's setup and the interpreter's start), each phase lasts until the next line, the
    last until the process ended (`ended`)."""
    try:
        text = read_text(progress_path, PROGRESS_LIMIT)
    except OSError:
        return {}
    marks: list[tuple[str, float]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2:
            continue  # a line still being written when the process ended
        try:
            marks.append((fields[0], float(fields[1])))
        except ValueError:
            continue
    if not marks:
        return {}
    out: dict[str, float] = {"launch": max(0.0, marks[0][1] - launched)}
    for (phase, at), (_, after) in zip(marks, [*marks[1:], ("end", ended)], strict=True):
        out[phase] = out.get(phase, 0.0) + max(0.0, after - at)
    return {k: round(v, 3) for k, v in out.items()}


def log_tail(stdout: IO[bytes], stderr: IO[bytes], limit: int) -> str:
    """The last `limit` characters of a process's output (half each), read through the
    session's own descriptors of the log files it created before the process started
    (`safe_read.read_tail_fd`): never through their names, which the candidate may have
    replaced with links."""
    parts = []
    for label, handle in (("stdout", stdout), ("stderr", stderr)):
        half = limit // 2
        try:
            raw = read_tail_fd(handle.fileno(), 4 * half + 4)
            size = os.fstat(handle.fileno()).st_size
        except (OSError, ValueError):
            continue
        text = raw.decode("utf-8", errors="replace")
        if text.strip():
            if len(text) > half or size > len(raw):
                text = "[...]\n" + text[-half:]
            parts.append(f"----- worker {label} -----\n{text.rstrip()}")
    return "\n".join(parts)


def clear_stale_locks(extensions_dir: Path, since: float) -> None:
    """Remove torch build locks created after `since` (monotonic) by a killed worker."""
    if not extensions_dir.is_dir():
        return
    cutoff = time.time() - (time.monotonic() - since)
    for lock in extensions_dir.glob("*/lock"):
        try:
            if lock.stat().st_mtime >= cutoff - 1.0:
                lock.unlink()
        except OSError:
            pass


def remove_tree(path: Path) -> None:
    """Remove a directory a candidate could write, following no link (`safe_read`)."""
    safe_remove_tree(path)
