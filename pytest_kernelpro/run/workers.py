"""pytest-xdist scale-out: one GPU per worker, never two workers timing on one GPU (a worker
past the last GPU runs ordinary tests and fails the kernel items that need a GPU)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


def visible_gpu_ids(environ: dict[str, str] | None = None) -> list[str]:
    """GPU ids this process may use, without initialising CUDA (NVML or CUDA_VISIBLE_DEVICES)."""
    env = os.environ if environ is None else environ
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML, or no driver: no GPUs
        return []
    try:
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class WorkerGpu:
    """What this xdist worker may time on: `gpu`, the GPU pinned to it (None: none pinned),
    and `shared`, why it has no GPU of its own (more workers than GPUs), else None."""

    gpu: str | None = None
    shared: str | None = None


def assign_worker_gpu(
    worker_id: str, worker_count: int, environ: dict[str, str] | None = None
) -> WorkerGpu:
    """Pin this xdist worker to its own GPU by setting CUDA_VISIBLE_DEVICES (with no GPU,
    nothing is pinned). Workers past the last GPU are left as they are: their ordinary tests
    run as without the plugin (a suite's unit tests may share a GPU), while a kernel item that
    would be timed on a GPU there fails with `shared` as its reason."""
    env = os.environ if environ is None else environ
    gpus = visible_gpu_ids(env)
    if not gpus:
        return WorkerGpu()
    match = re.fullmatch(r"gw(\d+)", worker_id)
    if match is None:
        raise ValueError(f"unexpected xdist worker id {worker_id!r}")
    index = int(match.group(1))
    if index >= len(gpus):
        return WorkerGpu(
            shared=(
                f"xdist worker {worker_id} has no GPU of its own: pytest -n {worker_count} "
                f"started {worker_count} workers for {len(gpus)} visible GPU(s) "
                f"({','.join(gpus)}), and two workers timing on one GPU spoil both "
                f"measurements. Run the kernels with -n {len(gpus)} or fewer (e.g. "
                "`pytest -m kernelpro -n 1` beside the rest of the suite)"
            )
        )
    env["CUDA_VISIBLE_DEVICES"] = gpus[index]
    return WorkerGpu(gpu=gpus[index])
