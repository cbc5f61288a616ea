"""Profile one search candidate on the GPU exactly like a user's kernel item (child program).

`python -m pytest_kernelpro.optimize.candidate_profile.child SPEC.json` where the spec is

    {"problem_file": ".../candidate_problem.py", "device": "cuda", "timeout_s": 120,
     "facts": {...RooflineFacts...}, "output": ".../analysis.json", "timeline_runs": 5,
     "max_launches": 8, "ncu_catalog": ".../ncu-metrics.txt" (optional)}

`problem_file` is a KernelBench-format file: the reference (`class Model`, `get_inputs`,
`get_init_inputs`) followed by the candidate's module (`class ModelNew`). This program builds
the candidate under `capture_extensions` (load_inline builds: the `.so` files) and reads the
cubins of its `load_cuda` fast-path builds; their `__global__` entry points are what ncu
profiles and their SASS is read, then calls `analysis.profile_and_analyze` (timeline, ncu of its own
kernels with the curated and tool-declared metrics) and writes `Analysis.to_dict()` to
`output`. It runs candidate code, so the parent starts it with the sandbox's scrubbed
environment, in its own session, under a time limit.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_BAD_SPEC = 2
EXIT_FAILED = 3


def combined_problem(reference_source: str, candidate_code: str) -> str:
    """The KernelBench-format file the profiler loads: reference first, then the candidate."""
    return (
        reference_source.rstrip()
        + "\n\n\n# ---- candidate (kernelpro optimize) ----\n"
        + candidate_code.rstrip()
        + "\n"
    )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, profile and analyze the candidate of `spec`; the Analysis dict."""
    from pytest_kernelpro.analysis.core import RooflineFacts, profile_and_analyze
    from pytest_kernelpro.optimize.build.extension import cached_extension_builds
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.problem.kernelbench import import_file
    from pytest_kernelpro.profile.capture import DEFAULT_CUDA_FLAGS, capture_extensions

    problem_file = str(spec["problem_file"])
    started = time.perf_counter()
    # load_inline through the build cache, as in the sandbox worker: the same entry, no rebuild.
    with capture_extensions(DEFAULT_CUDA_FLAGS) as capture, cached_extension_builds():
        module = import_file(problem_file, "kernelpro_profiled_candidate")
        model_new = getattr(module, "ModelNew", None)
        if model_new is None:
            raise RuntimeError("the candidate defines no class ModelNew")
        # Builds done in __init__ (a lazily compiled extension) count too.
        init = list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
        model_new(*init)
    build_s = time.perf_counter() - started
    ptxas = [p for b in capture.builds for p in b.ptxas]
    binaries = list(capture.so_paths) + _fast_path_cubins()
    facts = RooflineFacts(**dict(spec.get("facts") or {}))
    phases: dict[str, float] = {"build": build_s}
    catalog = None
    if spec.get("ncu_catalog"):  # the search's process asked ncu once for this chip's metrics
        catalog = Path(str(spec["ncu_catalog"])).read_text(encoding="utf-8").split()
    analysis = profile_and_analyze(
        ProblemLocator(problem_file, "ModelNew"),
        facts,
        so_paths=binaries,
        ptxas=ptxas,
        device=str(spec.get("device", "cuda")),
        timeout_s=float(spec.get("timeout_s", 120.0)),
        ncu_path=spec.get("ncu_path"),
        timeline_runs=int(spec.get("timeline_runs", 5)),
        max_launches=int(spec.get("max_launches", 8)),
        # This child already started the interpreter, CUDA and the candidate: the kineto
        # run reuses them instead of starting another process.
        timeline_in_process=bool(spec.get("timeline_in_process", True)),
        ncu_catalog=catalog,
        phases=phases,
        cubins_since=None if spec.get("cubins_since") is None else float(spec["cubins_since"]),
    )
    phases["analysis"] = analysis.analysis_s
    analysis.extra["build_s"] = build_s
    analysis.extra["phases"] = {k: round(v, 3) for k, v in phases.items()}
    analysis.extra["binaries"] = binaries
    return analysis.to_dict()


def _fast_path_cubins() -> list[str]:
    """Cubins the candidate built through `pytest_kernelpro.optimize.build.load_cuda` (no `.so`):
    cuobjdump reads their entry points and SASS the same way."""
    try:
        from pytest_kernelpro.optimize.build.api import build_records
    except ImportError:
        return []
    return [str(r["cubin"]) for r in build_records() if r.get("cubin")]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: 0 on success (output written), 2 on a bad spec, 3 when profiling failed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write(
            "usage: python -m pytest_kernelpro.optimize.candidate_profile.child SPEC.json\n"
        )
        return EXIT_BAD_SPEC
    try:
        spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        output = Path(spec["output"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"kernelpro candidate profiler: bad spec {args[0]!r}: {exc}\n")
        return EXIT_BAD_SPEC
    try:
        result = run(spec)
    except Exception as exc:  # the parent reports it as "profile not collected"
        sys.stderr.write(f"kernelpro candidate profiler: {type(exc).__name__}: {exc}\n")
        return EXIT_FAILED
    from pytest_kernelpro.fileio import atomic_write_json

    atomic_write_json(output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
