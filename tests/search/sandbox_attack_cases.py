"""The hostile candidates of tests/data/search/attacks/ and what each must come to: written
once, run by test_sandbox_attacks.py (the sandbox evaluator in this process) and by
test_dask_sandbox.py (the same candidates on the workers of a local Dask cluster).

`programs(root, listener)` fills in each attack (its target files under `root`, the
listener's port) and makes the files it aims at; after the evaluations,
`CHECKS[name](outcome)` asserts that attack was blocked and that its evaluation says why.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.search.base import Evaluation

DATA = Path(__file__).resolve().parents[1] / "data" / "search"
REPO_FILES = {"kernels.py": "ORIGINAL\n", "kernelpro-baseline.yaml": "kernels: {}\n"}


def attack(name: str, **fill: object) -> str:
    text = (DATA / "attacks" / f"{name}.py").read_text(encoding="utf-8")
    for key, value in fill.items():
        text = text.replace(f"@@{key}@@", str(value))
    assert "@@" not in text, f"unfilled placeholder in {name}.py"
    return text


class Listener:
    """A loopback TCP server in this process that records every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                self.received.append(conn.recv(1024) or b"<connected>")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def programs(root: Path, listener: Listener) -> dict[str, str]:
    """Every attack, filled in: its targets are a repository under `root` (made here) and
    marker files beside it, its server `listener`."""
    repo = root / "repo"
    repo.mkdir()
    for name, text in REPO_FILES.items():
        (repo / name).write_text(text)
    return {
        "steal_environ": attack("steal_environ"),
        "connect_out": attack("connect_out", HOST=socket.gethostname(), PORT=listener.port),
        "write_repo": attack(
            "write_repo", TARGET=repo / "kernels.py", BASELINE=repo / "kernelpro-baseline.yaml"
        ),
        "setsid_escape": attack(
            "setsid_escape", MARKER=root / "alive.txt", PIDFILE=root / "pid.txt"
        ),
        "forge_result": attack("forge_result"),
        "forge_file": attack("forge_file"),
        "blame_user": attack("blame_user"),
        "mutates_inputs": attack("mutates_inputs"),
    }


@dataclass
class Outcome:
    """One attack's evaluation and what the checks look at around it."""

    evaluation: Evaluation
    root: Path
    listener: Listener
    isolation: Isolation
    secrets: tuple[str, ...]  # values set in the session's environment: none may leak


def everything(ev: Evaluation) -> str:
    return json.dumps(ev.to_dict(), default=str)


def _needs_namespaces(out: Outcome) -> None:
    if not out.isolation.isolated:
        pytest.skip(f"no Linux namespaces here: {out.isolation.why}")


def check_steal_environ(out: Outcome) -> None:
    ev = out.evaluation
    assert ev.status == "run_error"  # its forward raises with whatever it stole
    for secret in out.secrets:
        assert secret not in everything(ev)
    if out.isolation.isolated:
        assert "pids visible: [1]" in ev.logs  # a PID namespace: its parent is not there


def check_connect_out(out: Outcome) -> None:
    _needs_namespaces(out)
    ev = out.evaluation
    assert out.listener.received == []
    assert "ESCAPED" not in ev.logs
    assert "blocked connect to 127.0.0.1: [Errno 101] Network is unreachable" in ev.logs
    assert ev.status == "correct", ev.reason  # the kernel itself still runs and is timed


def check_write_repo(out: Outcome) -> None:
    _needs_namespaces(out)
    ev = out.evaluation
    for name, text in REPO_FILES.items():
        assert (out.root / "repo" / name).read_text() == text
    assert "ESCAPED" not in ev.logs
    assert "blocked write to" in ev.logs
    assert "Read-only file system" in ev.logs
    assert "wrote scratch-file.txt" in ev.logs  # the scratch directory stays writable
    assert ev.status == "correct", ev.reason


def check_setsid_escape(out: Outcome) -> None:
    _needs_namespaces(out)
    ev = out.evaluation
    assert "started pid" in ev.logs
    # Its marker file is outside the scratch directory (read-only), and the process is gone:
    # the PID namespace died with the sandboxed process.
    assert not (out.root / "alive.txt").exists()
    assert not (out.root / "pid.txt").exists()
    assert ev.status == "build_error"  # its module raised when it could not write the file
    assert "Read-only file system" in (ev.reason or "")


def _failed_as(out: Outcome, status: str, *, starts: str = "", says: str = "") -> None:
    """The attack's evaluation has `status` and a reason that starts with `starts` and
    contains `says`."""
    ev = out.evaluation
    assert ev.status == status, ev.reason
    assert (ev.reason or "").startswith(starts), ev.reason
    assert says in (ev.reason or ""), ev.reason


def check_forge_result(out: Outcome) -> None:
    """A patched pipeline cannot forge a result."""
    _failed_as(
        out,
        "cheat",
        starts="result not confirmed: the worker reported a correct result, but the outputs "
        "it handed over differ from the reference computed in a trusted process (trial-1: "
        "FileNotFoundError: no output file trial-1.pt)",
    )
    assert out.evaluation.speedup is None


def check_forge_file(out: Outcome) -> None:
    """A result file written by the candidate is not believed."""
    _failed_as(out, "cheat", says="no output file trial-1.pt")


def check_blame_user(out: Outcome) -> None:
    """A candidate cannot blame the user's problem file: no KernelproError ended the search,
    since the reference ran fine in a trusted process."""
    _failed_as(
        out,
        "run_error",
        starts="the worker reported that the reference failed, but the reference runs in a "
        "trusted process: counted as this candidate's failure",
    )


def check_mutates_inputs(out: Outcome) -> None:
    """A kernel that writes into its inputs fails."""
    _failed_as(out, "cheat", says="modifies its inputs in place (trial 1/3)")


CHECKS: dict[str, Callable[[Outcome], None]] = {
    "steal_environ": check_steal_environ,
    "connect_out": check_connect_out,
    "write_repo": check_write_repo,
    "setsid_escape": check_setsid_escape,
    "forge_result": check_forge_result,
    "forge_file": check_forge_file,
    "blame_user": check_blame_user,
    "mutates_inputs": check_mutates_inputs,
}
