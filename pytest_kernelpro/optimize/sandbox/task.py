"""What the sandbox evaluates against and under which limits: a KernelBench-format task
(`KernelBenchTask`) and the process limits of one evaluation (`SandboxLimits`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError


@dataclass(frozen=True)
class KernelBenchTask:
    """A KernelBench-format problem and how to check candidates against it."""

    reference: str  # source text: class Model, get_inputs(), get_init_inputs()
    name: str = "task"
    device: str = "auto"  # "auto" (cuda when available), "cuda" or "cpu"
    seed: int = 42
    correct_trials: int = 3
    atol: float | None = None  # None: by output dtype (fp32 1e-4, fp16/bf16 1e-2)
    rtol: float | None = None
    forbidden_ops: tuple[str, ...] = ()  # e.g. ("aten.mm", "aten.addmm") for a GEMM task
    shape_check: str = "auto"  # "auto" | "variants" | "off" (see harness.py)
    # `measure.timing.TimingBudget` settings (warmup_ms, max_time_s, min_samples,
    # max_samples, flush_l2, ...) for the reference and each candidate; empty: its defaults.
    timing: Mapping[str, Any] = field(default_factory=dict)
    cpu_threads: int | None = None  # torch.set_num_threads in the worker (None: torch's default)
    # sys.path entries of the session that collected the kernel (rootdir, pythonpath ini,
    # conftest insertions, src/ layout), added to the worker's so it imports the same modules.
    sys_path: tuple[str, ...] = ()
    # The project view (`project_view.py`): the files whose imports define what a candidate
    # sees of the project (the test file that marks the kernel), the data patterns the
    # project names (`kernelpro_sandbox_data`) and the directory they are relative to.
    view_entries: tuple[str, ...] = ()
    sandbox_data: tuple[str, ...] = ()
    rootdir: str | None = None

    def __post_init__(self) -> None:
        if self.shape_check not in ("auto", "variants", "off"):
            raise KernelproError(
                f"Invalid shape_check={self.shape_check!r} for task {self.name!r}: use "
                "'auto', 'variants' or 'off'."
            )
        if self.device not in ("auto", "cuda", "cpu") and not self.device.startswith("cuda:"):
            raise KernelproError(
                f"Invalid device={self.device!r} for task {self.name!r}: use 'auto', 'cuda', "
                "'cuda:N' or 'cpu'."
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> KernelBenchTask:
        """A task from a KernelBench problem file."""
        source = Path(path).read_text(encoding="utf-8")
        return cls(reference=source, name=options.pop("name", Path(path).stem), **options)


def _default_memory_mb() -> int | None:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return max(1024, total // (2 * 1024 * 1024))


@dataclass(frozen=True)
class SandboxLimits:
    """Process limits of one evaluation."""

    build_timeout_s: float = 300.0  # start, imports, reference, candidate build (load_inline)
    run_timeout_s: float = 120.0  # correctness, checks, timing
    # Resident memory of each sandboxed process (the worker with the outputs it handed over, the
    # judge), on its own (`supervise.over_memory_limit`): half of the machine's by default.
    memory_limit_mb: int | None = field(default_factory=_default_memory_mb)
    python: str = sys.executable
    extensions_dir: str | None = None  # TORCH_EXTENSIONS_DIR shared by workers (build cache)
    keep_env: tuple[str, ...] = ()  # extra variable names to pass (never secret-looking ones)
    log_chars: int = 20_000  # tail of the worker's stdout/stderr kept in the evaluation
    # The candidate's scratch directory (on the session's disk): the worker is killed when
    # it holds more than this, and no single file it writes may pass it (RLIMIT_FSIZE, in
    # the namespaces). Its stdout and stderr files count too.
    scratch_limit_mb: int = 16_384
    keep_workdirs: bool = False  # leave each candidate's directory behind (debugging)
    # "auto": Linux namespaces where the machine allows them, else the weaker fallback (the
    # evaluation's metrics["sandbox"] says which); "namespaces": refuse the fallback.
    isolation: str = "auto"
    # Decide correctness and the reference's time in a trusted process (judge.py) for every
    # candidate that claims to be correct. Off only for tests of the worker itself.
    judge: bool = True
    # `confirm()`: a re-timed median above this many times the search's median disqualifies.
    # None: by device (`search.confirm`: 1.25 on a GPU, 3.0 on a loaded CPU).
    confirm_tolerance: float | None = None
    # Fast-path builds (pytest_kernelpro.optimize.build): the cache the evaluator builds into (the
    # worker only reads it) and how many candidates compile at once.
    build_cache_dir: str | None = None  # default: $KERNELPRO_BUILD_CACHE or ~/.cache/...
    build_jobs: int | None = None  # default: min(8, CPU count)
    # Worker and judge processes started ahead inside the sandbox, torch imported, each
    # handed one task (`pool.py`): how many of each kind wait; 0: every process starts when
    # its task does. The search keeps 1 (the next worker and the next judge).
    standby: int = 0
    # The checked outputs a worker hands the judge (`handles.py`: five calls' outputs in
    # sealed shared memory the session holds until the judge has run): the worker is killed
    # when it hands over more. They count against `memory_limit_mb` too.
    outputs_limit_mb: int = 65_536
    # Processes and threads of the sandbox (RLIMIT_NPROC inside; the parent also counts the
    # processes of the tree and kills it past this: root on the host is exempt from the
    # rlimit) and the descriptors one process may hold (RLIMIT_NOFILE).
    max_processes: int = 512
    max_open_files: int = 4096
