"""The optimize loop of one kernel item, composed: what `--kernelpro-optimize` runs.

1. The problem as the user wrote it (`agents.problem_context`): the reference's source, the
   current kernel and the implementation module it calls, the inputs actually used.
2. The user's current kernel is evaluated in the same sandbox as every candidate; its
   speedup over the reference is the bar a candidate must clear.
3. The Benchmarking Agent, once: the record's roofline plus an ncu validation of the
   reference's class (the reference profiled like a candidate), as the ReferenceAnalysis of
   every prompt.
4. The evaluator chain: sandbox (build, check, time) -> CUTLASS constraint precheck ->
   `analysis.ProfilingEvaluator` (every correct candidate profiled: ncu of its own kernels,
   SASS, timeline, Stage 1, every relevant tool).
5. The Programmer Agent generates, MCTS or greedy (`--kernelpro-search`) selects.
6. The end: the top candidates re-measured against the current kernel, interleaved
   (`search.remeasure`), and ranked with the gate's rule (`search.ranking`).

Returns a `SearchRanking` plus the search's details for the report. Every part that needs a
GPU says so when it cannot run and the loop goes on without it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.run.search_clock import (  # re-exported: their home before the split
    TimedEvaluator,
    TimedGenerator,
    WallClock,
)
from pytest_kernelpro.run.shims import (
    REFERENCE_AS_CANDIDATE,
    current_is_reference,
    current_kernel_code,
    kernelbench_source,
)

if TYPE_CHECKING:
    from pytest_kernelpro.agents.problem_context import ProblemContext
    from pytest_kernelpro.run.context import ItemRun, Services
    from pytest_kernelpro.search.ranking import SearchRanking
    from pytest_kernelpro.search.tree import SearchNode, SearchResult

REMEASURE_ROUNDS = 5


def problem_context(
    run: ItemRun, device: str, sandbox_source: str, rootpath: Path
) -> ProblemContext:
    """The ProblemContext of a kernel item, from its live objects in this process (the marked
    kernel found in `run.module`, the test module pytest imported)."""
    import inspect

    from pytest_kernelpro.agents.problem_context import build_context
    from pytest_kernelpro.problem import MarkerOptions, lookup_qualname, marker_of

    problem = run.problem
    if problem.kind == "kernelbench":
        from pytest_kernelpro.agents.problem_context import ProblemContext, SourcePart

        return ProblemContext(
            name=problem.display_name,
            reference=SourcePart("The KernelBench problem", problem.source_file, sandbox_source),
        )
    kernel = lookup_qualname(run.module, run.locator.qualname)
    mark = marker_of(kernel) if kernel is not None else None
    if mark is None:
        raise KernelproError(
            f"cannot find the marked kernel {run.locator.qualname} in {run.locator.path}"
        )
    options = MarkerOptions.from_marker(mark.args, dict(mark.kwargs), kernel_name=run.name)
    inputs = problem.make_inputs(device, 0)
    reference_module = None
    if inspect.isclass(options.reference):
        reference_module = problem.reference_factory("cpu")
    init = options.init_inputs() if callable(options.init_inputs) else options.init_inputs
    context = build_context(
        problem.display_name,
        options.reference,
        kernel=kernel,
        inputs=inputs,
        init_args=tuple(init or ()),
        reference_module=reference_module,
        device=device,
        sandbox_source=sandbox_source,
        root=str(rootpath),
    )
    del inputs
    return context


def guidance_chain(node: SearchNode) -> tuple[str, ...]:
    """The profiler guidance each optimize prompt on the way to `node` carried (root first):
    the guidance of every correct ancestor whose child on this path was an optimization."""
    out = []
    for step in node.path()[1:]:
        parent = step.parent
        if step.mode == "optimize" and parent is not None and parent.evaluation is not None:
            metrics = parent.evaluation.metrics
            out.append(str(metrics.get("guidance_md") or metrics.get("raw_guidance_md") or ""))
    return tuple(out)


def ranked_candidates(result: SearchResult) -> list[Any]:
    """Every correct node of the search as a `RankedCandidate` (not re-measured yet)."""
    from pytest_kernelpro.search.ranking import RankedCandidate

    out = []
    for node in result.nodes:
        if node.speedup is None or node.candidate is None:
            continue
        profile = (node.evaluation.metrics.get("profile") or {}) if node.evaluation else {}
        out.append(
            RankedCandidate(
                node_id=node.id,
                code=node.candidate.code,
                strategy=node.candidate.strategy,
                mode=str(node.mode or ""),
                depth=node.depth,
                lineage=tuple(n.id for n in node.path()[1:]),
                search_speedup=node.speedup,
                guidance=guidance_chain(node),
                profile_s=profile.get("profile_s"),
            )
        )
    return out


def final_ranking(
    kernel: str,
    result: SearchResult,
    *,
    sandbox_source: str,
    current_code: str,
    current_speedup: float | None,
    device: str,
    timing: dict[str, Any],
    threshold: float,
    env: dict[str, str] | None,
    clock: WallClock,
    atol: float | None = None,
    rtol: float | None = None,
    rounds: int = REMEASURE_ROUNDS,
    timeout_s: float = 600.0,
    caches: Any = None,
    current_is_reference: bool = False,
    budget_s: float | None = None,
) -> SearchRanking:
    """Re-measure the contenders with the current kernel and the reference; rank them. The
    caller counts the whole of it as the wall split's `remeasure` (the statistics' imports
    and the contenders' builds are part of it). The rounds' timing is bounded by `budget_s`
    (None: `search.ranking.RANKING_BUDGET_S`); candidates far slower than the current kernel
    in the search are not re-measured (`search.ranking.drop_far_slower`); a current kernel
    that is the reference is timed once for both."""
    from pytest_kernelpro.search.ranking import (
        FAR_SLOWER,
        RANKING_BUDGET_S,
        SearchRanking,
        drop_far_slower,
        pick_contenders,
        rank,
    )
    from pytest_kernelpro.search.remeasure import remeasure

    search = {
        "evaluations": result.evaluations,
        "stop_reason": result.stop_reason,
        "usd": result.usd,
    }
    candidates = ranked_candidates(result)
    if not candidates:
        return SearchRanking(
            kernel=kernel,
            status="no correct candidate",
            reason="the search produced no correct candidate; the current kernel stays",
            **search,
            wall_s=clock.totals(),
        )
    picked = pick_contenders(candidates, current_speedup=current_speedup)
    # The bar is the current kernel's speed in the sandbox, the reference's where unknown.
    bar = "current kernel" if current_speedup else "reference"
    # The 2x margin rests on the GPU's spread between processes (14% at most on the H200); a
    # shared CPU's single measurements swing by more than that, so there every pick is
    # re-measured (CPU kernels are cheap to time).
    far_slower = FAR_SLOWER if device.startswith("cuda") else 0.0
    contenders, dropped = drop_far_slower(
        picked, current_speedup=current_speedup, baseline=bar, ratio=far_slower
    )
    chosen = {c.node_id for c in picked}
    others = dropped + [c for c in candidates if c.node_id not in chosen]
    if not contenders:
        return SearchRanking(
            kernel=kernel,
            status="no improvement found",
            reason=(
                f"every correct candidate was far slower than the {bar} in the search "
                f"({dropped[0].reason}); none re-measured, the current kernel stays"
            ),
            candidates=tuple(others),
            **search,
            wall_s=clock.totals(),
        )
    entries = [("current", current_code)]
    if not current_is_reference:
        entries.append(("reference", REFERENCE_AS_CANDIDATE))
    entries += [(f"node{c.node_id}", c.code) for c in contenders]
    measured = remeasure(
        sandbox_source,
        entries,
        device=device,
        rounds=rounds,
        timing=timing,
        env=env,
        timeout_s=timeout_s,
        atol=atol,
        rtol=rtol,
        caches=caches,
        budget_s=RANKING_BUDGET_S if budget_s is None else budget_s,
    )
    baseline, base_label = "current", "current kernel"
    if "current" not in measured.samples:
        baseline, base_label = "reference", "reference"
    if baseline not in measured.samples:
        return SearchRanking.not_run(
            kernel,
            "the final re-measurement failed for both the current kernel and the reference: "
            + "; ".join(f"{k}: {v}" for k, v in measured.errors.items()),
            **search,
            wall_s=clock.totals(),
        )
    ranking = rank(
        kernel,
        [(c, measured.samples.get(f"node{c.node_id}", [])) for c in contenders],
        measured.samples[baseline],
        rounds=measured.rounds,
        reference_samples=measured.samples.get(
            "current" if current_is_reference else "reference", []
        ),
        others=others,
        threshold=threshold,
        device=measured.device,
        baseline=base_label,
        **search,
        wall_s=clock.totals(),
        cost=measured.cost(),
    )
    return ranking


def confirm_winner(ranking: Any, result: Any, sandbox: Any) -> tuple[Any, dict[str, Any]]:
    """The winner's time once more, in a fresh sandboxed worker whose clocks its code cannot
    patch (`SandboxEvaluator.confirm`); a time that does not hold up takes the win away."""
    import dataclasses

    winner = ranking.winner
    if winner is None:
        return ranking, {"status": "no winner to confirm"}
    node = next((n for n in result.nodes if n.id == winner.node_id), None)
    if node is None or node.evaluation is None:
        return ranking, {"status": "winner not found in the search"}
    confirmed = sandbox.confirm(node.candidate, node.evaluation)
    if confirmed.status == "correct":
        return ranking, {"status": "confirmed", **dict(confirmed.timing.get("confirmed") or {})}
    reason = f"the winner (node {winner.node_id}) was disqualified: {confirmed.reason}"
    # Out of the ranking altogether, so no patch is written for it either.
    candidates = tuple(
        dataclasses.replace(c, rank=None, verdict="failed", reason=reason) if c is winner else c
        for c in ranking.candidates
    )
    return (
        dataclasses.replace(
            ranking, status="no improvement found", reason=reason, candidates=candidates
        ),
        {
            "status": "disqualified",
            "reason": confirmed.reason,
            **dict(confirmed.timing.get("confirmation") or {}),
        },
    )


def session_path() -> tuple[str, ...]:
    """The sys.path pytest built for this session (rootdir and conftest insertions, the
    `pythonpath` ini, a src/ layout): the sandbox imports the kernel's modules with it."""
    return tuple(p for p in sys.path if p)


def _project_path(entries: Sequence[str]) -> list[str]:
    """The entries of `entries` outside the interpreter's own (stdlib, site-packages)."""
    prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in entries:
        resolved = str(Path(entry).resolve())
        if not any(resolved.startswith(prefix) for prefix in prefixes):
            out.append(entry)
    return out


def run_search(
    run: ItemRun,
    services: Services,
    out_dir: Path,
    *,
    hooks: Any = None,
) -> tuple[SearchRanking, dict[str, Any]]:
    """The whole loop for one item (module doc); (ranking, details for the report).

    `hooks` (`optimize.SearchHooks`) is how the caller watches and steers the loop without
    this module knowing about run folders, progress displays or patches: the model backend,
    resume, the current kernel's check, wrappers of the generator and the evaluator, the
    phase of the loop."""
    from pytest_kernelpro.agents.llm.base import require_price
    from pytest_kernelpro.agents.llm.factory import make_backend
    from pytest_kernelpro.agents.profiling import ProfilingAgent
    from pytest_kernelpro.agents.programmer import ProgrammerAgent
    from pytest_kernelpro.analysis.core import RooflineFacts
    from pytest_kernelpro.analysis.evaluator import (
        CandidateProfiler,
        ProfileFailed,
        ProfilingEvaluator,
    )
    from pytest_kernelpro.gate.prompt_reference import reference_summary
    from pytest_kernelpro.search.base import Candidate, Evaluation
    from pytest_kernelpro.search.budget import parse_budget
    from pytest_kernelpro.search.evaluator import KernelBenchTask, SandboxEvaluator
    from pytest_kernelpro.search.greedy import GreedySearch
    from pytest_kernelpro.search.mcts import MCTS, MCTSConfig

    clock = WallClock()
    setup_started = time.perf_counter()
    settings, record, device = services.settings, run.record, run.device
    budget = parse_budget(settings.optimize or "", where="--kernelpro-optimize")
    options: dict[str, Any] = {}
    if settings.llm in ("anthropic", "openai"):
        options["model"] = settings.model
        if settings.llm_base_url:
            options["base_url"] = settings.llm_base_url
        if budget.max_usd is not None:
            # Before any call: a spend budget cannot be kept for a model without a price.
            require_price(settings.model, where=f"--kernelpro-optimize={settings.optimize}")
    out_dir.mkdir(parents=True, exist_ok=True)
    # The backend first: a missing key or package is said before any GPU time is spent.
    backend = hooks.backend(out_dir) if hooks is not None else None
    if backend is None:
        backend = make_backend(settings.llm, record_to=str(out_dir / "llm-calls.jsonl"), **options)
    sandbox_source = kernelbench_source(run, device)
    context = problem_context(run, device, sandbox_source, settings.rootpath)
    timing = {"max_time_s": settings.budget_for(device), "warmup_ms": settings.warmup_ms}
    task = KernelBenchTask(
        reference=sandbox_source,
        name=record.name,
        device=device,
        atol=run.problem.atol,
        rtol=run.problem.rtol,
        timing=timing,
        sys_path=session_path(),
    )
    sandbox = SandboxEvaluator(task)
    if hooks is not None:
        sandbox.on_phase = hooks.phase
    env = sandbox.environment()
    # The re-measurement workers import the current kernel too: the same project path.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH", ""), *_project_path(task.sys_path)) if p
    )

    # The user's current kernel, in the same sandbox as every candidate.
    current_code = current_kernel_code(run, sandbox_source)
    started = time.perf_counter()
    clock.setup += started - setup_started
    # Probed here (once per process, the CUDA verdict once per machine): shown apart.
    isolation = sandbox.isolation
    clock.sandbox_probe = time.perf_counter() - started
    started = time.perf_counter()
    current = sandbox.evaluate(Candidate(code=current_code, strategy="the current kernel"))
    clock.current_kernel = time.perf_counter() - started
    after_current = time.perf_counter()
    if hooks is not None:
        hooks.checked_current(current)  # e.g. stops before any model call if it cannot import
    details: dict[str, Any] = {
        "current": current.to_dict(),
        "sandbox": {
            "isolation": isolation.describe(),
            "verdict": isolation.verdict,
            "probe_s": clock.sandbox_probe,
        },
    }
    ref_s = current.metrics.get("ref_median_s")
    cur_s = current.metrics.get("candidate_median_s") if current.ok else None

    # The Benchmarking Agent: roofline + ncu validation of the reference's class.
    roofline = record.roofline.to_dict() if record.roofline else None
    facts = RooflineFacts.from_roofline(roofline, median_s=cur_s)
    profiler = None
    validation = None
    if device.startswith("cuda") and settings.feedback != "none":
        # In the candidates' sandbox (a mode, so that a Dask worker probes its own machine;
        # in this process the probe is the evaluator's, cached).
        profiler = CandidateProfiler(
            sandbox_source,
            facts,
            device=device,
            timeout_s=settings.profile_timeout_s,
            env=env,
            isolation=sandbox.limits.isolation,
            caches=sandbox.compile_caches,
        )
        if hooks is not None:
            hooks.phase("profiling")
        started = time.perf_counter()
        try:
            ref_eval = Evaluation(status="correct", metrics={"candidate_median_s": ref_s})
            ref_analysis = profiler(Candidate(code=REFERENCE_AS_CANDIDATE), ref_eval)
            validation = ref_analysis.get("stage1")
            details["reference_profile_s"] = time.perf_counter() - started
        except ProfileFailed as exc:
            details["reference_profile_error"] = str(exc)
        clock.reference_profile += time.perf_counter() - started
    reference_text = (
        reference_summary(
            record.roofline, reference_s=ref_s, current_s=cur_s, validation=validation
        )
        if record.roofline
        else None
    )

    device_name = record.device if device.startswith("cuda") else None
    agent = ProgrammerAgent(
        backend,
        problem_source=sandbox_source,
        problem_md=context.render(),
        language=run.problem.language,
        device_name=device_name,
        n_candidates=settings.candidates,
        max_tokens=settings.max_tokens,
        feedback=settings.feedback,
        profiling_agent=ProfilingAgent(backend) if settings.feedback == "tools" else None,
        reference_analysis=reference_text,
        orchestration=settings.orchestration,
    )
    evaluator: Any = sandbox
    remote = None
    on_worker = None
    if settings.dask:  # builds and evaluations on a Dask cluster (search/distributed.py)
        from functools import partial

        from pytest_kernelpro.search.distributed import open_evaluator

        if profiler is not None:  # profiled on the worker whose GPU timed it
            on_worker = partial(ProfilingEvaluator, profiler=profiler, feedback=settings.feedback)
            profiler = None
        remote = open_evaluator(
            settings.dask,
            task,
            sandbox.limits,
            local_isolation=sandbox.isolation.describe(),
            worker_chain=on_worker,
        )
        evaluator = remote
    if getattr(agent.gpu, "target", None):
        from pytest_kernelpro.cutlass.precheck import PrecheckEvaluator

        evaluator = PrecheckEvaluator(evaluator, arch=agent.gpu.target)
    profiling = None
    if profiler is not None:
        profiling = ProfilingEvaluator(evaluator, profiler, feedback=settings.feedback)
        if hooks is not None:
            profiling.on_phase = hooks.phase
        evaluator = profiling
    elif remote is not None and on_worker is not None:
        # Profiled on the workers: the profiles come back inside the evaluations, and this
        # keeps their records for the report (profiler None: nothing is profiled twice).
        profiling = ProfilingEvaluator(evaluator, None, feedback=settings.feedback)
        evaluator = profiling
    if settings.search == "greedy":
        algorithm: Any = GreedySearch(candidates_per_step=settings.candidates)
    else:
        algorithm = MCTS(MCTSConfig(candidates_per_expansion=settings.candidates))
    trajectory = out_dir / "trajectory.jsonl"
    generator: Any = TimedGenerator(agent, clock)
    watched: Any = TimedEvaluator(evaluator, clock)
    if hooks is not None:
        generator, watched = hooks.wrap(generator, watched)
        hooks.started(algorithm)
    # The agents, the evaluator chain (a Dask cluster's start) and the search: setup too.
    clock.setup += time.perf_counter() - after_current - clock.reference_profile
    try:
        result = algorithm.run(
            generator,
            watched,
            budget,
            trajectory=trajectory,
            resume=bool(hooks is not None and hooks.resume),
            meta={
                "kernel": record.name,
                "feedback": settings.feedback,
                "orchestration": settings.orchestration,
                "current_speedup": current.speedup,
                **({"dask": remote.describe()} if remote is not None else {}),
            },
            in_flight=remote.slots() if remote is not None else 1,
        )
    finally:
        if remote is not None:
            details["dask"] = remote.describe()
            remote.close()
    if hooks is not None:
        hooks.phase("ranking")
    started = time.perf_counter()
    ranking = final_ranking(
        record.name,
        result,
        sandbox_source=sandbox_source,
        current_code=current_code,
        current_speedup=current.speedup,
        device=device,
        timing=timing,
        threshold=record.threshold,
        env=env,
        clock=clock,
        atol=run.problem.atol,
        rtol=run.problem.rtol,
        caches=sandbox.compile_caches,
        current_is_reference=current_is_reference(run),
    )
    clock.remeasure += time.perf_counter() - started
    started = time.perf_counter()
    ranking, details["winner_confirmation"] = confirm_winner(ranking, result, sandbox)
    clock.confirm = time.perf_counter() - started
    caches = sandbox.compile_caches
    details["compile_caches"] = {"kept": len(caches.kept), "seeded": caches.seeded}
    caches.close()
    if current.metrics.get("sandbox_reprobe"):
        details["sandbox"]["reprobe"] = current.metrics["sandbox_reprobe"]
    ranking = replace(ranking, wall_s=clock.totals())  # the confirmation too
    details.update(
        trajectory=str(trajectory),
        algorithm=algorithm.name,
        profiles=[r.to_dict() for r in profiling.records] if profiling else [],
        per_candidate=clock.per_candidate,
        wall_s=clock.totals(),
        evaluation_other_s=clock.evaluation_other,
        replay_divergent=getattr(backend, "divergent", None),
    )
    return ranking, details
