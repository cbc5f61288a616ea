"""Run Nsight Compute once over a kernel item's own kernels and parse the raw page.

The command (see `build_ncu_command`):

    ncu --csv --page raw --print-units base --clock-control none --target-processes all
        --metrics <counters> --kernel-name-base mangled -k regex:^(k1|k2)$
        --print-kernel-base mangled --nvtx --nvtx-include kernelpro/ [-s N] [-c N]
        python -m pytest_kernelpro.profile.target <spec>

Every failure becomes a `NotCollected` with the reason instead of an exception: no ncu
(PATH, `$CUDA_HOME/bin`, or `KERNELPRO_NCU`), no counter permission (ERR_NVGPUCTRPERM), no
kernel matched, a timeout (the whole process group is killed), the target failing. Metrics
that ncu rejects by name are dropped and the run is repeated once without them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_kernelpro.profile.binaries import find_tool, run_tool
from pytest_kernelpro.profile.metrics_catalog import (
    CURATED_METRICS,
    METRICS_BY_NAME,
    drop_unavailable,
    parse_query_metrics,
)
from pytest_kernelpro.profile.model import KernelMetrics, NotCollected
from pytest_kernelpro.profile.ncu_csv import parse_ncu_raw_table, unable_to_access_metrics

NCU_ENV_VAR = "KERNELPRO_NCU"
PERMISSION_URL = "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
# Always kept from the raw page besides the requested metrics: launch geometry.
_ALWAYS_KEEP = frozenset(
    {f"launch__{kind}_dim_{axis}" for kind in ("block", "grid") for axis in "xyz"}
    | {"device__attribute_display_name"}
)


@dataclass(frozen=True)
class KernelSelector:
    """Which kernels ncu profiles (`-k regex:`), and which name the regex is matched against.

    `base="mangled"` matches the exact symbols of a module (anchored); `base="function"`
    matches the bare function identifier (unanchored: Triton and library kernels whose
    only known name comes from a trace).
    """

    names: tuple[str, ...]
    base: str = "mangled"

    def regex(self) -> str:
        alternatives = "|".join(re.escape(n) for n in dict.fromkeys(self.names))
        return f"^({alternatives})$" if self.base == "mangled" else f"({alternatives})"


@dataclass(frozen=True)
class NcuRequest:
    """One ncu invocation over one target program."""

    target_command: tuple[str, ...]
    metrics: tuple[str, ...] = tuple(m.name for m in CURATED_METRICS if not m.implicit)
    kernels: KernelSelector | None = None
    nvtx_include: str | None = "kernelpro/"
    launch_skip: int = 0
    launch_count: int | None = None
    timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()


@dataclass
class NcuResult:
    """The parsed launches plus everything that was not collected and why."""

    kernels: list[KernelMetrics] = field(default_factory=list)
    not_collected: list[NotCollected] = field(default_factory=list)
    dropped_metrics: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    wall_s: float = 0.0
    compute_capability: str | None = None
    output_tail: str = ""
    stdout: str = ""  # the raw page as ncu printed it (for saving a capture)
    attempt_errors: tuple[str, ...] = ()  # ==ERROR== lines of attempts that were repeated
    query_s: float = 0.0  # `--query-metrics` in this call (0 when the catalog was known)
    attempts: int = 0  # ncu runs of the target (a second one after rejected metrics)


def find_ncu(ncu_path: str | None = None) -> str | None:
    """The ncu binary: an explicit path, `$KERNELPRO_NCU`, PATH, or the CUDA toolkit."""
    if ncu_path:
        return ncu_path if os.access(ncu_path, os.X_OK) else None
    return find_tool("ncu", env_var=NCU_ENV_VAR)


def build_ncu_command(ncu: str, request: NcuRequest) -> list[str]:
    """The full ncu command line for `request`."""
    command = [
        ncu,
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--clock-control",
        "none",
        "--target-processes",
        "all",
    ]
    if request.metrics:
        command += ["--metrics", ",".join(dict.fromkeys(request.metrics))]
    if request.kernels is not None and request.kernels.names:
        command += ["--kernel-name-base", request.kernels.base]
        command += ["-k", "regex:" + request.kernels.regex()]
        if request.kernels.base == "mangled":
            command += ["--print-kernel-base", "mangled"]
    if request.nvtx_include:
        command += ["--nvtx", "--nvtx-include", request.nvtx_include]
    if request.launch_skip:
        command += ["--launch-skip", str(request.launch_skip)]
    if request.launch_count is not None:
        command += ["--launch-count", str(request.launch_count)]
    command += list(request.extra_args)
    command += list(request.target_command)
    return command


@functools.lru_cache(maxsize=8)
def query_catalog(ncu: str, timeout_s: float = 120.0) -> frozenset[str] | None:
    """Base metric names this ncu offers on this machine's chip (`--query-metrics`), or None
    when the query fails (the run then relies on ncu rejecting unknown names)."""
    run = run_tool("ncu", [ncu, "--query-metrics"], timeout_s=timeout_s)
    if isinstance(run, NotCollected):
        return None
    names = parse_query_metrics(run.stdout)
    return names or None


def _run_process_group(command: Sequence[str], timeout_s: float) -> tuple[int | None, str, str]:
    """Run in a new session; on timeout kill the whole group (ncu and the python it launched).
    Returns (returncode or None on timeout, stdout, stderr)."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
        return None, stdout, stderr
    return process.returncode, stdout, stderr


def rejected_metrics(output: str, requested: Iterable[str]) -> list[str]:
    """Requested metric names that ncu's ==ERROR== lines complain about."""
    error_lines = [line for line in output.splitlines() if "==ERROR==" in line]
    if not error_lines:
        return []
    text = "\n".join(error_lines)
    names = []
    for name in requested:
        if re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) or re.search(
            rf"(?<![\w.]){re.escape(name.split('.', 1)[0])}(?![\w])", text
        ):
            names.append(name)
    return names


def _error_summary(output: str, limit: int = 3) -> str:
    lines = [ln.strip() for ln in output.splitlines() if "==ERROR==" in ln]
    if not lines:
        lines = [ln.strip() for ln in output.strip().splitlines()[-limit:]]
    return " | ".join(lines[:limit])[:600]


def diagnose(returncode: int | None, output: str, request: NcuRequest) -> NotCollected | None:
    """The NotCollected for an ncu run that produced no table, or None if nothing is wrong."""
    if "ERR_NVGPUCTRPERM" in output:
        return NotCollected(
            "ncu",
            "no permission to read GPU performance counters (ERR_NVGPUCTRPERM); run as root, "
            "or load the driver with NVreg_RestrictProfilingToAdminUsers=0; see " + PERMISSION_URL,
        )
    if "No kernels were profiled" in output:
        where = f" inside NVTX range {request.nvtx_include!r}" if request.nvtx_include else ""
        matched = (
            f"-k regex:{request.kernels.regex()} (by {request.kernels.base} name)"
            if request.kernels
            else "any kernel"
        )
        return NotCollected("ncu", f"no kernel matched {matched}{where}: ncu profiled nothing")
    if returncode not in (0, None):
        return NotCollected("ncu", f"ncu exited with {returncode}: {_error_summary(output)}")
    return None


def run_ncu(
    request: NcuRequest,
    *,
    ncu_path: str | None = None,
    catalog: frozenset[str] | None = None,
    query_catalog_first: bool = True,
) -> NcuResult:
    """Profile `request.target_command` with ncu; never raises for profiler problems."""
    started = time.perf_counter()
    result = NcuResult()
    ncu = find_ncu(ncu_path)
    if ncu is None:
        hint = f"{ncu_path} is not executable" if ncu_path else "ncu not found on PATH"
        result.not_collected.append(
            NotCollected("ncu", f"{hint}; install Nsight Compute or set {NCU_ENV_VAR}")
        )
        return result
    if catalog is None and query_catalog_first:
        asked = time.perf_counter()
        catalog = query_catalog(ncu)  # once per process (lru_cache)
        result.query_s = time.perf_counter() - asked
    metrics = list(request.metrics)
    dropped: list[str] = []
    if catalog is not None:
        metrics, dropped = drop_unavailable(metrics, catalog)
    for attempt in range(2):
        result.attempts = attempt + 1
        current = dataclasses.replace(request, metrics=tuple(metrics))
        command = build_ncu_command(ncu, current)
        result.command = tuple(command)
        try:
            returncode, stdout, stderr = _run_process_group(command, request.timeout_s)
        except OSError as exc:  # not executable, wrong architecture, ...
            result.not_collected.append(NotCollected("ncu", f"cannot run {ncu}: {exc}"))
            break
        output = stdout + "\n" + stderr
        result.output_tail = output[-4000:]
        result.stdout = stdout
        if returncode is None:
            result.not_collected.append(
                NotCollected(
                    "ncu",
                    f"ncu timed out after {request.timeout_s:.0f} s (killed); raise the profile "
                    "timeout or profile fewer metrics",
                )
            )
            break
        table = parse_ncu_raw_table(stdout)
        rejected = [] if table.rows else rejected_metrics(output, metrics)
        if rejected and attempt == 0:
            result.attempt_errors += tuple(
                line.strip() for line in output.splitlines() if "==ERROR==" in line
            )
            dropped += rejected
            metrics = [m for m in metrics if m not in rejected]
            continue
        problem = None if table.rows else diagnose(returncode, output, current)
        if problem is None and not table.rows:
            problem = NotCollected(
                "ncu", f"ncu wrote no raw-page table (exit {returncode}): {_error_summary(output)}"
            )
        if problem is not None:
            result.not_collected.append(problem)
            break
        expected = list(request.metrics) + [
            m.name for m in CURATED_METRICS if m.implicit and m.name in METRICS_BY_NAME
        ]
        inaccessible = set(unable_to_access_metrics(output))
        keep = set(expected) | _ALWAYS_KEEP
        present = set(table.metric_names)
        missing = tuple(n for n in dict.fromkeys(expected) if n not in present or n in inaccessible)
        for row in table.rows:
            kernel = row.metrics
            kernel.metrics = {k: v for k, v in kernel.metrics.items() if k in keep}
            kernel.missing = missing
            result.kernels.append(kernel)
        result.compute_capability = table.rows[0].compute_capability
        break
    result.dropped_metrics = tuple(dict.fromkeys(dropped))
    result.wall_s = time.perf_counter() - started
    return result


def arch_from_cc(cc: str | None) -> str | None:
    """Compute capability "9.0" -> arch "sm_90"."""
    if not cc:
        return None
    match = re.match(r"^\s*(\d+)[.,](\d+)", cc)
    return f"sm_{match.group(1)}{match.group(2)}" if match else None
