"""Hostile candidates against the sandbox (tests/data/search/attacks/): each attack is blocked,
and the evaluation says why. Workers import torch (seconds each): one module-scoped run.

The isolation tests need Linux namespaces (`isolation.Isolation.probe()`); where the machine
has none they are skipped with the probe's reason, and the fallback is tested for what it
promises (a scrubbed environment), not for what it cannot do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.search import isolation
from pytest_kernelpro.search.base import Candidate, Evaluation
from pytest_kernelpro.search.evaluator import KernelBenchTask, SandboxEvaluator, SandboxLimits
from pytest_kernelpro.search.isolation import CUDA_LADDER, RELAXATIONS, Isolation
from pytest_kernelpro.search.worker import RETIME_MAX_SAMPLES

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "search"
CANARY = "kp-canary-7f3a9c1e5b2d4a60"
FAST_TIMING = {
    "timing": {
        "warmup_ms": 1.0,
        "max_time_s": 0.02,
        "min_samples": 5,
        "max_samples": 10,
        "flush_l2": False,
    },
    "cpu_threads": 1,
}
LIMITS = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)
ISOLATION = Isolation.probe()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)


def attack(name: str, **fill: object) -> str:
    text = (DATA / "attacks" / f"{name}.py").read_text(encoding="utf-8")
    for key, value in fill.items():
        text = text.replace(f"@@{key}@@", str(value))
    assert "@@" not in text, f"unfilled placeholder in {name}.py"
    return text


def task(**options: object) -> KernelBenchTask:
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    return KernelBenchTask(
        reference, name="softmax_linear", device="cpu", **{**FAST_TIMING, **options}
    )


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


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("attacks")
    repo = root / "repo"
    repo.mkdir()
    (repo / "kernels.py").write_text("ORIGINAL\n")
    (repo / "kernelpro-baseline.yaml").write_text("kernels: {}\n")
    listener = Listener()
    names = {
        "steal_environ": attack("steal_environ"),
        "connect_out": attack("connect_out", HOST=socket.gethostname(), PORT=listener.port),
        "write_repo": attack(
            "write_repo",
            TARGET=repo / "kernels.py",
            BASELINE=repo / "kernelpro-baseline.yaml",
        ),
        "setsid_escape": attack(
            "setsid_escape", MARKER=root / "alive.txt", PIDFILE=root / "pid.txt"
        ),
        "forge_result": attack("forge_result"),
        "forge_file": attack("forge_file"),
        "blame_user": attack("blame_user"),
        "mutates_inputs": attack("mutates_inputs"),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELPRO_CANARY_TOKEN", CANARY)
        mp.setenv("GITHUB_TOKEN", CANARY)
        evaluator = SandboxEvaluator(task(), LIMITS)
        evaluations = evaluator.evaluate_many([Candidate(code) for code in names.values()], jobs=2)
    time.sleep(1.0)  # a surviving grandchild would write its marker within 0.1 s
    listener.close()
    return {
        "root": root,
        "repo": repo,
        "listener": listener,
        "evaluator": evaluator,
        **dict(zip(names, evaluations, strict=True)),
    }


def _everything(ev: Evaluation) -> str:
    return json.dumps(ev.to_dict(), default=str)


def test_the_parent_environment_is_out_of_reach(world: dict[str, object]) -> None:
    ev = world["steal_environ"]
    assert isinstance(ev, Evaluation)
    assert ev.status == "run_error"  # its forward raises with whatever it stole
    assert CANARY not in _everything(ev)
    if ISOLATION.isolated:
        assert "pids visible: [1]" in ev.logs  # a PID namespace: the parent is not there


@needs_namespaces
def test_no_socket_reaches_a_loopback_server(world: dict[str, object]) -> None:
    ev = world["connect_out"]
    listener = world["listener"]
    assert isinstance(ev, Evaluation)
    assert isinstance(listener, Listener)
    assert listener.received == []
    assert "ESCAPED" not in ev.logs
    assert "blocked connect to 127.0.0.1: [Errno 101] Network is unreachable" in ev.logs
    assert ev.status == "correct", ev.reason  # the kernel itself still runs and is timed


@needs_namespaces
def test_the_repository_is_read_only(world: dict[str, object]) -> None:
    ev = world["write_repo"]
    repo = world["repo"]
    assert isinstance(ev, Evaluation)
    assert isinstance(repo, Path)
    assert (repo / "kernels.py").read_text() == "ORIGINAL\n"
    assert (repo / "kernelpro-baseline.yaml").read_text() == "kernels: {}\n"
    assert "ESCAPED" not in ev.logs
    assert "blocked write to" in ev.logs
    assert "Read-only file system" in ev.logs
    assert "wrote scratch-file.txt" in ev.logs  # the scratch directory stays writable
    assert ev.status == "correct", ev.reason


@needs_namespaces
def test_a_setsid_grandchild_dies_with_the_worker(world: dict[str, object]) -> None:
    ev = world["setsid_escape"]
    root = world["root"]
    assert isinstance(ev, Evaluation)
    assert isinstance(root, Path)
    assert "started pid" in ev.logs
    # Its marker file is outside the scratch directory (read-only), and the process is gone:
    # the PID namespace died with the worker.
    assert not (root / "alive.txt").exists()
    assert not (root / "pid.txt").exists()
    assert ev.status == "build_error"  # its module raised when it could not write the file
    assert "Read-only file system" in (ev.reason or "")


def test_a_patched_pipeline_cannot_forge_a_result(world: dict[str, object]) -> None:
    ev = world["forge_result"]
    assert isinstance(ev, Evaluation)
    assert ev.status == "cheat"
    assert ev.speedup is None
    assert ev.reason is not None
    assert ev.reason.startswith(
        "result not confirmed: the worker reported a correct result, but the outputs it "
        "handed over differ from the reference computed in a trusted process (trial-1: "
        "FileNotFoundError: no output file trial-1.pt)"
    )


def test_a_result_file_written_by_the_candidate_is_not_believed(
    world: dict[str, object],
) -> None:
    ev = world["forge_file"]
    assert isinstance(ev, Evaluation)
    assert ev.status == "cheat"
    assert "no output file trial-1.pt" in (ev.reason or "")


def test_a_candidate_cannot_blame_the_users_problem_file(world: dict[str, object]) -> None:
    ev = world["blame_user"]
    assert isinstance(ev, Evaluation)
    # No KernelproError ended the search: the reference ran fine in a trusted process.
    assert ev.status == "run_error"
    assert (ev.reason or "").startswith(
        "the worker reported that the reference failed, but the reference runs in a trusted "
        "process: counted as this candidate's failure"
    )


def test_a_kernel_that_writes_into_its_inputs_fails(world: dict[str, object]) -> None:
    ev = world["mutates_inputs"]
    assert isinstance(ev, Evaluation)
    assert ev.status == "cheat"
    assert "modifies its inputs in place (trial 1/3)" in (ev.reason or "")


def test_the_evaluation_says_how_it_was_isolated(world: dict[str, object]) -> None:
    ev = world["connect_out"]
    assert isinstance(ev, Evaluation)
    assert ev.metrics["sandbox"] == ISOLATION.describe()


def test_a_patched_clock_is_caught_when_the_winner_is_confirmed() -> None:
    evaluator = SandboxEvaluator(task(), LIMITS)
    forged = Candidate(attack("slow_timed"))
    ev = evaluator.evaluate(forged)
    assert ev.status == "correct", ev.reason  # its outputs are right; only its time is forged
    confirmed = evaluator.confirm(forged, ev)
    assert confirmed.status == "cheat"
    assert (confirmed.reason or "").startswith("timing not confirmed: re-timed in a fresh process")
    assert "the search's number was not real" in (confirmed.reason or "")


def test_an_honest_winner_is_confirmed() -> None:
    limits = SandboxLimits(
        build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024, confirm_tolerance=50.0
    )
    evaluator = SandboxEvaluator(task(), limits)
    honest = Candidate((DATA / "cpu" / "correct.py").read_text(encoding="utf-8"))
    ev = evaluator.evaluate(honest)
    assert ev.status == "correct", ev.reason
    assert ev.correctness["verified_by"].startswith("judge: outputs of trial-1, trial-2, trial-3")
    confirmed = evaluator.confirm(honest, ev)
    assert confirmed.status == "correct", confirmed.reason
    record = confirmed.timing["confirmed"]
    assert record["median_s"] > 0
    # Bounded by what the decision needs: the task's min_samples at least, the cap at most,
    # and no reference time (the judge only checks the re-timed output).
    assert 5 <= record["samples"] <= RETIME_MAX_SAMPLES
    assert "speedup" not in record
    assert "reference_median_s" not in record
    assert record["method"] == "perf_counter_ns bound before the candidate ran"
    assert record["claimed_median_s"] == ev.timing["candidate"]["median_s"]
    assert record["ratio"] == pytest.approx(record["median_s"] / record["claimed_median_s"])
    assert record["tolerance"] == 50.0
    assert record["ncu_gpu_time_s"] is None  # not profiled on the CPU


def test_a_time_below_ncus_kernel_duration_is_disqualified_at_confirmation() -> None:
    """The cross-check with the profile: the same honest candidate, with a profile saying
    its kernels take a second of GPU time per call (as ncu would for a forged 1000x time)."""
    limits = dataclasses.replace(LIMITS, confirm_tolerance=50.0)
    evaluator = SandboxEvaluator(task(), limits)
    honest = Candidate((DATA / "cpu" / "correct.py").read_text(encoding="utf-8"))
    ev = evaluator.evaluate(honest)
    assert ev.status == "correct", ev.reason
    ev.metrics["profile"] = {"ncu_gpu_time_s": 1.0}
    confirmed = evaluator.confirm(honest, ev)
    assert confirmed.status == "cheat"
    assert (confirmed.reason or "").startswith(
        "timing not confirmed: ncu measured the candidate's kernels at 1e+06 µs of GPU time"
    )
    assert confirmed.timing["confirmation"]["ncu_gpu_time_s"] == 1.0


def test_namespaces_mode_refuses_the_fallback() -> None:
    if ISOLATION.isolated:
        assert Isolation.probe("namespaces") == ISOLATION
    else:
        with pytest.raises(KernelproError, match="needs Linux namespaces"):
            Isolation.probe("namespaces")
    with pytest.raises(KernelproError, match="Invalid sandbox isolation mode 'none'"):
        Isolation.probe("none")


def test_the_environment_of_this_test_is_restored() -> None:
    assert os.environ.get("KERNELPRO_CANARY_TOKEN") is None


RUNG_CHECK = (
    "import os, stat\n"
    "print('repo', os.access({repo!r}, os.W_OK))\n"
    "print('sysctl', os.access('/proc/sys/kernel/core_pattern', os.W_OK))\n"
    "print('blockdev', any(stat.S_ISBLK(os.stat('/dev/' + n).st_mode) for n in os.listdir('/dev')))\n"
    "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
)


@needs_namespaces
@pytest.mark.parametrize("relax", CUDA_LADDER, ids=lambda r: "+".join(r) or "full")
def test_every_cuda_relaxation_keeps_the_core_promises(
    relax: tuple[str, ...], tmp_path: Path
) -> None:
    # Run here on the CPU: the relaxed setups must still start, and still keep the
    # repository read-only, sysctls read-only, block devices out and other processes hidden.
    repo_file = Path(__file__).resolve()
    iso = dataclasses.replace(ISOLATION, relax=relax)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code = RUNG_CHECK.format(repo=str(repo_file))
    out = subprocess.run(
        iso.wrap([sys.executable, "-c", code], scratch=scratch),
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["repo False", "sysctl False", "blockdev False", "pids [1]"]
    for name in relax:
        assert RELAXATIONS[name] in iso.describe()


@needs_namespaces
def test_without_a_gpu_the_cuda_probe_falls_back_and_says_why() -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("this machine has a CUDA GPU")
    found = isolation._probe_cuda(ISOLATION, None)
    assert found.level == "fallback"
    assert found.why.startswith("CUDA does not initialise inside the namespaces (tried full: ")
    assert "host_dev+writable_proc: " in found.why
