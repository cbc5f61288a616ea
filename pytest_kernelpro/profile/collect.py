"""Profile one kernel item: its own kernels' ncu metrics, SASS, ptxas, linkage and timeline.

Order of work (`profile_kernel_item`):
1. static analysis of the captured `.so` files, which needs no GPU: `cuobjdump -symbols`
   (kernel entry points), `--dump-sass` (instruction classes), `readelf`/`nm` (linkage);
2. a timeline of N runs in a child process (`target.py`, kineto; nsys when it works);
3. kernel selection: the entry points that the timeline saw run; with no module of its own
   (PyTorch, Triton, cuBLAS-backed), the kernels that take most of the time;
4. one ncu invocation over the selected kernels inside the `kernelpro/` NVTX range;
5. one `KernelProfile` per kernel, joining names across tools by mangled name first and by
   bare function name second.

Every part that cannot run leaves a `NotCollected` entry; nothing here raises for a missing
or refused profiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.profile.capture import DEFAULT_CUDA_FLAGS
from pytest_kernelpro.profile.linkage import (
    linkage_from_kernel_names,
    merge_linkage,
    read_linkage,
)
from pytest_kernelpro.profile.model import (
    KernelMetrics,
    KernelProfile,
    NotCollected,
    ProfileReport,
    PtxasReport,
    SassSummary,
)
from pytest_kernelpro.profile.ncu import KernelSelector, NcuRequest, arch_from_cc, run_ncu
from pytest_kernelpro.profile.ncu_csv import first_launch_per_kernel
from pytest_kernelpro.profile.ptxas import ptxas_by_function
from pytest_kernelpro.profile.render import render_profile_section
from pytest_kernelpro.profile.sass import sass_of_module
from pytest_kernelpro.profile.symbols import (
    demangle,
    entry_points,
    kernel_base_name,
    read_module_symbols,
)
from pytest_kernelpro.profile.timeline import (
    dominant_kernels,
    kernel_time_by_name,
    nsys_status,
    nsys_timeline,
    summarize_events,
)
from pytest_kernelpro.profile.triton_cubins import (
    attach_triton_sass,
    private_triton_cache,
    triton_cache_dir,
)

__all__ = ["profile_kernel_item", "render_profile_section", "select_kernels"]


@dataclass
class _ModuleScan:
    """What the static tools found in the captured modules."""

    entries: list[str] = field(default_factory=list)  # mangled, in module order
    sass: dict[str, SassSummary] = field(default_factory=dict)
    not_collected: list[NotCollected] = field(default_factory=list)


# nsys that fails once (it could not make reports on the H200 machine) is not retried for
# every item of the session; kineto's timeline stands in.
_NSYS_FAILED: str | None = None


def _remember_nsys_failure(why: str) -> None:
    global _NSYS_FAILED
    _NSYS_FAILED = why


def _gpu_problem(device: str) -> str | None:
    if not str(device).startswith("cuda"):
        return f"device is {device!r}, not a CUDA device"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def _scan_modules(so_paths: Sequence[str]) -> _ModuleScan:
    scan = _ModuleScan()
    for so in so_paths:
        symbols = read_module_symbols(so)
        if isinstance(symbols, NotCollected):
            scan.not_collected.append(symbols)
        else:
            scan.entries += [e for e in entry_points(symbols) if e not in scan.entries]
        sass = sass_of_module(so)
        if isinstance(sass, NotCollected):
            scan.not_collected.append(sass)
        else:
            scan.sass.update(sass)
    return scan


def select_kernels(
    entries: Sequence[str], observed_times: dict[str, float] | None
) -> tuple[KernelSelector | None, bool]:
    """(selector, fell_back): the item's own entry points that ran, else the longest kernels.

    `observed_times` is the kineto kernel time per (demangled) name, None without a trace.
    """
    by_base = {kernel_base_name(e): e for e in entries}
    if observed_times:
        own = [by_base[b] for b in (kernel_base_name(n) for n in observed_times) if b in by_base]
        if own:
            return KernelSelector(tuple(dict.fromkeys(own)), "mangled"), False
        longest = dominant_kernels(observed_times)
        names = tuple(dict.fromkeys(kernel_base_name(n) for n in longest))
        return KernelSelector(names, "function"), bool(entries)
    if entries:
        return KernelSelector(tuple(entries), "mangled"), False
    return None, False


def _spec(locator: Any, device: str, mode: str, **extra: Any) -> dict[str, Any]:
    from pytest_kernelpro.profile.problem_loader import project_import_path

    return {
        # The session's import path (a `pythonpath` ini, a src/ layout): without it the
        # target cannot import a kernel module that imports the project's package.
        "sys_path": project_import_path(),
        "problem_file": str(getattr(locator, "path", "")),
        "qualname": str(getattr(locator, "qualname", "")),
        "shape_index": getattr(locator, "shape_index", None),
        "device": device,
        "mode": mode,
        **extra,
    }


def _run_timeline_child(
    python: str, spec_path: str, output: str, timeout_s: float
) -> list[dict[str, Any]] | NotCollected:
    command = [python, "-m", "pytest_kernelpro.profile.target", spec_path]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return NotCollected("timeline", f"the kineto run timed out after {timeout_s:.0f} s")
    if completed.returncode != 0 or not os.path.exists(output):
        tail = " | ".join(completed.stderr.strip().splitlines()[-3:])[:500]
        return NotCollected("timeline", f"the kineto run failed ({completed.returncode}): {tail}")
    with open(output, encoding="utf-8") as handle:
        payload = json.load(handle)
    if "not_collected" in payload:
        return NotCollected("timeline", str(payload["not_collected"]))
    return list(payload.get("events", []))


def _timeline_here(spec_path: str, output: str) -> list[dict[str, Any]] | NotCollected:
    """The timeline child's work (`profile.target`, mode "timeline") in this process."""
    from pytest_kernelpro.profile.target import load_spec, run_spec

    try:
        run_spec(load_spec(spec_path))
        with open(output, encoding="utf-8") as handle:
            payload = json.load(handle)
    except Exception as exc:  # the problem's failure is the timeline's reason, as in the child
        return NotCollected("timeline", f"the kineto run failed: {type(exc).__name__}: {exc}")
    if "not_collected" in payload:
        return NotCollected("timeline", str(payload["not_collected"]))
    return list(payload.get("events", []))


def _match_launch(name: str, launches: dict[str, KernelMetrics]) -> KernelMetrics | None:
    if name in launches:
        return launches[name]
    base = kernel_base_name(name)
    for launch_name, launch in launches.items():
        if kernel_base_name(launch_name) == base:
            return launch
    return None


def profile_kernel_item(
    locator: Any,
    *,
    so_paths: Sequence[str] = (),
    device: str = "cuda",
    metrics: Sequence[str] | None = None,
    timeout_s: float = 300.0,
    ncu_path: str | None = None,
    ptxas: Iterable[PtxasReport] = (),
    timeline_runs: int = 10,
    max_launches: int = 32,
    extra_cuda_cflags: Sequence[str] = DEFAULT_CUDA_FLAGS,
    python: str | None = None,
    timeline_in_process: bool = False,
    ncu_catalog: Iterable[str] | None = None,
    phases: dict[str, float] | None = None,
    cubins_since: float | None = None,
) -> ProfileReport:
    """Profile the kernel item at `locator` (a `ProblemLocator`: path, qualname, shape_index).

    `so_paths` and `ptxas` come from `capture_extensions` around the item's run; `metrics`
    defaults to the curated counters. Profilers that are missing or refused are reported in
    `ProfileReport.not_collected`; `wall_s` is the time this call took.

    `timeline_in_process`: take the kineto timeline in this process instead of a child (for
    a caller that is itself a disposable child that has already imported torch and the
    kernel, like the search's candidate profiler: one interpreter start and CUDA context
    fewer per candidate).

    `ncu_catalog`: the metric names `ncu --query-metrics` lists, when the caller knows them
    (the search's process asks once and hands them to each candidate's profiler child).
    `phases`, when given, is filled with the seconds each part took (static, timeline,
    ncu_query, ncu) and the ncu attempts: the profile's cost, shown per candidate.

    Kernels without a captured module take their SASS from Triton cubins (`triton_cubins`).
    By default the profile's runs get a private Triton cache, so the cubins read are the ones
    they compiled (a kernel cached by an earlier session, or compiled for another shape under
    the same name, is never read). `cubins_since` (seconds since the epoch) is for a caller
    whose own Triton cache is already private to this code (the search's candidate profiler,
    0.0): the runs use this process's cache and its cubins written since then are read.
    """
    started = time.perf_counter()
    phases = {} if phases is None else phases
    report = ProfileReport()
    python = python or sys.executable
    scan = _scan_modules(list(dict.fromkeys(so_paths)))
    report.not_collected += scan.not_collected
    linkages = [read_linkage(so) for so in dict.fromkeys(so_paths)]
    report.not_collected += [lk for lk in linkages if isinstance(lk, NotCollected)]
    module_linkage = merge_linkage(*(lk for lk in linkages if not isinstance(lk, NotCollected)))
    ptxas_map = ptxas_by_function(ptxas)
    phases["static"] = time.perf_counter() - started

    gpu_problem = _gpu_problem(device)
    private_cache: tempfile.TemporaryDirectory[str] | None = None
    cubins_dir: Path | None = None
    ncu_kernels: list[KernelMetrics] = []
    selector: KernelSelector | None = None
    observed: dict[str, float] | None = None
    if gpu_problem is not None:
        report.not_collected.append(NotCollected("ncu", gpu_problem))
        report.not_collected.append(NotCollected("timeline", gpu_problem))
        selector, _ = select_kernels(scan.entries, None)
    else:
        flags = list(extra_cuda_cflags)
        flags_spec: dict[str, Any] = {}
        if cubins_since is None:
            # Outlives the runs' scratch below: the cubins are read once the kernels are known.
            # (Removed by its finalizer should anything between raise.)
            private_cache = tempfile.TemporaryDirectory(prefix="kernelpro-triton-cache-")
            cubins_dir = private_triton_cache(Path(private_cache.name), triton_cache_dir())
            flags_spec["triton_cache_dir"] = str(cubins_dir)
        with tempfile.TemporaryDirectory(prefix="kernelpro-profile-") as tmp:
            events_path = os.path.join(tmp, "events.json")
            timeline_spec = os.path.join(tmp, "timeline.json")
            atomic_write_json(
                timeline_spec,
                _spec(
                    locator,
                    device,
                    "timeline",
                    runs=timeline_runs,
                    output=events_path,
                    extra_cuda_cflags=flags,
                    **flags_spec,
                ),
            )
            timeline_started = time.perf_counter()
            if timeline_in_process:
                events = _timeline_here(timeline_spec, events_path)
            else:
                events = _run_timeline_child(python, timeline_spec, events_path, timeout_s)
            phases["timeline"] = time.perf_counter() - timeline_started
            if isinstance(events, NotCollected):
                report.not_collected.append(events)
            else:
                observed = kernel_time_by_name(events)
                report.timeline = summarize_events(events, source="kineto")
                nsys_problem = nsys_status() or _NSYS_FAILED
                if nsys_problem is not None:
                    report.not_collected.append(
                        NotCollected("nsys", f"{nsys_problem}; the timeline comes from kineto")
                    )
                else:
                    nsys_spec = os.path.join(tmp, "nsys.json")
                    atomic_write_json(
                        nsys_spec,
                        _spec(
                            locator,
                            device,
                            "nsys",
                            runs=timeline_runs,
                            extra_cuda_cflags=flags,
                            **flags_spec,
                        ),
                    )
                    nsys = nsys_timeline(
                        [python, "-m", "pytest_kernelpro.profile.target", nsys_spec],
                        timeout_s=timeout_s,
                    )
                    if isinstance(nsys, NotCollected):
                        _remember_nsys_failure(nsys.why)
                        report.not_collected.append(nsys)
                    else:
                        report.timeline = nsys
            selector, fell_back = select_kernels(scan.entries, observed)
            if fell_back and selector is not None:
                report.not_collected.append(
                    NotCollected(
                        "own-kernels",
                        "none of the captured modules' kernels ran; profiled the longest "
                        "kernels instead: " + ", ".join(selector.names),
                    )
                )
            ncu_spec = os.path.join(tmp, "ncu.json")
            atomic_write_json(
                ncu_spec, _spec(locator, device, "ncu", extra_cuda_cflags=flags, **flags_spec)
            )
            request = NcuRequest(
                target_command=(python, "-m", "pytest_kernelpro.profile.target", ncu_spec),
                kernels=selector,
                timeout_s=timeout_s,
                launch_count=max_launches,
                **({} if metrics is None else {"metrics": tuple(metrics)}),
            )
            catalog = None if ncu_catalog is None else frozenset(ncu_catalog)
            ncu_result = run_ncu(request, ncu_path=ncu_path, catalog=catalog or None)
            phases["ncu_query"] = ncu_result.query_s
            phases["ncu"] = ncu_result.wall_s - ncu_result.query_s
            phases["ncu_attempts"] = float(ncu_result.attempts)
            report.not_collected += ncu_result.not_collected
            if ncu_result.dropped_metrics:
                report.not_collected.append(
                    NotCollected(
                        "ncu-metrics",
                        f"{len(ncu_result.dropped_metrics)} metrics this chip or ncu lacks were "
                        "dropped: " + ", ".join(ncu_result.dropped_metrics),
                    )
                )
            ncu_kernels = ncu_result.kernels
            report.arch = arch_from_cc(ncu_result.compute_capability)

    launches = first_launch_per_kernel(ncu_kernels)
    own = list(selector.names) if selector is not None and selector.base == "mangled" else []
    display = demangle([*own, *launches])
    used_launches: set[str] = set()
    for mangled in own:
        launch = _match_launch(mangled, launches)
        if launch is not None:
            used_launches.add(launch.kernel_name)
        report.kernels.append(
            KernelProfile(
                name=display.get(mangled, mangled),
                metrics=launch,
                sass=scan.sass.get(mangled),
                ptxas=ptxas_map.get(mangled),
            )
        )
    for name, launch in launches.items():
        if name not in used_launches:
            report.kernels.append(KernelProfile(name=display.get(name, name), metrics=launch))

    if private_cache is not None:
        attach_triton_sass(
            report, since=0.0, cache_dir=cubins_dir, same_entries_in=triton_cache_dir()
        )
        private_cache.cleanup()
    elif gpu_problem is None:
        attach_triton_sass(report, since=cubins_since or 0.0)

    names_seen = list(observed or {}) + list(launches)
    report.linkage = merge_linkage(
        module_linkage, linkage_from_kernel_names(names_seen) if names_seen else None
    )
    if report.arch is None:
        report.arch = next((p.arch for p in ptxas_map.values() if p.arch), None)
    report.wall_s = time.perf_counter() - started
    return report
