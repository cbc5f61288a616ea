"""The sandbox's guarantees on Dask workers: the hostile candidates of
tests/data/search/attacks/ evaluated on a local cluster of two CPU worker processes
(`DaskEvaluator`) are blocked as they are in this process (test_sandbox_attacks.py), and a
candidate's sandbox dies with the Dask worker killed under it.

Nothing here measures time against a threshold: a surviving sandbox is detected by the file
it writes after its sleep, checked once its retry (which slept as long, later) has finished.
Workers import torch (seconds each), so the module evaluates everything in one go."""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from pytest_kernelpro.search.base import Candidate, Evaluation  # noqa: E402
from pytest_kernelpro.search.cluster import DaskCluster  # noqa: E402
from pytest_kernelpro.search.distributed import DaskEvaluator, _digest  # noqa: E402
from pytest_kernelpro.search.environment import scrub_environment  # noqa: E402
from pytest_kernelpro.search.evaluator import KernelBenchTask, SandboxLimits  # noqa: E402
from pytest_kernelpro.search.isolation import Isolation  # noqa: E402

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "search"
WAIT_S = 300.0
CANARY = "kp-canary-dask-3e1f7a9c2b"
SESSION_KEY = "sk-kernelpro-dask-test-0000"
LIMITS = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)
ISOLATION = Isolation.probe("auto", cuda=False, env=scrub_environment(os.environ))
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)
TASK = KernelBenchTask(
    (DATA / "cpu" / "reference.py").read_text(encoding="utf-8"),
    name="softmax_linear",
    device="cpu",
    timing={
        "warmup_ms": 1.0,
        "max_time_s": 0.02,
        "min_samples": 5,
        "max_samples": 10,
        "flush_l2": False,
    },
    cpu_threads=1,
)


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


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANTHROPIC_API_KEY", SESSION_KEY)  # this session's secret
        with DaskCluster.start("local:2") as started:
            yield started


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("dask-attacks")
    repo = root / "repo"
    repo.mkdir()
    (repo / "kernels.py").write_text("ORIGINAL\n")
    (repo / "kernelpro-baseline.yaml").write_text("kernels: {}\n")
    listener = Listener()
    names = {
        "steal_environ": attack("steal_environ"),
        "connect_out": attack("connect_out", HOST=socket.gethostname(), PORT=listener.port),
        "write_repo": attack(
            "write_repo", TARGET=repo / "kernels.py", BASELINE=repo / "kernelpro-baseline.yaml"
        ),
        "setsid_escape": attack(
            "setsid_escape", MARKER=root / "alive.txt", PIDFILE=root / "pid.txt"
        ),
        "forge_result": attack("forge_result"),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GITHUB_TOKEN", CANARY)
        evaluator = DaskEvaluator(cluster, TASK, LIMITS)
        evaluator.connect(local_isolation=ISOLATION.describe())
        with ThreadPoolExecutor(max_workers=2) as pool:  # both workers busy
            evaluations = list(pool.map(evaluator.evaluate, map(Candidate, names.values())))
    time.sleep(1.0)  # a surviving grandchild would write its marker within 0.1 s
    listener.close()
    return {
        "root": root,
        "repo": repo,
        "listener": listener,
        **dict(zip(names, evaluations, strict=True)),
    }


def _everything(ev: Evaluation) -> str:
    return json.dumps(ev.to_dict(), default=str)


def test_every_attack_ran_on_a_dask_worker_in_this_machines_sandbox(cluster, world) -> None:
    evaluations = [v for v in world.values() if isinstance(v, Evaluation)]
    assert len(evaluations) == 5
    workers = set(cluster.workers())
    for ev in evaluations:
        assert ev.metrics["dask"]["worker"] in workers
        assert ev.metrics["dask"]["pid"] != os.getpid()
        assert ev.metrics["sandbox"] == ISOLATION.describe()


def test_no_secret_of_this_session_reaches_a_candidate_on_a_worker(world) -> None:
    ev = world["steal_environ"]
    assert isinstance(ev, Evaluation)
    assert ev.status == "run_error"  # its forward raises with whatever it stole
    assert CANARY not in _everything(ev)
    assert SESSION_KEY not in _everything(ev)
    if ISOLATION.isolated:
        assert "pids visible: [1]" in ev.logs  # a PID namespace: the worker is not there


@needs_namespaces
def test_no_socket_reaches_a_loopback_server_from_a_worker(world) -> None:
    ev = world["connect_out"]
    listener = world["listener"]
    assert isinstance(ev, Evaluation)
    assert isinstance(listener, Listener)
    assert listener.received == []
    assert "ESCAPED" not in ev.logs
    assert "blocked connect to 127.0.0.1: [Errno 101] Network is unreachable" in ev.logs
    assert ev.status == "correct", ev.reason  # the kernel itself still runs and is timed


@needs_namespaces
def test_the_repository_is_read_only_on_a_worker(world) -> None:
    ev = world["write_repo"]
    repo = world["repo"]
    assert isinstance(ev, Evaluation)
    assert isinstance(repo, Path)
    assert (repo / "kernels.py").read_text() == "ORIGINAL\n"
    assert (repo / "kernelpro-baseline.yaml").read_text() == "kernels: {}\n"
    assert "ESCAPED" not in ev.logs
    assert "Read-only file system" in ev.logs
    assert "wrote scratch-file.txt" in ev.logs
    assert ev.status == "correct", ev.reason


@needs_namespaces
def test_a_setsid_grandchild_dies_with_its_sandbox_on_a_worker(world) -> None:
    ev = world["setsid_escape"]
    root = world["root"]
    assert isinstance(ev, Evaluation)
    assert isinstance(root, Path)
    assert "started pid" in ev.logs
    assert not (root / "alive.txt").exists()
    assert not (root / "pid.txt").exists()
    assert ev.status == "build_error"


def test_a_forged_result_is_not_believed_on_a_worker(world) -> None:
    ev = world["forge_result"]
    assert isinstance(ev, Evaluation)
    assert ev.status == "cheat"
    assert ev.speedup is None


SLEEPER = """
import time

import torch
import torch.nn as nn

open("sleeping-@@TAG@@", "w").write("asleep")
time.sleep(@@SLEEP@@)
open("survived-@@TAG@@", "w").write("this sandbox outlived the Dask worker that watched it")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
"""


@needs_namespaces
def test_a_candidates_sandbox_dies_with_the_dask_worker_killed_under_it(cluster) -> None:
    """The worker is killed while its candidate sleeps in the sandbox; the scheduler runs
    the candidate again (it sleeps as long, later). Once that retry is back, a sandbox that
    had outlived its worker would have woken and written its file in the scratch directory
    the killed worker left behind."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    code = SLEEPER.replace("@@TAG@@", tag).replace("@@SLEEP@@", "4")
    evaluator = DaskEvaluator(cluster, TASK, LIMITS)
    evaluator.connect(local_isolation=ISOLATION.describe())
    results: list[Evaluation] = []
    thread = threading.Thread(target=lambda: results.append(evaluator.evaluate(Candidate(code))))
    thread.start()
    pattern = f"kernelpro-eval-*/sleeping-{tag}"
    deadline = time.monotonic() + WAIT_S
    asleep: list[Path] = []
    while not asleep and time.monotonic() < deadline:
        asleep = sorted(Path(tempfile.gettempdir()).glob(pattern))
        time.sleep(0.05)
    assert len(asleep) == 1, "the candidate never started its sleep"
    scratch = asleep[0].parent
    prefix = f"kernelpro-eval-{_digest(code)}-"
    running = [
        address
        for address, keys in cluster.client.processing().items()
        if any(str(k).startswith(prefix) for k in keys)
    ]
    assert len(running) == 1
    pid = cluster.worker_pids()[running[0]]
    os.kill(pid, signal.SIGKILL)  # a worker process this test's cluster started
    thread.join(WAIT_S)
    try:
        (evaluation,) = results
        assert evaluation.status == "correct", evaluation.reason
        assert evaluation.metrics["dask"]["worker_losses"] == 1
        assert (scratch / f"sleeping-{tag}").exists()  # the killed worker's scratch, left
        assert not (scratch / f"survived-{tag}").exists()
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    cluster.client.wait_for_workers(2, timeout=WAIT_S)
