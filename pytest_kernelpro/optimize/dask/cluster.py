"""The Dask cluster a distributed search runs on: a local one, or an existing scheduler.

`--kernelpro-dask=local` (or `local:N`) starts a cluster on this machine: a scheduler in this
process and one worker process per visible GPU, each pinned to its device through
`CUDA_VISIBLE_DEVICES` and offering the resource `GPU=1` (two threads: one evaluation and one
build at a time); without a GPU, N CPU workers (default 2) of one thread each, for CPU
candidates. It is Dask's `SpecCluster` (what `LocalCluster` is made of) with one difference
that matters here: every worker is a `dask spec` subprocess started with the sandbox's
scrubbed environment (`sandbox.environment.scrub_environment`), so no API key or token of this session
is in a worker's environment to begin with, not only in its candidates'. The scheduler counts
a task whose worker died as lost once and runs it again; a second loss fails the task
(`allowed_failures=1`): a worker killed mid-search costs only its candidate.

`--kernelpro-dask=ADDRESS` connects to a running scheduler (`dask scheduler`, with workers
started as `dask worker ADDRESS --resources GPU=1 --nthreads 2`, one per GPU, each seeing
its GPU as device 0, as dask-cuda or a SLURM/Kubernetes deployment starts them). There the
scheduler's `distributed.scheduler.allowed-failures` (Dask's default: 3) says how often a
lost candidate is retried.

Either way `probe()` asks every worker what its sandbox can do and which secret-looking
variables its environment holds (names only); `DaskEvaluator` refuses workers whose sandbox
is weaker than this machine's. The workers of a local cluster run on this machine, as
children of this process: given this process's probe (`known`), each checks that its own
namespace probe (cheap) finds the same sandbox and then takes the CUDA rung from it instead
of climbing the CUDA ladder again (up to three processes that each initialise the GPU).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError, KernelproError

INSTALL_HINT = 'pip install "pytest-kernelpro[dask]"'
OPTION = "--kernelpro-dask"
DEFAULT_CPU_WORKERS = 2
# A cold worker imports distributed, torch and the package; on a loaded machine that takes
# a while, and waiting longer costs nothing when they come up sooner.
WORKER_START_TIMEOUT_S = 180.0

_ADDRESS = re.compile(r"^(tcp|tls|ucx|ws|wss|inproc)://\S+$|^[\w.\-]+:\d+$")
_LOCAL = re.compile(r"^local(?::(\d+))?$")


def parse_dask(text: str) -> str:
    """Validate `--kernelpro-dask`: `local`, `local:N` or a scheduler address."""
    value = str(text).strip()
    local = _LOCAL.match(value.lower())
    if local:
        if local.group(1) is not None and int(local.group(1)) < 1:
            raise KernelproConfigError(
                f"{OPTION}={text!r}: local:N needs at least one worker (N >= 1)."
            )
        return value.lower()
    if _ADDRESS.match(value) or (value.endswith(".json") and "://" not in value):
        return value
    raise KernelproConfigError(
        f"{OPTION}={text!r} is neither 'local', 'local:N' nor a scheduler address "
        "(tcp://HOST:PORT, HOST:PORT, or a scheduler file *.json); e.g. "
        f"{OPTION}=local or {OPTION}=tcp://10.0.0.5:8786."
    )


def require_distributed() -> Any:
    """The `distributed` module, or a clear error naming the extra to install."""
    try:
        import distributed
    except ImportError as exc:
        raise KernelproConfigError(
            f"{OPTION} needs Dask's distributed scheduler, which is not installed "
            f"({exc}); install it with: {INSTALL_HINT}"
        ) from None
    return distributed


def worker_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local worker process: the sandbox's scrubbed one, with this
    package importable and Dask's own settings kept."""
    from pytest_kernelpro.optimize.sandbox.environment import (
        PACKAGE_ROOT,
        is_secret_name,
        scrub_environment,
    )

    env_in = dict(os.environ if environ is None else environ)
    env = scrub_environment(env_in)
    env.update({k: v for k, v in env_in.items() if k.startswith("DASK_") and not is_secret_name(k)})
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class WorkerInfo:
    """What one worker said about itself (`probe`)."""

    address: str
    host: str
    pid: int
    gpus: str | None  # its CUDA_VISIBLE_DEVICES (None: not set)
    resources: dict[str, float] = field(default_factory=dict)
    nthreads: int = 1
    isolation: str = ""
    isolated: bool = False
    secrets: tuple[str, ...] = ()  # names of secret-looking variables in its environment
    arch: str | None = None  # its GPU's compile target (None without a GPU)
    probe: str = "own"  # "own", or "the search's process" (a local cluster's, checked there)

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "host": self.host,
            "pid": self.pid,
            "gpus": self.gpus,
            "resources": dict(self.resources),
            "nthreads": self.nthreads,
            "isolation": self.isolation,
            "isolated": self.isolated,
            "secrets": list(self.secrets),
            "arch": self.arch,
            "probe": self.probe,
        }


# Sandbox probes made on this worker process (`_probe_worker`), by mode and CUDA: the CUDA
# probe starts processes that initialise the GPU, which need not happen twice.
PROBED: dict[tuple[str, bool], Any] = {}


def _probe_worker(isolation_mode: str, cuda: bool, known: Any = None) -> dict[str, Any]:
    """Runs on each worker: its sandbox, its GPU, the secret-looking names it holds.

    `known` (an `Isolation`, local clusters only) is the sandbox the search's process probed
    on this machine: taken when this worker's own namespace probe finds the same setup (the
    CUDA rung is the only part not checked again), else this worker probes in full."""
    from dataclasses import replace

    from pytest_kernelpro.optimize.sandbox import isolation as isolation_module
    from pytest_kernelpro.optimize.sandbox.environment import is_secret_name, scrub_environment
    from pytest_kernelpro.optimize.sandbox.isolation import Isolation

    env = scrub_environment(os.environ)
    source = "own"
    try:
        isolation = None
        if known is not None and cuda:
            base = Isolation.probe(isolation_mode, cuda=False, env=env)
            if replace(known, relax=()) == replace(base, relax=()):
                isolation, source = known, "the search's process"
                # This process's CUDA verdict from now on, as if it had probed it: a run
                # that fails with CUDA's start-up error can re-probe it (reprobe_cuda).
                with isolation_module._PROBE_LOCK:
                    isolation_module._PROBED.setdefault("cuda", known)
        if isolation is None:
            isolation = Isolation.probe(isolation_mode, cuda=cuda, env=env)
        described, isolated = isolation.describe(), isolation.isolated
        PROBED[(isolation_mode, cuda)] = isolation  # the worker's evaluators reuse it
    except KernelproError as exc:
        described, isolated = f"unavailable: {exc}", False
    arch = None
    if cuda:
        from pytest_kernelpro.optimize.build.api import default_arch

        try:
            arch = default_arch()
        except KernelproError:
            arch = None
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "isolation": described,
        "isolated": isolated,
        "secrets": sorted(name for name in os.environ if is_secret_name(name)),
        "arch": arch,
        "probe": source,
    }


class DaskCluster:
    """A connected Dask client, and the local cluster behind it when this process started
    one. Use as a context manager; `close()` stops what it started (module doc)."""

    def __init__(self, client: Any, cluster: Any = None, *, spec: str = "") -> None:
        self.client = client
        self.cluster = cluster
        self.spec = spec
        self._closed = False

    @property
    def local(self) -> bool:
        return self.cluster is not None

    @property
    def address(self) -> str:
        return str(self.client.scheduler.address)

    @classmethod
    def start(cls, spec: str, *, workers_timeout_s: float = WORKER_START_TIMEOUT_S) -> DaskCluster:
        """Start (`local`, `local:N`) or connect to (an address) the cluster of `spec`."""
        distributed = require_distributed()
        spec = parse_dask(spec)
        local = _LOCAL.match(spec)
        if local is None:
            try:
                if spec.endswith(".json") and "://" not in spec:
                    client = distributed.Client(scheduler_file=spec, timeout=30)
                else:
                    client = distributed.Client(spec, timeout=30)
            except OSError as exc:
                raise KernelproError(
                    f"{OPTION}={spec}: no Dask scheduler answered ({exc}); start one with "
                    "`dask scheduler` and workers with `dask worker ADDRESS --resources GPU=1`, "
                    f"or use {OPTION}=local."
                ) from None
            return cls(client, None, spec=spec)
        count = int(local.group(1)) if local.group(1) else None
        return cls._start_local(distributed, count, workers_timeout_s, spec)

    @classmethod
    def _start_local(
        cls, distributed: Any, count: int | None, timeout_s: float, spec: str
    ) -> DaskCluster:
        from pytest_kernelpro.run.workers import visible_gpu_ids

        gpus = visible_gpu_ids()
        env = worker_environment()
        workers: dict[str, Any] = {}
        if gpus:
            for gpu in gpus[: count or len(gpus)]:
                name = f"kernelpro-gpu{gpu}"
                workers[name] = _worker_spec(
                    name, {**env, "CUDA_VISIBLE_DEVICES": gpu}, nthreads=2, resources={"GPU": 1}
                )
        else:
            # No GPU: CPU workers for CPU candidates; none may see a GPU it would share.
            for index in range(count or DEFAULT_CPU_WORKERS):
                name = f"kernelpro-cpu{index}"
                workers[name] = _worker_spec(
                    name, {**env, "CUDA_VISIBLE_DEVICES": ""}, nthreads=1, resources={}
                )
        scheduler = {
            "cls": distributed.Scheduler,
            "options": {
                "host": "127.0.0.1",
                "port": 0,
                "dashboard": False,
                "dashboard_address": "127.0.0.1:0",  # a random port: never a clash
                "allowed_failures": 1,
            },
        }
        cluster = distributed.SpecCluster(
            workers=workers,
            scheduler=scheduler,
            silence_logs=logging.ERROR,
            name="kernelpro",
        )
        try:
            client = distributed.Client(cluster)
            client.wait_for_workers(len(workers), timeout=timeout_s)
        except BaseException as exc:
            cluster.close()
            if isinstance(exc, Exception):
                raise KernelproError(
                    f"{OPTION}={spec}: the local Dask workers did not all start within "
                    f"{timeout_s:g}s ({type(exc).__name__}: {exc})"
                ) from None
            raise
        return cls(client, cluster, spec=spec)

    def workers(self) -> dict[str, dict[str, Any]]:
        """The scheduler's view of the workers: address -> info (pid, resources, nthreads)."""
        return dict(self.client.scheduler_info(n_workers=-1).get("workers") or {})

    def worker_pids(self) -> dict[str, int]:
        """Each live worker's process id (the scheduler's worker info has none)."""
        answers = self.client.run(os.getpid, on_error="return")
        return {a: int(p) for a, p in answers.items() if isinstance(p, int)}

    def probe(
        self, *, isolation: str = "auto", cuda: bool = False, known: Any = None
    ) -> list[WorkerInfo]:
        """Every worker's sandbox, GPU and secret-looking variable names; `known` (this
        process's `Isolation`) is offered to the workers of a local cluster only (module
        doc)."""
        offered = known if self.local else None
        answers = self.client.run(_probe_worker, isolation, cuda, offered)
        known = self.workers()
        out = []
        for address, answer in sorted(answers.items()):
            info = known.get(address) or {}
            out.append(
                WorkerInfo(
                    address=address,
                    host=str(answer["host"]),
                    pid=int(answer["pid"]),
                    gpus=answer["gpus"],
                    resources=dict(info.get("resources") or {}),
                    nthreads=int(info.get("nthreads") or 1),
                    isolation=str(answer["isolation"]),
                    isolated=bool(answer["isolated"]),
                    secrets=tuple(answer["secrets"]),
                    arch=answer["arch"],
                    probe=str(answer.get("probe") or "own"),
                )
            )
        return out

    def evaluation_slots(self, device: str) -> int:
        """How many evaluations can run at once: the GPUs offered (`GPU` resources) for a
        CUDA task, the worker threads for a CPU one."""
        workers = self.workers().values()
        if device.startswith("cuda"):
            return int(sum(float((w.get("resources") or {}).get("GPU", 0)) for w in workers))
        return int(sum(int(w.get("nthreads") or 1) for w in workers))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def __enter__(self) -> DaskCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker_spec(
    name: str, env: dict[str, str], *, nthreads: int, resources: dict[str, float]
) -> dict[str, Any]:
    return {
        "cls": scrubbed_worker_class(),
        "options": {
            "env": env,
            "worker_kwargs": {
                "name": name,
                "nthreads": nthreads,
                "resources": resources,
                # The sandbox limits each candidate's memory; the worker's own limit would
                # restart a worker for what its candidate did.
                "memory_limit": 0,
                "dashboard": False,
                "silence_logs": logging.ERROR,
            },
        },
    }


@functools.cache
def scrubbed_worker_class() -> type:
    """Dask's `SubprocessWorker` (a Nanny in a `dask spec` subprocess), started with the
    environment given instead of this process's (module doc). Made on first use, so that
    this module imports without Dask."""
    from distributed.deploy.subprocess import SubprocessWorker

    class ScrubbedSubprocessWorker(SubprocessWorker):  # type: ignore[misc]
        def __init__(
            self,
            scheduler: str,
            *,
            env: Mapping[str, str],
            name: str | None = None,
            worker_kwargs: dict[str, Any] | None = None,
        ) -> None:
            super().__init__(scheduler, name=name, worker_kwargs=worker_kwargs)
            self.env = dict(env)

        async def _start(self) -> None:
            import asyncio

            spec = {"cls": self.worker_class, "opts": copy.copy(self.worker_kwargs)}
            cmd = [sys.executable, "-m", "dask", "spec", self.scheduler, "--spec", json.dumps(spec)]
            self.process = await asyncio.create_subprocess_exec(
                *cmd, env=self.env, stdin=asyncio.subprocess.DEVNULL
            )

    return ScrubbedSubprocessWorker
