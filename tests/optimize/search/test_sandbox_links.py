"""No path the candidate could have touched (optimize/sandbox/safe_read.py): every file the
session reads or removes in a directory a candidate could write is a plain file it created
or opens without following a link; links, hard links, FIFOs and devices are refused with a
reason. First the helpers against each kind of planted file, then hostile candidates that
plant them in their own scratch directory (tests/data/search/attacks/link_files.py), run by
the real sandboxed evaluator, fresh and from the standby pool."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sandbox_attack_cases import DATA, attack

from pytest_kernelpro.optimize.sandbox import safe_read
from pytest_kernelpro.optimize.sandbox.compile_cache import CompileCaches
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.sandbox.processes import last_phase, log_tail, phase_seconds
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

CANARY = "kp-link-canary-5d1e9a7c3b"


def canary_forms(canary: str = CANARY) -> list[str]:
    """The canary plain, reversed and hex-encoded (what a candidate would send out)."""
    return [canary, canary[::-1], canary.encode().hex()]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "secret.env"
    path.parent.mkdir()
    path.write_text(f"TOKEN={CANARY}\nstart 1.0\n")
    return path


def plant(path: Path, kind: str, target: Path) -> None:
    """What a candidate leaves at `path`: a link to `target`, a hard link to it, a FIFO, or
    a link to a device."""
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "environ":
        path.symlink_to("/proc/self/environ")
    elif kind == "cwd-env":
        path.symlink_to("/proc/self/cwd/.env")
    elif kind == "hardlink":
        os.link(target, path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:  # pragma: no cover - the parametrisation names every kind
        raise AssertionError(kind)


KINDS = ["symlink", "environ", "cwd-env", "hardlink", "fifo", "dev-zero", "directory"]
REASONS = {
    "symlink": "is a symbolic link: not read",
    "environ": "is a symbolic link: not read",
    "cwd-env": "is a symbolic link: not read",
    "dev-zero": "is a symbolic link: not read",
    "hardlink": "has 2 hard links (a link to another file): not read",
    "fifo": "is a FIFO: not read",
    "directory": "is a directory: not read",
}


@pytest.mark.parametrize("kind", KINDS)
def test_read_file_refuses_every_planted_kind_with_the_reason(
    kind: str, tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(secret.parent)  # /proc/self/cwd/.env would be the project's
    (secret.parent / ".env").write_text(f"KEY={CANARY}\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = scratch / "result.json"
    plant(path, kind, secret)
    with pytest.raises(safe_read.UnsafeFile) as caught:
        safe_read.read_file(path)
    assert str(path) in str(caught.value)
    assert REASONS[kind] in str(caught.value)
    assert secret.read_text().startswith("TOKEN=")  # the target is untouched


def test_read_file_reads_a_plain_file_and_refuses_one_over_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text('{"status": "correct"}')
    assert json.loads(safe_read.read_text(path)) == {"status": "correct"}
    with pytest.raises(safe_read.UnsafeFile, match=r"holds 21 bytes, over 8: not read"):
        safe_read.read_file(path, limit=8)
    with pytest.raises(FileNotFoundError):
        safe_read.read_file(tmp_path / "missing.json")


def test_a_link_in_place_of_the_scratch_directory_is_not_followed(
    tmp_path: Path, secret: Path
) -> None:
    (tmp_path / "scratch").symlink_to(secret.parent)
    # O_DIRECTORY | O_NOFOLLOW on a link: "Not a directory".
    with pytest.raises(OSError, match="Not a directory"):
        safe_read.read_file(tmp_path / "scratch" / "secret.env")


@pytest.mark.parametrize("kind", KINDS)
def test_the_progress_file_of_every_kind_gives_no_phase(
    kind: str, tmp_path: Path, secret: Path
) -> None:
    """Its first word would be quoted as the phase in a reason ("in phase 'TOKEN=...'")."""
    path = tmp_path / "progress.log"
    plant(path, kind, secret)
    assert last_phase(path) is None
    assert phase_seconds(path, 0.0, 2.0) == {}


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "dev-zero"])
def test_logs_are_read_through_the_sessions_descriptors_whatever_replaced_their_names(
    kind: str, tmp_path: Path, secret: Path
) -> None:
    out_path, err_path = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with safe_read.create_log(out_path) as out, safe_read.create_log(err_path) as err:
        os.write(out.fileno(), b"before-link\n")
        for path in (out_path, err_path):
            path.unlink()
            plant(path, kind, secret)
        os.write(out.fileno(), b"after-link\n")  # the process keeps its descriptor
        logs = log_tail(out, err, 2000)
    assert logs == "----- worker stdout -----\nbefore-link\nafter-link"


def test_a_log_keeps_its_tail_when_it_is_flooded(tmp_path: Path) -> None:
    with safe_read.create_log(tmp_path / "stdout.log") as out:
        os.write(out.fileno(), b"x" * 100_000 + b"END")
        with safe_read.create_log(tmp_path / "stderr.log") as err:
            logs = log_tail(out, err, 100)
    assert logs.startswith("----- worker stdout -----\n[...]\n")
    assert logs.endswith("xxxEND")
    assert len(logs) < 100 + 40


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dev-zero"])
def test_a_log_is_never_created_through_a_planted_name(
    kind: str, tmp_path: Path, secret: Path
) -> None:
    path = tmp_path / "stdout.log"
    plant(path, kind, secret)
    # A link: ELOOP; a FIFO opens (read-write) and is refused by its type.
    with pytest.raises(OSError, match="Too many levels of symbolic links|is a FIFO: not read"):
        safe_read.create_log(path)
    assert secret.read_text().startswith("TOKEN=")


def test_removing_a_scratch_directory_follows_no_link(tmp_path: Path, secret: Path) -> None:
    outside = secret.parent
    (outside / "keep" / "deep").mkdir(parents=True)
    (outside / "keep" / "deep" / "file").write_text("kept")
    scratch = tmp_path / "scratch"
    (scratch / "home").mkdir(parents=True)
    (scratch / "link-to-dir").symlink_to(outside / "keep")
    (scratch / "home" / "link-to-file").symlink_to(secret)
    os.link(secret, scratch / "hard")
    os.mkfifo(scratch / "fifo")
    safe_read.remove_tree(scratch)
    assert not scratch.exists()
    assert (outside / "keep" / "deep" / "file").read_text() == "kept"
    assert secret.read_text().startswith("TOKEN=")
    # A link in place of the directory itself: the link goes, never its target.
    (tmp_path / "area").symlink_to(outside)
    safe_read.remove_tree(tmp_path / "area")
    assert not os.path.lexists(tmp_path / "area")
    assert secret.exists()


def test_compile_caches_behind_a_link_or_with_a_hard_link_are_not_kept(
    tmp_path: Path, secret: Path
) -> None:
    """The caches are moved out of the scratch after the run: a `.triton` link to a user's
    directory would move that directory; a hard link would keep a file of the user's."""
    users = secret.parent / "users-dir"
    (users / "cache").mkdir(parents=True)
    (users / "cache" / "precious").write_text("mine")
    caches = CompileCaches(tmp_path / "store")
    (tmp_path / "store").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".triton").symlink_to(users)
    assert caches.keep("code", home) == 0
    assert (users / "cache" / "precious").read_text() == "mine"
    (home / ".triton").unlink()
    (home / ".triton" / "cache").mkdir(parents=True)
    os.link(secret, home / ".triton" / "cache" / "kernel.cubin")
    assert caches.keep("code", home) == 0
    assert caches.kept == {}


# ------------------------------------------------------------- through the real evaluator

ISOLATION = Isolation.probe()
FAST = {
    "timing": {
        "warmup_ms": 1.0,
        "max_time_s": 0.02,
        "min_samples": 5,
        "max_samples": 10,
        "flush_l2": False,
    },
    "cpu_threads": 1,
}


def _attacks(secret: Path) -> dict[str, str]:
    def link(names: list[str], kind: str, target: str = "", exit_: bool = False) -> str:
        return attack("link_files", NAMES=repr(names), KIND=kind, TARGET=target, EXIT=exit_)

    return {
        "logs_to_environ": link(["stdout.log", "stderr.log"], "symlink", "/proc/self/environ"),
        "logs_to_secret": link(["stdout.log", "stderr.log"], "symlink", str(secret)),
        "progress_to_env": link(["progress.log"], "symlink", "/proc/self/cwd/.env"),
        "progress_fifo": link(["progress.log"], "fifo"),
        "result_to_secret": link(["result.json"], "symlink", str(secret), exit_=True),
        "result_to_environ": link(["result.json"], "symlink", "/proc/self/environ", exit_=True),
        "result_fifo": link(["result.json"], "fifo", exit_=True),
        "result_dev_zero": link(["result.json"], "symlink", "/dev/zero", exit_=True),
        "result_hardlink_task": link(["result.json"], "hardlink", "task.json", exit_=True),
        "result_hardlink_outside": link(["result.json"], "hardlink", str(secret), exit_=True),
    }


def _evaluate(root: Path, standby: int) -> dict[str, Evaluation]:
    secret = root / "outside" / "secret.env"
    secret.parent.mkdir(parents=True)
    secret.write_text(f"TOKEN={CANARY}\nstart 1.0\n")
    repo = root / "repo"
    repo.mkdir()
    (repo / ".env").write_text(f"{CANARY} 1.0\n")  # the first word would be a "phase"
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    task = KernelBenchTask(reference, name="softmax_linear", device="cpu", **FAST)
    limits = SandboxLimits(
        build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024, standby=standby
    )
    attacks = _attacks(secret)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)  # the session runs in the project: /proc/self/cwd/.env is its .env
        evaluator = SandboxEvaluator(task, limits)
        try:
            if standby:
                evaluator.standbys.fill()
                evaluations = [evaluator.evaluate(Candidate(c)) for c in attacks.values()]
            else:
                candidates = [Candidate(c) for c in attacks.values()]
                evaluations = evaluator.evaluate_many(candidates, jobs=2)
        finally:
            evaluator.close()
    return dict(zip(attacks, evaluations, strict=True))


@pytest.fixture(scope="module", params=[0, 1], ids=["fresh-processes", "standby-pool"])
def linked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return _evaluate(tmp_path_factory.mktemp("links"), request.param)


def _no_canary(ev: Evaluation) -> None:
    text = json.dumps(ev.to_dict(), default=str)
    for form in canary_forms():
        assert form not in text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["logs_to_environ", "logs_to_secret"])
def test_logs_replaced_by_links_are_read_as_the_files_the_session_made(linked, name) -> None:
    ev = linked[name]
    _no_canary(ev)
    assert ev.status == "correct", ev.reason
    for line in ("before-link", "before-link-err", "after-link"):
        assert line in ev.logs
    if ISOLATION.isolated:
        assert "planted symlink at stdout.log" in ev.logs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["progress_to_env", "progress_fifo"])
def test_a_progress_file_replaced_by_a_link_or_fifo_is_not_read(linked, name) -> None:
    ev = linked[name]
    _no_canary(ev)
    # The worker writes its phases through its own descriptor (now a removed file): the
    # session no longer sees them, and says nothing it read from the link.
    assert CANARY not in json.dumps(ev.metrics.get("phases") or {})
    assert ev.status in ("correct", "cheat", "run_error"), ev.reason


RESULT_REASONS = {
    "result_to_secret": "is a symbolic link: not read",
    "result_to_environ": "is a symbolic link: not read",
    "result_dev_zero": "is a symbolic link: not read",
    "result_fifo": "is a FIFO: not read",
    "result_hardlink_task": "has 2 hard links (a link to another file): not read",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RESULT_REASONS))
def test_a_result_replaced_by_a_link_fifo_or_hard_link_is_refused_with_the_reason(
    linked, name
) -> None:
    ev = linked[name]
    _no_canary(ev)
    assert ev.status == "run_error", ev.reason
    assert (ev.reason or "").startswith("unreadable worker result: "), ev.reason
    assert RESULT_REASONS[name] in (ev.reason or ""), ev.reason


@pytest.mark.slow
def test_a_hard_link_to_a_file_outside_the_scratch_cannot_be_made(linked) -> None:
    ev = linked["result_hardlink_outside"]
    _no_canary(ev)
    if not ISOLATION.isolated:
        pytest.skip(f"no Linux namespaces here: {ISOLATION.why}")
    # Outside the view (the file does not exist there) or on another mount (EXDEV).
    assert "blocked hardlink at result.json" in ev.logs
    assert ev.status == "build_error", ev.reason  # it left at import, without a result
    assert (ev.reason or "").startswith("worker died (exit code 0) without a result")
