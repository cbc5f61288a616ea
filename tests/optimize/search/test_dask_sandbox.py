"""The sandbox's guarantees on Dask workers: the hostile candidates of
tests/data/search/attacks/ evaluated on a local cluster of two CPU worker processes
(`DaskEvaluator`) are blocked as they are in this process (the same attacks and checks as
test_sandbox_attacks.py: sandbox_attack_cases.py), and a candidate's sandbox dies with the
Dask worker killed under it.

Nothing here measures time against a threshold: a surviving sandbox is detected by the file
it writes after its sleep, checked once its retry (which slept as long, later) has finished.
Workers import torch (seconds each), so the module evaluates everything in one go."""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from sandbox_attack_cases import CHECKS, DATA, Listener, Outcome, programs  # noqa: E402

from pytest_kernelpro.optimize.dask.cluster import DaskCluster  # noqa: E402
from pytest_kernelpro.optimize.dask.dask_evaluator import DaskEvaluator, _digest  # noqa: E402
from pytest_kernelpro.optimize.sandbox.environment import scrub_environment  # noqa: E402
from pytest_kernelpro.optimize.sandbox.evaluator import KernelBenchTask, SandboxLimits  # noqa: E402
from pytest_kernelpro.optimize.sandbox.isolation import Isolation  # noqa: E402
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation  # noqa: E402

pytestmark = pytest.mark.slow

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


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANTHROPIC_API_KEY", SESSION_KEY)  # this session's secret
        with DaskCluster.start("local:2") as started:
            yield started


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("dask-attacks")
    listener = Listener()
    names = programs(root, listener)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GITHUB_TOKEN", CANARY)
        task = dataclasses.replace(  # kernels.py shown read-only (the project view's entry)
            TASK, sys_path=(str(root / "repo"),), view_entries=(str(root / "repo" / "kernels.py"),)
        )
        evaluator = DaskEvaluator(cluster, task, LIMITS)
        evaluator.connect(local_isolation=ISOLATION.describe())
        with ThreadPoolExecutor(max_workers=2) as pool:  # both workers busy
            evaluations = list(pool.map(evaluator.evaluate, map(Candidate, names.values())))
    time.sleep(1.0)  # a surviving grandchild would write its marker within 0.1 s
    listener.close()
    return {
        name: Outcome(ev, root, listener, ISOLATION, secrets=(CANARY, SESSION_KEY))
        for name, ev in zip(names, evaluations, strict=True)
    }


def test_every_attack_ran_on_a_dask_worker_in_this_machines_sandbox(cluster, world) -> None:
    assert sorted(world) == sorted(CHECKS)
    workers = set(cluster.workers())
    for out in world.values():
        ev = out.evaluation
        assert ev.metrics["dask"]["worker"] in workers
        assert ev.metrics["dask"]["pid"] != os.getpid()
        assert ev.metrics["sandbox"] == ISOLATION.describe()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_attack_is_blocked_on_a_worker_as_in_process(world, name: str) -> None:
    """The checks of test_sandbox_attacks.py, on the Dask workers' evaluations; the session's
    secrets include a key set before the cluster started (none reaches a worker either)."""
    CHECKS[name](world[name])


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
    # An evaluation's scratch directory: <evaluations' root>/<its area>/scratch (sandbox/pool.py).
    pattern = f"kernelpro-evals-*/kernelpro-eval-*/scratch/sleeping-{tag}"
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
