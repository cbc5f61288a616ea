"""pytest-xdist scale-out: one GPU per worker, never two workers timing on one GPU."""

from __future__ import annotations

import os
import re


def visible_gpu_ids(environ: dict[str, str] | None = None) -> list[str]:
    """GPU ids this process may use, without initialising CUDA (NVML or CUDA_VISIBLE_DEVICES)."""
    env = os.environ if environ is None else environ
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: no GPUs
        return []
    try:
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def assign_worker_gpu(
    worker_id: str, worker_count: int, environ: dict[str, str] | None = None
) -> str | None:
    """Pin this xdist worker to its own GPU by setting CUDA_VISIBLE_DEVICES.

    Returns the GPU id chosen, or None when there are no GPUs (CPU kernels only). Raises
    ValueError when there are fewer GPUs than workers, because two workers timing on one
    GPU disturb each other's numbers.
    """
    env = os.environ if environ is None else environ
    gpus = visible_gpu_ids(env)
    if not gpus:
        return None
    match = re.fullmatch(r"gw(\d+)", worker_id)
    if match is None:
        raise ValueError(f"unexpected xdist worker id {worker_id!r}")
    index = int(match.group(1))
    if worker_count > len(gpus):
        raise ValueError(
            f"pytest -n {worker_count} starts {worker_count} workers but only {len(gpus)} GPU(s) "
            f"are visible ({','.join(gpus)}); two workers timing on one GPU spoil both "
            f"measurements: use -n {len(gpus)} or fewer"
        )
    env["CUDA_VISIBLE_DEVICES"] = gpus[index]
    return gpus[index]
