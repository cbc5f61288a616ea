"""Candidate builds and evaluations as Dask tasks: `DaskEvaluator`.

The search stays in this process (selection, the model, the tree, the trajectory); every
candidate becomes up to two tasks on the cluster (`search/cluster.py`):

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

A candidate on a worker gets the thread settings it would get in this process: Dask's
nanny starts every worker with `OMP_NUM_THREADS=1`, `MKL_NUM_THREADS=1` and
`OPENBLAS_NUM_THREADS=1` (its `distributed.nanny.pre-spawn-environ`), names the sandbox's
allow-list passes on, which would make every CPU candidate, and the CPU side of the checks,
single-threaded on Dask only. The session's values of those names (or their absence) travel
with each task and replace the worker's in the candidate's environment.

`describe()` has `timings`: the cluster's start, the workers' probe and (filled in by
`close()`, in the same dict) its close, in seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import os
import socket
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.search.base import Candidate, Evaluation
from pytest_kernelpro.search.parallel import released

if TYPE_CHECKING:
    from pytest_kernelpro.search.base import Evaluator
    from pytest_kernelpro.search.cluster import DaskCluster, WorkerInfo
    from pytest_kernelpro.search.task import KernelBenchTask, SandboxLimits

# Build results bigger than this are not shipped between workers (the evaluating worker
# builds such a candidate itself, as a local search would without the prebuild).
MAX_SHIPPED_BUILD_BYTES = 256 * 1024 * 1024

WorkerChain = Callable[["Evaluator"], "Evaluator"]


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
        from pytest_kernelpro.search.task import SandboxLimits

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
        from pytest_kernelpro.search.environment import scrub_environment
        from pytest_kernelpro.search.isolation import Isolation

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
        from pytest_kernelpro.build.prebuild import find_builds

        for candidate in candidates:
            code = candidate.code
            with self._lock:
                if code in self._builds or not find_builds(code):
                    continue
                future = self.client.submit(
                    _build_task,
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
                _evaluate_task,
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
        evaluation = Evaluation.from_dict(data["evaluation"])
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
            return self.client.run_on_scheduler(_suspicious, key=key)
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
    from pytest_kernelpro.search.cluster import DaskCluster

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


# ----- what runs on the workers -----

_EVALUATORS: dict[str, Any] = {}
_EVALUATORS_LOCK = threading.Lock()


def nanny_thread_variables() -> tuple[str, ...]:
    """The names Dask's nanny sets in a worker before starting it (its
    `distributed.nanny.pre-spawn-environ`) that the sandbox passes on to a candidate."""
    from pytest_kernelpro.search.environment import scrub_environment

    try:
        import dask

        names = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    except ImportError:
        return ()
    return tuple(sorted(scrub_environment(dict.fromkeys(names, ""))))


def session_thread_environment() -> dict[str, str | None]:
    """This process's values of `nanny_thread_variables()` (None: not set here)."""
    return {name: os.environ.get(name) for name in nanny_thread_variables()}


def _with_thread_environment(
    env: dict[str, str], thread_env: dict[str, str | None] | None
) -> dict[str, str]:
    for name, value in (thread_env or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _worker_evaluator(
    token: str,
    task: KernelBenchTask,
    limits: SandboxLimits,
    chain: WorkerChain | None,
    thread_env: dict[str, str | None] | None = None,
) -> Any:
    """This worker's evaluator of one search: a `SandboxEvaluator` (wrapped by `chain`)
    whose candidates get the search's thread settings (module doc)."""
    from pytest_kernelpro.search.evaluator import SandboxEvaluator

    class WorkerSandboxEvaluator(SandboxEvaluator):
        def environment(self, workdir: Path | None = None) -> dict[str, str]:
            return _with_thread_environment(super().environment(workdir), thread_env)

    with _EVALUATORS_LOCK:
        evaluator = _EVALUATORS.get(token)
        if evaluator is None:
            # A pinned worker sees its GPU as device 0; its interpreter is its own.
            device = "cuda" if task.device.startswith("cuda") else task.device
            local_task = dataclasses.replace(task, device=device)
            local_limits = dataclasses.replace(limits, python=sys.executable)
            evaluator = WorkerSandboxEvaluator(local_task, local_limits)
            from pytest_kernelpro.search.cluster import PROBED

            probed = PROBED.get((local_limits.isolation, device.startswith("cuda")))
            if probed is not None:
                evaluator._isolation = probed  # probed at connect, on this very process
            if chain is not None:
                evaluator = chain(evaluator)
            _EVALUATORS[token] = evaluator
    return evaluator


def _evaluate_task(
    token: str,
    task: KernelBenchTask,
    limits: SandboxLimits,
    candidate: dict[str, Any],
    build: dict[str, Any] | None,
    chain: WorkerChain | None,
    thread_env: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """The evaluation task: the candidate through this worker's sandbox evaluator."""
    started = time.time()
    installed = 0
    if build is not None and build.get("entries"):
        installed = install_entries(_cache_root(limits.build_cache_dir), build["entries"])
    evaluator = _worker_evaluator(token, task, limits, chain, thread_env)
    evaluation = evaluator.evaluate(Candidate.from_dict(candidate))
    ended = time.time()
    info: dict[str, Any] = {
        **_where(),
        "started": started,
        "ended": ended,
    }
    if build is not None:
        info["build"] = {k: v for k, v in build.items() if k != "entries"}
        info["build"]["installed_entries"] = installed
    return {"evaluation": evaluation.to_dict(), "dask": info}


def _build_task(code: str, arch: str, cache_dir: str | None) -> dict[str, Any]:
    """The build task: the candidate's fast-path builds into this worker's cache."""
    from pytest_kernelpro.build.cache import BuildCache
    from pytest_kernelpro.build.prebuild import Prebuilder

    started = time.time()
    cache = BuildCache(cache_dir, writable=True)
    builder = Prebuilder(cache, arch=arch, jobs=1)
    try:
        result = builder.wait(code)
    except Exception as exc:  # the evaluating worker builds it then, and reports the error
        return {**_where(), "started": started, "ended": time.time(), "error": repr(exc)}
    finally:
        builder.close()
    keys = []
    for record in result.builds if result is not None else []:
        keys += [k for k in (record.get("key"), record.get("binding_key")) if k]
    return {
        **_where(),
        "started": started,
        "ended": time.time(),
        "prebuild": None if result is None else result.to_dict(),
        "entries": pack_entries(cache, keys),
    }


def pack_entries(cache: Any, keys: Sequence[str]) -> bytes | None:
    """The complete cache entries of `keys` as one tar (None when there are none or they
    are too big to ship)."""
    buffer = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for key in dict.fromkeys(keys):
            entry = cache.lookup(key)
            if entry is None:
                continue
            tar.add(str(entry.path), arcname=f"{key[:2]}/{key}")
            count += 1
            if buffer.tell() > MAX_SHIPPED_BUILD_BYTES:
                return None
    return buffer.getvalue() if count else None


def install_entries(root: Path, packed: bytes) -> int:
    """Add the shipped entries this cache lacks; each appears whole (one rename) or not at
    all, like an entry the cache built itself. Returns how many were added."""
    root.mkdir(parents=True, exist_ok=True)
    added = 0
    with tempfile.TemporaryDirectory(dir=root, prefix="shipped-") as scratch:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            members = [m for m in tar.getmembers() if _safe_member(m)]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(scratch, members=members, filter="data")
            else:  # Python < 3.10.12: the members were checked above
                tar.extractall(scratch, members=members)  # noqa: S202
        for shard in Path(scratch).iterdir():
            for entry in shard.iterdir():
                target = root / shard.name / entry.name
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(entry, target)
                    added += 1
                except OSError:  # built or installed meanwhile by someone else
                    pass
    return added


def _safe_member(member: tarfile.TarInfo) -> bool:
    name = member.name
    return (
        not name.startswith(("/", "\\"))
        and ".." not in Path(name).parts
        and (member.isfile() or member.isdir())
    )


def _cache_root(cache_dir: str | None) -> Path:
    from pytest_kernelpro.build.cache import default_cache_dir

    return Path(cache_dir) if cache_dir else default_cache_dir()


def _where() -> dict[str, Any]:
    address = None
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):
        pass
    return {"worker": address, "host": socket.gethostname(), "pid": os.getpid()}


def _suspicious(dask_scheduler: Any = None, *, key: str) -> int | None:
    """Runs on the scheduler: how often a worker died while holding task `key`."""
    state = dask_scheduler.tasks.get(key) if dask_scheduler is not None else None
    return None if state is None else int(state.suspicious)


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()[:12]


def _distributed() -> Any:
    from pytest_kernelpro.search.cluster import require_distributed

    return require_distributed()
