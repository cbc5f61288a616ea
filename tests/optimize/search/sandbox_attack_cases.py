"""The hostile candidates of tests/data/search/attacks/ and what each must come to: written
once, run by test_sandbox_attacks.py (the sandbox evaluator in this process) and by
test_dask_sandbox.py (the same candidates on the workers of a local Dask cluster).

`programs(root, listener)` fills in each attack (its target files under `root`, the
listener's port) and makes the files it aims at; after the evaluations,
`CHECKS[name](outcome)` asserts that attack was blocked and that its evaluation says why.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.search.interfaces import Evaluation

DATA = Path(__file__).resolve().parents[2] / "data" / "search"
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
    """Every attack, filled in: its targets are a repository under `root` (made here; the
    task's sys.path, so the sandbox shows it read-only) and files in it, its server
    `listener`."""
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
        # Its targets are in the repository: visible (the task's sys.path) and read-only.
        "setsid_escape": attack(
            "setsid_escape", MARKER=repo / "alive.txt", PIDFILE=repo / "pid.txt"
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
    assert not (out.root / "repo" / "alive.txt").exists()
    assert not (out.root / "repo" / "pid.txt").exists()
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
        "no output trial-1 was handed over)",
    )
    assert out.evaluation.speedup is None


def check_forge_file(out: Outcome) -> None:
    """A result file written by the candidate is not believed."""
    _failed_as(out, "cheat", says="no output trial-1 was handed over")


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
    """A kernel that writes into its inputs fails: a checked call's inputs are read-only
    shared memory (`input_handles.py`), the write faults, and the reason says so."""
    _failed_as(out, "run_error", says="a checked call's inputs are read-only shared memory")


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


# ------------------------------------------------- the allow-list view, builds and limits
# A second group (test_sandbox_attacks.py runs it with a home directory of credentials, a
# repository holding secret files, builds ahead on and a small scratch limit).

HOME_SECRETS = {
    ".vault-token": "hvs.kp-vault-6f1e2d3c4b5a69788",
    ".cargo/credentials.toml": '[registry]\ntoken = "cio-kp-cargo-0a9b8c7d6e5f4"\n',
    ".config/git/credentials": "https://kp-user:kp-git-pass-5e4d3c2b1a@example.com\n",
    ".pgpass": "db.example.com:5432:*:kp:kp-pg-pass-77aa88bb99\n",
}
REPO_SECRETS = {
    ".env": "DB_PASSWORD=kp-repo-env-3c4d5e6f7a8b\n",
    ".env.production": "API_KEY=kp-repo-prod-9f8e7d6c5b4a\n",
    "deploy/id_ed25519": "kp-repo-sshkey-1a2b3c4d5e6f\n",
    ".git/config": '[remote "origin"]\n\turl = https://x-access-token:kp-repo-gittoken-4f5e6d@github.com/o/r\n',
}
SCRATCH_LIMIT_MB = 64
FLOOD_MB = 24
DAEMON_TAG = "kp-daemon-tag-8c1f0e"


def allow_list_world(root: Path, extensions: Path) -> tuple[dict[str, str], Path, Path]:
    """The second group's programs, its home directory and its repository (made here)."""
    home, repo = root / "home", root / "repo2"
    for base, files in ((home, HOME_SECRETS), (repo, REPO_SECRETS)):
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
    (repo / "kernels.py").write_text("ORIGINAL\n")
    programs = {
        "build_flags": attack("build_flags", MARKER=root / "flag-marker"),
        "read_secrets": attack("read_secrets", HOME=home, REPO=repo),
        "exfil_output": attack("exfil_output"),
        "double_fork": attack("double_fork", TAG=DAEMON_TAG),
        "fill_disk": attack("fill_disk", MB=SCRATCH_LIMIT_MB),
        "flood_output": attack("flood_output", MB=FLOOD_MB),
        "poison_cache": attack("poison_cache", EXTENSIONS=extensions),
    }
    return programs, home, repo


def all_secrets() -> list[str]:
    """The secret values of the second group's files (none may reach an evaluation)."""
    found = []
    for text in [*HOME_SECRETS.values(), *REPO_SECRETS.values()]:
        found += re.findall(r"kp-[a-z-]+-[0-9a-f]{6,}|hvs\.[\w-]+", text)
    return found


def check_build_flags(out: Outcome) -> None:
    """A flag with a shell command is refused by name, ahead and in the worker; nothing ran."""
    assert not (out.root / "flag-marker").exists()
    _failed_as(out, "build_error", says="compiler flag '-O2; touch ")
    assert "in extra_cflags is not allowed" in (out.evaluation.reason or "")
    prebuild = out.evaluation.metrics.get("build", {}).get("prebuild") or {}
    assert any("compiler flag '-O2; touch " in e for e in prebuild.get("errors", [])), prebuild


def check_read_secrets(out: Outcome) -> None:
    """Home, the repository's secret files and other processes' environments: unreadable or
    empty, and nothing of them in the evaluation."""
    _needs_namespaces(out)
    ev = out.evaluation
    assert ev.status == "run_error", ev.reason
    text = everything(ev)
    for secret in [*all_secrets(), *out.secrets]:
        assert secret not in text, secret
    home = out.root / "home"
    for rel in HOME_SECRETS:
        assert f"blocked {home / rel}: No such file or directory" in ev.logs
    repo = out.root / "repo2"
    for rel in REPO_SECRETS:  # not imported by the kernel: not in the project view
        assert f"blocked {repo / rel}: No such file or directory" in ev.logs
    assert "/environ: No such file or directory" in ev.logs  # the parent is not there


def check_exfil_output(out: Outcome) -> None:
    """Token shapes and escape sequences in stdout, stderr and the error text are redacted
    and removed before anything stores or shows them."""
    ev = out.evaluation
    assert ev.status == "run_error", ev.reason
    text = everything(ev)
    assert "ghp_Q7w8" not in text
    assert "sk-ant-api03-Zx9" not in text
    assert "\\u001b" not in text
    assert "\x1b" not in ev.logs
    assert "[redacted: github token]" in ev.logs
    assert "[redacted: anthropic key]" in ev.logs
    assert "[redacted: github token]" in (ev.reason or "")


def _processes_with(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if tag.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def check_double_fork(out: Outcome) -> None:
    """A daemon (fork, setsid, fork) dies with the candidate's PID namespace."""
    _needs_namespaces(out)
    ev = out.evaluation
    assert "daemon started" in ev.logs
    assert ev.status == "correct", ev.reason
    assert _processes_with(DAEMON_TAG) == []


def check_fill_disk(out: Outcome) -> None:
    """One file stops at the limit (EFBIG); more files get the worker killed."""
    _needs_namespaces(out)
    ev = out.evaluation
    assert f"one file stopped at {SCRATCH_LIMIT_MB} MB: File too large" in ev.logs
    assert "ESCAPED" not in ev.logs
    _failed_as(
        out,
        "run_error",
        starts=f"scratch disk full: the candidate wrote more than {SCRATCH_LIMIT_MB} MB",
    )


def check_flood_output(out: Outcome, log_chars: int) -> None:
    """Megabytes of output: the evaluation keeps a bounded tail, and the kernel is timed."""
    ev = out.evaluation
    assert ev.status == "correct", ev.reason
    assert "FLOOD-END" in ev.logs
    assert len(ev.logs) <= log_chars + 2000


def check_poison_cache(out: Outcome, extensions: Path, cache: Path) -> None:
    """The build cache is read-only and the session's extensions directory is not there."""
    _needs_namespaces(out)
    ev = out.evaluation
    assert "ESCAPED" not in ev.logs
    assert ev.logs.count("blocked plant") == 3
    assert "Read-only file system" in ev.logs
    assert not (extensions / "kp_ext_shared").exists()
    assert not (cache / "planted.txt").exists()
    assert not (cache / "ab" / "planted").exists()
    assert ev.status == "correct", ev.reason
