"""The optimize loop of one kernel item, composed: what `--kernelpro-optimize` runs.

1. The problem as the user wrote it (`optimize_context.py`, `agents.problem_context`): the
   reference's source, the current kernel and the implementation module it calls, the
   inputs actually used.
2. The user's current kernel is evaluated in the same sandbox as every candidate; its
   speedup over the reference is the bar a candidate must clear.
3. The Benchmarking Agent, once: the record's roofline plus an ncu validation of the
   reference's class (the reference profiled like a candidate), as the ReferenceAnalysis of
   every prompt.
4. The evaluator chain: sandbox (build, check, time) -> CUTLASS constraint precheck ->
   `analysis.ProfilingEvaluator` (every correct candidate profiled: ncu of its own kernels,
   SASS, timeline, Stage 1, every relevant tool).
5. The Programmer Agent generates, MCTS or greedy (`--kernelpro-search`) selects.
6. The end (`optimize_ranking.py`): the top candidates re-measured against the current
   kernel, interleaved (`search.remeasure`), ranked with the gate's rule (`search.ranking`),
   and the winner confirmed in a fresh sandboxed worker.

Returns a `SearchRanking` plus the search's details for the report. Every part that needs a
GPU says so when it cannot run and the loop goes on without it.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pytest_kernelpro.optimize.loop.clock import TimedEvaluator, TimedGenerator, WallClock
from pytest_kernelpro.optimize.loop.problem_context import problem_context, session_path
from pytest_kernelpro.optimize.loop.ranking import confirm_winner, final_ranking
from pytest_kernelpro.optimize.loop.shims import (
    REFERENCE_AS_CANDIDATE,
    current_is_reference,
    current_kernel_code,
    kernelbench_source,
)
from pytest_kernelpro.profile.problem_loader import project_import_path

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.ranking import SearchRanking
    from pytest_kernelpro.run.context import ItemRun, Services


SEARCH_STANDBYS = 1  # sandboxed processes of each kind started ahead: the next worker and judge
# An evaluation checks and times a candidate as the gate checked and timed the current kernel,
# more than once over (trials, shapes, the timed outputs' checks): its run limit is this many
# times the gate's own time for the item, never under the sandbox's default: a fixed 120 s
# killed evaluations of a problem the gate took 52-193 s on
# (bench/results/2026-12-06-optimizer-memory9-cpu.md).
RUN_LIMIT_PER_GATE_TIME = 4.0


def run_limit_s(gate_wall_s: float) -> float:
    """The sandbox's run limit of one evaluation for an item the gate took `gate_wall_s` on
    (`RUN_LIMIT_PER_GATE_TIME`)."""
    from pytest_kernelpro.optimize.sandbox.task import SandboxLimits

    default = SandboxLimits.run_timeout_s
    return max(default, RUN_LIMIT_PER_GATE_TIME * gate_wall_s) if gate_wall_s > 0 else default


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
    from pytest_kernelpro.analysis.core import RooflineFacts
    from pytest_kernelpro.optimize.agents.llm.factory import make_backend
    from pytest_kernelpro.optimize.agents.llm.model_api import require_price
    from pytest_kernelpro.optimize.agents.profiling import ProfilingAgent
    from pytest_kernelpro.optimize.agents.programmer import ProgrammerAgent
    from pytest_kernelpro.optimize.agents.prompt_reference import reference_summary
    from pytest_kernelpro.optimize.candidate_profile.evaluator import (
        CandidateProfiler,
        ProfileFailed,
        ProfilingEvaluator,
    )
    from pytest_kernelpro.optimize.sandbox.evaluator import (
        KernelBenchTask,
        SandboxEvaluator,
        SandboxLimits,
    )
    from pytest_kernelpro.optimize.search.budget import parse_budget
    from pytest_kernelpro.optimize.search.greedy import GreedySearch
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
    from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig

    clock = WallClock()
    setup_started = time.perf_counter()
    settings, record, device = services.settings, run.record, run.device
    budget = parse_budget(settings.optimize or "", where="--kernelpro-optimize")
    options: dict[str, Any] = {}
    if settings.llm in ("anthropic", "openai"):
        options["model"] = settings.model
        if settings.llm_base_url:
            options["base_url"] = settings.llm_base_url
        options["prices"] = settings.model_prices()
        if budget.max_usd is not None:
            # Before any call: a spend budget cannot be kept for a model without a price.
            require_price(
                settings.model,
                options["prices"],
                where=f"--kernelpro-optimize={settings.optimize}",
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    # The backend first: a missing key or package is said before any GPU time is spent.
    backend = hooks.backend(out_dir) if hooks is not None else None
    if backend is None:
        backend = make_backend(settings.llm, record_to=str(out_dir / "llm-calls.jsonl"), **options)
    sandbox_source = kernelbench_source(run, device)
    context = problem_context(run, device, sandbox_source, settings.rootpath)
    timing: dict[str, Any] = {
        "max_time_s": settings.budget_for(device),
        "warmup_ms": settings.warmup_ms,
    }
    cpu_threads = None
    if device == "cpu":
        # The gate's CPU timing: its thread policy (one thread unless the user set more) and
        # its cache-flush mode, in the search, the re-measurement and the confirmation alike.
        from pytest_kernelpro.measure.timing.cpu_load import policy_threads

        cpu_threads = policy_threads(settings.cpu_threads)
        timing["cpu_flush"] = settings.cpu_flush
    task = KernelBenchTask(
        reference=sandbox_source,
        name=record.name,
        device=device,
        atol=run.problem.atol,
        rtol=run.problem.rtol,
        timing=timing,
        cpu_threads=cpu_threads,
        sys_path=session_path(),
        # What a candidate sees of the project (`sandbox.project_view`): the imports of
        # the file that marks the kernel, and the data files the ini names.
        view_entries=(str(Path(run.locator.path).resolve()),),
        sandbox_data=settings.sandbox_data,
        rootdir=str(settings.rootpath),
    )
    # The next worker and judge wait, torch imported, while the model writes a candidate.
    sandbox = SandboxEvaluator(
        task, SandboxLimits(standby=SEARCH_STANDBYS, run_timeout_s=run_limit_s(record.wall_s))
    )
    if hooks is not None:
        sandbox.on_phase = hooks.phase
    env = sandbox.environment()
    # The re-measurement workers import the current kernel too: the same project path.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH", ""), *project_import_path(task.sys_path)) if p
    )

    # The user's current kernel, in the same sandbox as every candidate.
    current_code = current_kernel_code(run, sandbox_source)
    started = time.perf_counter()
    clock.setup += started - setup_started
    # Probed here (once per process, the CUDA verdict once per machine): shown apart.
    isolation = sandbox.isolation
    clock.sandbox_probe = time.perf_counter() - started
    started = time.perf_counter()
    sandbox.standbys.fill()
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
    roofline = msgspec.to_builtins(record.roofline) if record.roofline else None
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
    if settings.dask:  # builds and evaluations on a Dask cluster (optimize/dask/dask_evaluator.py)
        from functools import partial

        from pytest_kernelpro.optimize.dask.dask_evaluator import open_evaluator

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
        from pytest_kernelpro.optimize.cutlass.precheck import PrecheckEvaluator

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
        details["standby"] = sandbox.standbys.describe()
        sandbox.standbys.close()  # none idle (importing) while the ranking times kernels
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
        cpu_threads=cpu_threads,
        truth=sandbox.search_truth(),  # the workers' checks take it: no float64 re-run each
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
