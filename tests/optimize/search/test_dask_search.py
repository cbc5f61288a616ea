"""A search on a local Dask cluster of two CPU worker processes (optimize/dask/cluster.py,
optimize/dask/dask_evaluator.py): the workers' environment, a worker killed mid-search.

Nothing here measures time against a threshold: the overlap and the kills are decided from
the scheduler's state and the stamps the workers record. Each evaluation starts sandboxed
processes that import torch, so the tests wait generously (a loaded 2-core machine)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from pytest_kernelpro.errors import KernelproError, KernelproWarning  # noqa: E402
from pytest_kernelpro.optimize.build.cache import BuildCache  # noqa: E402
from pytest_kernelpro.optimize.dask.cluster import (  # noqa: E402
    DaskCluster,
    WorkerInfo,  # noqa: E402
    parse_dask,
)
from pytest_kernelpro.optimize.dask.dask_evaluator import DaskEvaluator, _digest  # noqa: E402
from pytest_kernelpro.optimize.dask.shipping import install_entries  # noqa: E402
from pytest_kernelpro.optimize.sandbox.environment import scrub_environment  # noqa: E402
from pytest_kernelpro.optimize.sandbox.evaluator import KernelBenchTask, SandboxLimits  # noqa: E402
from pytest_kernelpro.optimize.sandbox.isolation import Isolation  # noqa: E402
from pytest_kernelpro.optimize.search.interfaces import Candidate  # noqa: E402
from pytest_kernelpro.optimize.search.mcts import MCTS  # noqa: E402
from pytest_kernelpro.optimize.search.trajectory import load_trajectory  # noqa: E402

pytestmark = pytest.mark.slow

WAIT_S = 300.0
FAKE_KEY = "sk-kernelpro-test-0000"

REFERENCE = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(256)]


def get_init_inputs():
    return []
"""
TASK = KernelBenchTask(
    REFERENCE,
    name="double",
    device="cpu",
    timing={"warmup_ms": 1.0, "max_time_s": 0.02, "min_samples": 5, "max_samples": 10},
    cpu_threads=1,
)
LIMITS = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)


def candidate(body: str, *, sleep_s: float = 0.0) -> str:
    # The pause keeps the candidate's evaluation running while a worker is killed under it.
    pause = f"import time\ntime.sleep({sleep_s})\n" if sleep_s else ""
    return (
        f"import torch\nfrom torch import nn\n{pause}\n\nclass ModelNew(nn.Module):\n"
        f"    def forward(self, x):\n        return {body}\n"
    )


class ListGenerator:
    def __init__(self, codes: list[str]) -> None:
        self.codes = list(codes)

    def generate(self, mode, parent, evaluation, *, max_candidates=1):
        taken, self.codes = self.codes[:max_candidates], self.codes[max_candidates:]
        return [Candidate(code=c) for c in taken]


@pytest.fixture(scope="module")
def started_cluster():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        with DaskCluster.start("local:2") as started:
            yield started


@pytest.fixture
def cluster(started_cluster):
    # The cluster is shared by the module's tests and one of them kills workers, which their
    # nannies restart; on a loaded machine a restart can still be under way when the next test
    # starts, so each test begins once both workers are registered again (no count of a
    # half-restarted cluster decides a test).
    started_cluster.client.wait_for_workers(2, timeout=WAIT_S)
    return started_cluster


def test_the_option_names_its_forms() -> None:
    assert parse_dask("LOCAL") == "local"
    assert parse_dask("local:3") == "local:3"
    assert parse_dask("tcp://10.0.0.5:8786") == "tcp://10.0.0.5:8786"
    with pytest.raises(Exception, match=r"local:N.*scheduler address"):
        parse_dask("everywhere")


def test_workers_start_without_secrets_and_sandbox_like_this_machine(cluster) -> None:
    workers = cluster.probe()
    assert len(workers) == 2
    assert {w.pid for w in workers}.isdisjoint({os.getpid()})
    # This session holds a secret that no worker process has: they started with the
    # sandbox's scrubbed environment.
    assert os.environ.get("ANTHROPIC_API_KEY") == FAKE_KEY
    assert all(w.secrets == () for w in workers)
    here = Isolation.probe("auto", cuda=False, env=scrub_environment(os.environ)).describe()
    assert {w.isolation for w in workers} == {here}
    assert all(w.gpus == "" for w in workers)  # CPU workers see no GPU
    assert cluster.evaluation_slots("cpu") == 2


def test_a_worker_killed_mid_search_costs_only_its_candidate(cluster, tmp_path: Path) -> None:
    retried = candidate("x + x", sleep_s=6)  # its worker is killed once: run again, correct
    lost = candidate("x * 2.0", sleep_s=6)  # killed twice: counted as failed
    others = [candidate("2 * x"), candidate("x +")]
    evaluator = DaskEvaluator(cluster, TASK, LIMITS)
    evaluator.connect()
    killed: list[int] = []
    problems: list[str] = []

    def kill_while_running(code: str) -> None:
        """Kill the worker running `code`'s evaluation, once it runs there alone."""
        prefix = f"kernelpro-eval-{_digest(code)}-"
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for address, keys in cluster.client.processing().items():
                keys = [str(k) for k in keys]
                if len(keys) == 1 and keys[0].startswith(prefix):
                    pid = cluster.worker_pids().get(address)
                    if pid is None or pid in killed:
                        continue
                    os.kill(pid, signal.SIGKILL)  # a worker process this test's cluster started
                    killed.append(pid)
                    while address in cluster.workers() and time.monotonic() < deadline:
                        time.sleep(0.1)  # until the scheduler has noticed
                    return
            time.sleep(0.05)
        problems.append(f"{code!r} was never seen running alone on a worker")

    def killer() -> None:
        try:
            kill_while_running(retried)
            kill_while_running(lost)
            kill_while_running(lost)
        except Exception as exc:  # reported by the test below
            problems.append(repr(exc))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    path = tmp_path / "trajectory.jsonl"
    result = MCTS().run(
        ListGenerator([retried, lost, *others]),
        evaluator,
        "4",
        trajectory=path,
        in_flight=evaluator.slots(),
    )
    thread.join(WAIT_S)
    assert problems == []
    assert len(killed) == 3

    # The search ran to its budget; every candidate has its node, in the trajectory too.
    assert result.stop_reason == "evaluation budget spent (4/4)"
    by_code = {n.candidate.code: n.evaluation for n in result.nodes}
    assert set(by_code) == {retried, lost, *others}
    assert len(load_trajectory(path).nodes) == 4
    # Lost once: evaluated again elsewhere, and its result counts.
    assert by_code[retried].status == "correct"
    assert by_code[retried].metrics["dask"]["worker_losses"] == 1
    # Lost twice: that candidate failed, nothing else did.
    assert by_code[lost].status == "run_error"
    assert "worker evaluating this candidate was lost" in by_code[lost].reason
    assert by_code[others[0]].status == "correct"
    assert by_code[others[1]].status == "build_error"
    # The killed workers came back (each worker's nanny restarts it) with new processes.
    cluster.client.wait_for_workers(2, timeout=WAIT_S)
    assert set(cluster.worker_pids().values()).isdisjoint(killed)


def test_an_existing_scheduler_is_joined_by_its_address(cluster) -> None:
    with DaskCluster.start(cluster.address) as joined:
        assert not joined.local
        assert len(joined.probe()) == 2
    # Leaving a cluster it joined stops nothing there: its two workers are still served. A
    # count read at once saw none in one fresh-clone run (cause not found: a nanny's restart
    # under load reads the same), so the scheduler is given the time a restart takes; a
    # cluster that was stopped, or workers retired, never come back.
    cluster.client.wait_for_workers(2, timeout=WAIT_S)
    assert len(cluster.workers()) == 2


FAST_PATH = """
import torch
from torch import nn
from pytest_kernelpro.optimize.build import load_cuda

kernels = load_cuda(r\"\"\"
extern "C" __global__ void twice(const float* x, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i];
}
\"\"\", name="twice")


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        kernels.twice(x, out, x.numel(), grid=(x.numel() + 255) // 256, block=256)
        return out
"""


def test_a_build_runs_as_a_cpu_task_and_its_cache_entry_travels(cluster, tmp_path: Path) -> None:
    """nvcc compiles sm_90a on a machine without a GPU: the build task runs on a CPU worker,
    and the evaluating worker's cache gets the finished entry."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found: install the CUDA toolkit")
    import dataclasses

    limits = dataclasses.replace(LIMITS, build_cache_dir=str(tmp_path / "builder-cache"))
    cuda_task = dataclasses.replace(TASK, device="cuda")
    evaluator = DaskEvaluator(cluster, cuda_task, limits, arch="sm_90a")
    evaluator.prepare([Candidate(code=FAST_PATH), Candidate(code=candidate("x + x"))])
    assert list(evaluator._builds) == [FAST_PATH]  # a candidate without builds gets no task
    built = evaluator._builds[FAST_PATH].result(timeout=WAIT_S)
    assert built["worker"] in cluster.workers()
    assert built["pid"] != os.getpid()
    assert built["prebuild"]["errors"] == []
    (record,) = built["prebuild"]["builds"]
    elsewhere = tmp_path / "evaluator-cache"
    assert install_entries(elsewhere, built["entries"]) == 1
    assert BuildCache(elsewhere).lookup(record["key"]) is not None
    assert install_entries(elsewhere, built["entries"]) == 0  # already there: kept
    evaluator.cancel()


class FakeCluster:
    address = "tcp://fake:8786"
    local = False
    client = None

    def __init__(self, workers: list[WorkerInfo]) -> None:
        self.infos = workers

    def probe(self, **_: object) -> list[WorkerInfo]:
        return self.infos

    def evaluation_slots(self, device: str) -> int:
        return len(self.infos)


def _info(**fields: object) -> WorkerInfo:
    base = {"address": "tcp://w:1", "host": "w", "pid": 1, "gpus": "0"}
    return WorkerInfo(**{**base, **fields})  # type: ignore[arg-type]


def test_workers_with_a_weaker_sandbox_are_refused() -> None:
    weak = FakeCluster([_info(isolation="fallback: no user namespaces", isolated=False)])
    evaluator = DaskEvaluator(weak, TASK, LIMITS)  # type: ignore[arg-type]
    with pytest.raises(KernelproError, match=r"weaker on Dask worker\(s\) tcp://w:1"):
        evaluator.connect(local_isolation="namespaces (pid, net, mount read-only)")
    # Where this machine has only the fallback too, nothing is weaker.
    assert evaluator.connect(local_isolation="fallback: none here") == weak.infos


def test_workers_holding_secrets_are_named() -> None:
    holding = FakeCluster([_info(isolated=True, secrets=("GITHUB_TOKEN",))])
    evaluator = DaskEvaluator(holding, TASK, LIMITS)  # type: ignore[arg-type]
    with pytest.warns(KernelproWarning, match="tcp://w:1: GITHUB_TOKEN"):
        evaluator.connect()


def test_profiles_made_on_the_workers_come_back_to_the_search(cluster) -> None:
    """The profiling evaluator runs on the worker that evaluated the candidate (the GPU that
    timed it); its profile travels back inside the evaluation, and the search's process
    keeps each one's record for the report, with the worker and the sandbox that made it."""
    from functools import partial

    from pytest_kernelpro.analysis import RooflineFacts
    from pytest_kernelpro.optimize.candidate_profile.evaluator import (
        CandidateProfiler,
        ProfilingEvaluator,
    )

    facts = RooflineFacts(bound="memory", min_bytes=2048.0, flops=256.0, roofline_time_s=1e-6)
    profiler = CandidateProfiler(REFERENCE, facts, device="cpu", timeout_s=240)
    chain = partial(ProfilingEvaluator, profiler=profiler, feedback="tools")
    remote = DaskEvaluator(cluster, TASK, LIMITS, worker_chain=chain)
    remote.connect()
    collected = ProfilingEvaluator(remote, None, feedback="tools")
    good = collected.evaluate(Candidate(code=candidate("x + x"), strategy="sum"))
    wrong = collected.evaluate(Candidate(code=candidate("x * 3"), strategy="wrong"))
    assert good.status == "correct"
    assert wrong.status == "wrong"
    profile = good.metrics["profile"]
    assert profile["stage1"]["theoretical"] == "memory"
    here = Isolation.probe("auto", cuda=False, env=scrub_environment(os.environ)).describe()
    assert profile["isolation"] == here
    (record,) = collected.records  # the wrong candidate was not profiled
    assert record.strategy == "sum"
    assert record.ok
    assert record.isolation == here
    assert record.worker == good.metrics["dask"]["worker"]
    assert record.worker in cluster.workers()
    assert record.profile_s == profile["profile_s"] > 0


THREADS_PROBE = """
import os
import sys

import torch
from torch import nn

print("threads:", os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"),
      file=sys.stderr)


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x
"""


def test_a_candidate_on_a_worker_gets_this_sessions_thread_settings(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dask's nanny starts each worker with OMP_NUM_THREADS=1 (and MKL_NUM_THREADS=1); a
    candidate there gets this session's values instead, as it would in this process."""
    on_workers = cluster.client.run(lambda: os.environ.get("OMP_NUM_THREADS"))
    assert set(on_workers.values()) == {"1"}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    evaluator = DaskEvaluator(cluster, TASK, LIMITS)
    evaluator.connect()
    evaluation = evaluator.evaluate(Candidate(code=THREADS_PROBE))
    assert evaluation.status == "correct", evaluation.reason
    assert "threads: 3 None" in evaluation.logs
    # Where the worker's time went came back too: its phases add up to its wall time.
    phases = evaluation.metrics["phases"]
    assert {"launch", "start", "import", "build", "timing", "done"} <= set(phases)
    assert sum(phases.values()) == pytest.approx(evaluation.wall_s, abs=0.01)


def test_a_local_worker_takes_this_process_cuda_probe_once_its_namespaces_match(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_probe_worker` as a local worker runs it: the CUDA rung comes from the search's
    process when the worker's own namespace probe finds the same setup; otherwise the
    worker probes in full (here: a seeded result, so no GPU is needed)."""
    import dataclasses

    from pytest_kernelpro.optimize.dask import cluster as cluster_module
    from pytest_kernelpro.optimize.sandbox import isolation as isolation_module

    base = Isolation.probe("auto", cuda=False, env=scrub_environment(os.environ))
    if not base.isolated:
        pytest.skip(f"no Linux namespaces here: {base.why}")
    monkeypatch.setattr(cluster_module, "PROBED", {})
    monkeypatch.setattr(isolation_module, "_PROBED", {"auto": base})
    known = dataclasses.replace(base, relax=("host_dev",))
    answer = cluster_module._probe_worker("auto", True, known)
    assert answer["probe"] == "the search's process"
    assert answer["isolation"] == known.describe()
    assert answer["isolated"] is True
    assert cluster_module.PROBED[("auto", True)] == known  # what its evaluators use
    # And the process's CUDA verdict, which a CUDA start-up failure can re-probe.
    assert isolation_module._PROBED["cuda"] == known
    assert Isolation.probe("auto", cuda=True) == known

    seeded = Isolation("fallback", why="seeded by this test")
    monkeypatch.setattr(isolation_module, "_PROBED", {"auto": base, "cuda": seeded})
    elsewhere = dataclasses.replace(known, unshare="/elsewhere/unshare")
    answer = cluster_module._probe_worker("auto", True, elsewhere)
    assert answer["probe"] == "own"
    assert answer["isolation"] == seeded.describe()


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def run(self, function: object, *args: object, **_: object) -> dict[str, object]:
        self.calls.append(args)
        return {}

    def scheduler_info(self, **_: object) -> dict[str, object]:
        return {"workers": {}}


def test_only_the_workers_of_a_local_cluster_are_offered_this_process_probe() -> None:
    joined = DaskCluster(RecordingClient())  # no cluster of its own: an address joined
    joined.probe(isolation="auto", cuda=True, known="this machine's probe")
    assert joined.client.calls == [("auto", True, None)]
    started = DaskCluster(RecordingClient(), cluster=object())
    started.probe(isolation="auto", cuda=True, known="this machine's probe")
    assert started.client.calls == [("auto", True, "this machine's probe")]


def test_connect_offers_the_probe_the_caller_described(cluster) -> None:
    here = Isolation.probe("auto", cuda=False, env=scrub_environment(os.environ))
    evaluator = DaskEvaluator(cluster, TASK, LIMITS)
    assert evaluator._local_probe(here.describe()) == here
    assert evaluator._local_probe("namespaces (something else)") is None
    assert evaluator._local_probe(None) is None
    remote = DaskEvaluator(FakeCluster([_info(isolated=True)]), TASK, LIMITS)  # type: ignore[arg-type]
    assert remote._local_probe(here.describe()) is None
    evaluator.connect(local_isolation=here.describe())
    assert evaluator.describe()["timings"]["probe_s"] >= 0
    assert [w.probe for w in evaluator.workers] == ["own", "own"]  # a CPU task: nothing to take
