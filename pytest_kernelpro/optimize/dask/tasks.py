"""What a distributed search runs on the Dask workers and the scheduler.

`evaluate_task` is the evaluation task (it requires `GPU=1` for a CUDA task): on the worker
it is `SandboxEvaluator.evaluate`, the very path of a local search (the namespace sandbox,
the scrubbed environment, the trusted judge, the build cache the worker only reads), with the
worker's own interpreter and its pinned GPU as device 0, wrapped by the search's
`worker_chain` when it has one (the profiling evaluator, so that a candidate is profiled on
the GPU that timed it). Each worker keeps one evaluator per search (`_EVALUATORS`, by the
search's token), so it probes the sandbox once; the workers of a local cluster take the
search process's probe (`cluster.PROBED`). Candidates get the session's thread settings
(`dask_threads.py`). `build_task` compiles a candidate's fast-path builds into its worker's
cache and hands back the finished entries (`build_shipping.py`). Both stamp where and when
they ran (`where`); `suspicious` runs on the scheduler and says how often a worker died
while holding a task.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.optimize.dask.shipping import cache_root, install_entries, pack_entries
from pytest_kernelpro.optimize.dask.threads import with_thread_environment
from pytest_kernelpro.optimize.search.interfaces import Candidate

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits
    from pytest_kernelpro.optimize.search.interfaces import Evaluator

# What wraps a worker's sandbox evaluator there (the profiling evaluator, say).
WorkerChain = Callable[["Evaluator"], "Evaluator"]

_EVALUATORS: dict[str, Any] = {}
_EVALUATORS_LOCK = threading.Lock()


def _worker_evaluator(
    token: str,
    task: KernelBenchTask,
    limits: SandboxLimits,
    chain: WorkerChain | None,
    thread_env: dict[str, str | None] | None = None,
) -> Any:
    """This worker's evaluator of one search: a `SandboxEvaluator` (wrapped by `chain`)
    whose candidates get the search's thread settings (module doc)."""
    from pytest_kernelpro.optimize.sandbox.evaluator import SandboxEvaluator

    class WorkerSandboxEvaluator(SandboxEvaluator):
        def environment(self, workdir: Path | None = None) -> dict[str, str]:
            return with_thread_environment(super().environment(workdir), thread_env)

    with _EVALUATORS_LOCK:
        evaluator = _EVALUATORS.get(token)
        if evaluator is None:
            # A pinned worker sees its GPU as device 0; its interpreter is its own.
            device = "cuda" if task.device.startswith("cuda") else task.device
            local_task = dataclasses.replace(task, device=device)
            local_limits = dataclasses.replace(limits, python=sys.executable)
            evaluator = WorkerSandboxEvaluator(local_task, local_limits)
            from pytest_kernelpro.optimize.dask.cluster import PROBED

            probed = PROBED.get((local_limits.isolation, device.startswith("cuda")))
            if probed is not None:
                evaluator._isolation = probed  # probed at connect, on this very process
            if chain is not None:
                evaluator = chain(evaluator)
            _EVALUATORS[token] = evaluator
    return evaluator


def evaluate_task(
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
        installed = install_entries(cache_root(limits.build_cache_dir), build["entries"])
    evaluator = _worker_evaluator(token, task, limits, chain, thread_env)
    evaluation = evaluator.evaluate(Candidate.from_dict(candidate))
    ended = time.time()
    info: dict[str, Any] = {
        **where(),
        "started": started,
        "ended": ended,
    }
    if build is not None:
        info["build"] = {k: v for k, v in build.items() if k != "entries"}
        info["build"]["installed_entries"] = installed
    return {"evaluation": evaluation.to_dict(), "dask": info}


def build_task(code: str, arch: str, cache_dir: str | None) -> dict[str, Any]:
    """The build task: the candidate's fast-path builds into this worker's cache."""
    from pytest_kernelpro.optimize.build.cache import BuildCache
    from pytest_kernelpro.optimize.build.prebuild import Prebuilder
    from pytest_kernelpro.optimize.sandbox.isolation import Isolation, confinement

    started = time.time()
    cache = BuildCache(cache_dir, writable=True)
    # The candidate's source and flags are its input: compiled in this machine's sandbox.
    cache.confine = confinement(Isolation.probe("auto"), [cache.root])
    builder = Prebuilder(cache, arch=arch, jobs=1)
    try:
        result = builder.wait(code)
    except Exception as exc:  # the evaluating worker builds it then, and reports the error
        return {**where(), "started": started, "ended": time.time(), "error": repr(exc)}
    finally:
        builder.close()
    keys = []
    for record in result.builds if result is not None else []:
        keys += [k for k in (record.get("key"), record.get("binding_key")) if k]
    return {
        **where(),
        "started": started,
        "ended": time.time(),
        "prebuild": None if result is None else result.to_dict(),
        "entries": pack_entries(cache, keys),
    }


def where() -> dict[str, Any]:
    """This worker's address (None outside a worker), host and process id."""
    address = None
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):
        pass
    return {"worker": address, "host": socket.gethostname(), "pid": os.getpid()}


def suspicious(dask_scheduler: Any = None, *, key: str) -> int | None:
    """Runs on the scheduler: how often a worker died while holding task `key`."""
    state = dask_scheduler.tasks.get(key) if dask_scheduler is not None else None
    return None if state is None else int(state.suspicious)
