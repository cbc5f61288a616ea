"""Candidate builds and evaluations as Dask tasks: `DaskEvaluator`.

The search stays in this process (selection, the model, the tree, the trajectory); every
candidate becomes up to two tasks on the cluster (`optimize/dask/cluster.py`):

- a **build** task, for a candidate with fast-path builds (`build.prebuild.find_builds`) on a
  CUDA task: it runs on any worker, without the GPU resource, compiles into that worker's
  build cache (`Prebuilder`, the same code the local evaluator builds ahead with) and hands
  back the finished cache entries, which the evaluating worker adds to its own cache (on one
  machine they are already there). Started from `prepare()`, so a whole expansion compiles
  while other candidates hold the GPUs;
- an **evaluation** task that requires `GPU=1` (a CUDA task; a CPU task takes a worker
  thread): on the worker it is `SandboxEvaluator.evaluate`, the very path of a local search
  (the namespace sandbox, the scrubbed environment, the trusted judge, the build cache the
  worker only reads), with the worker's own interpreter and its pinned GPU as device 0.
  `worker_chain` may wrap that evaluator there (the profiling evaluator, so that a candidate
  is profiled on the GPU that timed it).

What comes back is the evaluation plus `metrics["dask"]`: the worker, its host, wall-clock
stamps of the evaluation's start and end on the worker (and of the build), and how often
the task's worker was lost. A worker lost mid-evaluation is the scheduler's business: it
runs the task again elsewhere, and past its `allowed_failures` the task fails with
`KilledWorker`, which this evaluator turns into that candidate's `run_error`. A scheduler
that goes away ends the search with a `KernelproError` (the trajectory can be resumed).

`connect()` probes every worker first and refuses a cluster whose sandbox is weaker than
this machine's (namespaces here, the fallback there), so a distributed search never runs a
candidate with less isolation than a local one would. The workers of a local cluster take
this process's sandbox probe after checking their own namespaces (`cluster.py`).

A candidate on a worker gets the thread settings it would get in this process, not the
single thread Dask's nanny gives every worker (`dask_threads.py`). What runs on the workers
is in `dask_tasks.py`, the shipping of finished builds between them in `build_shipping.py`.

`describe()` has `timings`: the cluster's start, the workers' probe and (filled in by
`close()`, in the same dict) its close, in seconds.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
import uuid
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.optimize.dask.tasks import WorkerChain, build_task, evaluate_task, suspicious
from pytest_kernelpro.optimize.dask.threads import session_thread_environment
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.parallel import released

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.dask.cluster import DaskCluster, WorkerInfo
    from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits


class DaskEvaluator:
    """An `Evaluator` whose candidates are built and evaluated on a Dask cluster (module doc)."""

    def __init__(
        self,
        cluster: DaskCluster,
        task: KernelBenchTask,
        limits: SandboxLimits | None = None,
        *,
        worker_chain: WorkerChain | None = None,
        arch: str | None = None,
    ) -> None:
        from pytest_kernelpro.optimize.sandbox.task import SandboxLimits

        self.cluster = cluster
        self.client = cluster.client
        self.task = task
        self.limits = limits or SandboxLimits()
        self.worker_chain = worker_chain
        self.arch = arch
        self.cuda = task.device.startswith("cuda")
        self.workers: list[WorkerInfo] = []
        # One evaluator per worker process and search (it probes the sandbox once).
        self._token = uuid.uuid4().hex
        self._count = itertools.count(1)
        self._builds: dict[str, Any] = {}  # candidate code -> build future
        self._futures: set[Any] = set()
        self._lock = threading.Lock()
        self.owns_cluster = False
        self.thread_env = session_thread_environment()
        # Seconds of the cluster's start (open_evaluator), the probe and the close (close()).
        self.timings: dict[str, float] = {}

    # ----- setting up -----

    def connect(self, *, local_isolation: str | None = None) -> list[WorkerInfo]:
        """Probe the workers (module doc); `local_isolation` is this machine's sandbox
        (`Isolation.describe()`): a worker that cannot isolate as well is refused, and the
        workers of a local cluster take that probe (`cluster.py`)."""
        started = time.perf_counter()
        known = self._local_probe(local_isolation)
        workers = self.cluster.probe(isolation=self.limits.isolation, cuda=self.cuda, known=known)
        if not workers:
            raise KernelproError(f"the Dask cluster at {self.cluster.address} has no workers")
        if self.cuda and self.cluster.evaluation_slots("cuda") < 1:
            raise KernelproError(
                f"no worker of the Dask cluster at {self.cluster.address} offers a GPU: start "
                "workers with `dask worker ADDRESS --resources GPU=1` (one per GPU, "
                "CUDA_VISIBLE_DEVICES set to it), or use --kernelpro-dask=local"
            )
        isolated_here = local_isolation is not None and local_isolation.startswith("namespaces")
        weaker = [w for w in workers if isolated_here and not w.isolated]
        if weaker:
            raise KernelproError(
                "the candidate sandbox is weaker on Dask worker(s) "
                + ", ".join(f"{w.address} ({w.isolation})" for w in weaker)
                + f" than on this machine ({local_isolation}); a distributed search does not "
                "run candidates with less isolation. Allow unprivileged user namespaces (or run "
                "the workers as root) there, or search locally."
            )
        holding = [w for w in workers if w.secrets]
        if holding:
            warnings.warn(
                "kernelpro: Dask worker(s) hold secret-looking variables in their environment "
                + "; ".join(f"{w.address}: {', '.join(w.secrets)}" for w in holding)
                + ". Candidates never see them (the sandbox scrubs its environment), but the "
                "workers need none of them: start them without.",
                KernelproWarning,
                stacklevel=2,
            )
        if self.cuda and self.arch is None:
            self.arch = next((w.arch for w in workers if w.arch), None)
        self.workers = workers
        self.timings["probe_s"] = round(time.perf_counter() - started, 3)
        return workers

    def _local_probe(self, local_isolation: str | None) -> Any:
        """This process's sandbox probe, for the workers of a local cluster: the one the
        caller described (`Isolation.probe` caches it per process, so this costs nothing
        after the caller's probe); None otherwise."""
        if local_isolation is None or not getattr(self.cluster, "local", False):
            return None
        from pytest_kernelpro.optimize.sandbox.environment import scrub_environment
        from pytest_kernelpro.optimize.sandbox.isolation import Isolation

        here = Isolation.probe(
            self.limits.isolation, cuda=self.cuda, env=scrub_environment(os.environ)
        )
        return here if here.describe() == local_isolation else None

    def slots(self) -> int:
        """Evaluations the cluster runs at once (the search's `in_flight`)."""
        return max(1, self.cluster.evaluation_slots(self.task.device))

    def describe(self) -> dict[str, Any]:
        """The cluster, for the trajectory header and the report."""
        return {
            "scheduler": self.cluster.address,
            "local": self.cluster.local,
            "slots": self.slots(),
            "arch": self.arch,
            "workers": [w.to_dict() for w in self.workers],
            "timings": self.timings,  # the same dict: close() adds its seconds to it
        }

    # ----- the Evaluator interface -----

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Start the builds of an expansion's candidates on the cluster (CPU tasks)."""
        if not self.cuda or self.arch is None:
            return
        from pytest_kernelpro.optimize.build.prebuild import find_builds

        for candidate in candidates:
            code = candidate.code
            with self._lock:
                if code in self._builds or not find_builds(code):
                    continue
                future = self.client.submit(
                    build_task,
                    code,
                    self.arch,
                    self.limits.build_cache_dir,
                    key=f"kernelpro-build-{_digest(code)}-{next(self._count)}",
                    pure=False,
                )
                self._builds[code] = future
                self._futures.add(future)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """Evaluate `candidate` on a worker; never raises for the candidate's failures or a
        lost worker (module doc)."""
        distributed = _distributed()
        with self._lock:
            build = self._builds.pop(candidate.code, None)
            key = f"kernelpro-eval-{_digest(candidate.code)}-{next(self._count)}"
            future = self.client.submit(
                evaluate_task,
                self._token,
                self.task,
                self.limits,
                candidate.to_dict(),
                build,
                self.worker_chain,
                self.thread_env,
                key=key,
                pure=False,
                resources={"GPU": 1} if self.cuda else None,
            )
            self._futures.add(future)
        try:
            with released():
                data = future.result()
        except distributed.KilledWorker as exc:
            return Evaluation(
                status="run_error",
                reason=f"the Dask worker evaluating this candidate was lost (retried, then "
                f"counted as failed): {exc}",
                metrics={"dask": {"key": key, "lost": True}},
            )
        except Exception as exc:
            if future.status == "error":
                raise  # the task itself raised: the search decides (a broken reference ends it)
            raise KernelproError(
                f"the Dask scheduler at {self.cluster.address} stopped answering while "
                f"candidate {key} ran ({type(exc).__name__}: {exc}); the search ends here and "
                "its trajectory can be resumed with --kernelpro-resume"
            ) from None
        finally:
            with self._lock:
                self._futures.discard(future)
                if build is not None:
                    self._futures.discard(build)
        # Redacted again here: the worker's machine does not know this session's secrets.
        evaluation = Evaluation.from_dict(data["evaluation"]).made_safe()
        info = dict(data["dask"])
        info["key"] = key
        info["worker_losses"] = self._losses(key)
        evaluation.metrics["dask"] = info
        return evaluation

    def cancel(self) -> None:
        """Cancel every task of this search still on the cluster (Ctrl-C, a failed search)."""
        with self._lock:
            futures, self._futures = list(self._futures), set()
            self._builds.clear()
        if futures:
            try:
                self.client.cancel(futures, force=True)
            except Exception:  # the cluster may be gone already
                pass

    def close(self) -> None:
        """Cancel what is left; stop the cluster when `open_evaluator` started it."""
        started = time.perf_counter()
        self.cancel()
        if self.owns_cluster:
            self.cluster.close()
        self.timings["close_s"] = round(time.perf_counter() - started, 3)

    def _losses(self, key: str) -> int | None:
        """How often the scheduler saw this task's worker die under it."""
        try:
            return self.client.run_on_scheduler(suspicious, key=key)
        except Exception:  # a remote scheduler without this package: unknown
            return None


def open_evaluator(
    spec: str,
    task: KernelBenchTask,
    limits: SandboxLimits | None = None,
    *,
    local_isolation: str | None = None,
    worker_chain: WorkerChain | None = None,
) -> DaskEvaluator:
    """Start or join the cluster of `spec` (`--kernelpro-dask`), probe its workers and
    return the evaluator; its `close()` stops a cluster it started."""
    from pytest_kernelpro.optimize.dask.cluster import DaskCluster

    started = time.perf_counter()
    cluster = DaskCluster.start(spec)
    start_s = time.perf_counter() - started
    try:
        evaluator = DaskEvaluator(cluster, task, limits, worker_chain=worker_chain)
        evaluator.timings["start_s"] = round(start_s, 3)
        evaluator.owns_cluster = True
        evaluator.connect(local_isolation=local_isolation)
    except BaseException:
        cluster.close()
        raise
    return evaluator


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()[:12]


def _distributed() -> Any:
    from pytest_kernelpro.optimize.dask.cluster import require_distributed

    return require_distributed()
