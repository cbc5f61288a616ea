"""What one kernel item does when it runs: check, time, roofline, profile, optimize, gate.

`run_kernel_item` is the entry (from `KernelItem.runtest`): the item's time limit, CPU thread
policy, GPU memory accounting and isolation around `_run`, which chooses the device, resolves
the item's settings once (`context.ItemSettings`) and calls the stages in order. Each stage is
a function of the item's `ItemRun` and the session's `Services` (`context.py`), filling its
part of the record: `check`, `time_item`, `roofline`, `profile`, `gate` (or `roofline_floor`
outside check mode); the optimize stage (`optimize.py`) is the one that takes the pytest
item, since the patch it writes is placed through the item's source.

Every failure becomes a `KernelproError` that names what went wrong and the fix, so one
bad kernel fails alone and the session goes on.
"""

from __future__ import annotations

import contextlib
import shlex
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import KernelproError
from ..record import CorrectnessPart, KernelRecord, RooflinePart, TimingPart, VerdictPart
from .context import ItemRun, ItemSettings

if TYPE_CHECKING:
    from .context import Services
    from .items import KernelItem
    from .session import KernelproSession


def _describe_exception(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def new_record(item: KernelItem) -> KernelRecord:
    problem = item.problem
    return KernelRecord(
        nodeid=item.nodeid,
        name=problem.display_name,
        kernel=problem.name,
        shape=problem.shape_id,
        language=problem.language,
    )


def run_kernel_item(item: KernelItem, session: KernelproSession, record: KernelRecord) -> None:
    """Run the item's stages, filling `record` as they go (the caller holds it already, so
    a failure or a hang still reports what was measured)."""
    from ..measure.gpu_memory import ItemMemory, is_out_of_memory
    from .limits import ItemTimeout

    started = time.perf_counter()
    settings = session.settings
    memory = ItemMemory(device="cpu")
    try:
        if settings.isolate and not settings.isolated_child:
            from .isolate import run_isolated

            run_isolated(item, session, record)
        else:
            _run_limited(item, session, record, memory)
        record.outcome = "passed"
    except (KernelproError, ItemTimeout) as exc:
        oom = is_out_of_memory(exc)
        record.outcome = "failed"
        record.message = (
            memory.oom_message(item.problem.display_name, oom) if oom is not None else str(exc)
        )
        _release_frames(exc)
        # A fresh exception without the chain: pytest keeps the last failure (sys.last_value),
        # and the chain's frames would keep this item's tensors on the GPU.
        raise KernelproError(record.message) from None
    except pytest.skip.Exception as exc:
        record.outcome = "skipped"
        record.message = str(exc.msg)
        raise
    finally:
        record.wall_s = time.perf_counter() - started
        try:
            facts = memory.finish()
        except Exception as exc:  # a broken CUDA context: the item already failed for it
            facts = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        if facts is not None:
            record.extra["memory"] = facts


def _release_frames(exc: BaseException | None) -> None:
    """Clear the locals of the finished frames of an exception chain (tensors, modules)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def _run_limited(
    item: KernelItem, session: KernelproSession, record: KernelRecord, memory: Any
) -> None:
    from .limits import item_time_limit, timeout_message

    settings = session.settings
    limit = settings.item_timeout_s
    phase = ["starting"]

    def message() -> str:
        assert limit is not None
        source = settings.sources.get("item_timeout", "default")
        return timeout_message(item.problem.display_name, limit, source, phase[0])

    def on_native_hang(text: str) -> None:
        record.outcome = "failed"
        record.message = text
        session.add_record(record)
        if not session.is_xdist_worker:
            session.write_outputs()

    device = session.choose_device(item.problem).device
    if limit is not None and device is not None and device.startswith("cuda"):
        _start_cuda(device)
    with item_time_limit(limit, message, on_native_hang), _cpu_threads(item, session, record):
        _run(item, session, record, phase, memory)


def _start_cuda(device: str) -> None:
    """Create this process's CUDA context before the item's clock starts, once.

    The first CUDA item of a process pays for the context (seconds on the H200): counted
    against its time limit, a short limit failed a healthy kernel in every fresh
    `--kernelpro-isolate` child, and a hanging kernel was stopped before it ever ran.
    Nothing here waits for the GPU (an earlier item's kernel may still be running); what
    fails is left to the item, which reports it.
    """
    import torch

    if torch.cuda.is_initialized() or not torch.cuda.is_available():
        return
    with contextlib.suppress(Exception):
        torch.cuda.init()
        torch.empty(1, device=device)  # the context is made at the first allocation


@contextlib.contextmanager
def _cpu_threads(
    item: KernelItem, session: KernelproSession, record: KernelRecord
) -> Iterator[None]:
    """A CPU kernel item runs under the thread policy; a GPU (or skipped) one as it is."""
    if session.choose_device(item.problem).device != "cpu":
        yield None
        return
    with cpu_thread_policy(session.settings.cpu_threads) as threads:
        record.extra["cpu_threads"] = threads
        yield None


@contextlib.contextmanager
def cpu_thread_policy(requested: int) -> Iterator[int]:
    """Run a CPU kernel item with the thread policy's torch thread count (measure.cpuload),
    restoring torch's own setting afterwards (ordinary tests in the session keep theirs)."""
    import torch

    from ..measure.cpuload import policy_threads

    before = torch.get_num_threads()
    threads = policy_threads(requested)
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _input_bytes(inputs: tuple[Any, ...]) -> int:
    """Bytes of the tensors among the inputs (the working set of a CPU cache flush)."""
    total = 0
    for value in inputs:
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
    return total


def _run(
    item: KernelItem,
    session: KernelproSession,
    record: KernelRecord,
    phase: list[str],
    memory: Any,
) -> None:
    """The stages in order; `phase[0]` names the running one (for the time limit's message)."""
    settings = session.settings
    problem = item.problem
    choice = session.choose_device(problem)
    if choice.device is None and choice.fail:
        raise KernelproError(choice.skip_reason or "no CUDA GPU")
    if choice.device is None:
        pytest.skip(choice.skip_reason or "no device")
    run = ItemRun(
        nodeid=item.nodeid,
        problem=problem,
        locator=item.locator,
        settings=ItemSettings.resolve(problem, settings, choice.device),
        record=record,
        module=getattr(item.getparent(pytest.Module), "obj", None),
    )
    _start(run, session)
    memory.device = run.device
    memory.start()

    phase[0] = "building the kernel and its reference"
    kernel, reference = _build(run, memory)
    make_inputs = _input_maker(run, memory)
    grad_mode = _grad_mode(problem)
    phase[0] = f"checking correctness ({run.settings.trials.value} trials)"
    memory.phase("check")
    correctness = check(run, session, kernel, reference, make_inputs, grad_mode)
    if settings.correctness_only:
        record.extra["correctness_only"] = True
        return

    phase[0] = "making the timing inputs"
    memory.phase("timing")
    inputs = make_inputs(1_000_003)
    phase[0] = "timing"
    median_s, remeasure = time_item(run, session, kernel, inputs, grad_mode)

    phase[0] = "checking the kernel again after timing"
    memory.phase("recheck")
    with grad_mode():
        _recheck_after_timing(kernel, reference, inputs, make_inputs, run, correctness)

    phase[0] = "counting the reference's FLOPs and bytes"
    memory.phase("roofline")
    roofline(run, session, reference, inputs, median_s, memory)

    # Not for --kernelpro-optimize alone: the search profiles the reference (Benchmarking
    # Agent) and every correct candidate, and nothing reads the item's own profile; on the
    # H200 it cost 22 s per kernel (bench/results/2026-12-01-optimize-h200.md).
    if settings.profile:
        phase[0] = "profiling"
        memory.phase("profile")
        profile(run, session)
    if settings.optimize:
        from .optimize import optimize_item

        phase[0] = "optimizing"
        memory.phase("optimize")
        optimize_item(run, session)
    if settings.check:
        phase[0] = "gating (confirmation re-measurement, regression profile)"
        memory.phase("gate")
        gate(run, session, remeasure)
    else:
        # In check mode the verdict applies the same floor.
        roofline_floor(run, median_s)


def _start(run: ItemRun, services: Services) -> None:
    """The record's device and resolved settings; a CUDA item after a CUDA error stops here."""
    record = run.record
    record.device_kind = "cuda" if run.device.startswith("cuda") else "cpu"
    if record.device_kind == "cuda":
        import os

        # Which physical GPU (pinned per pytest-xdist worker) measured this kernel.
        record.extra["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        record.extra["xdist_worker"] = os.environ.get("PYTEST_XDIST_WORKER")
    if record.device_kind == "cuda" and services.cuda_poisoned_by:
        raise KernelproError(
            f"not run: the CUDA context was broken by an earlier CUDA error in "
            f"{services.cuda_poisoned_by}; a CUDA error cannot be recovered inside one process. "
            "Fix that kernel, or run with pytest-xdist (-n 1) so a crashed worker is replaced"
        )
    record.threshold = run.settings.threshold.value
    record.min_roofline = run.settings.min_roofline.value
    record.settings = run.settings.to_dict()


def _build(run: ItemRun, memory: Any) -> tuple[Any, Any]:
    from ..measure.gpu_memory import module_bytes

    try:
        kernel, reference = run.problem.instantiate(run.device)
    except Exception as exc:
        raise KernelproError(f"building {run.name} failed: {_describe_exception(exc)}") from exc
    memory.params_bytes = module_bytes(reference)
    return kernel, reference


def _input_maker(run: ItemRun, memory: Any) -> Callable[[int], tuple[Any, ...]]:
    """`make_inputs(seed)`: the problem's inputs on the item's device, errors named."""
    from ..measure.gpu_memory import tensor_bytes_of

    problem, device = run.problem, run.device

    def make_inputs(seed: int) -> tuple[Any, ...]:
        try:
            made = problem.make_inputs(device, seed)
            if memory.inputs_bytes is None:
                memory.inputs_bytes = tensor_bytes_of(made)
            return made
        except KernelproError:
            raise
        except Exception as exc:
            name = getattr(problem.input_factory, "__name__", repr(problem.input_factory))
            raise KernelproError(
                f"input factory {name}({device!r}) raised {_describe_exception(exc)}; "
                "it must return a tuple of inputs for the given device"
            ) from exc

    return make_inputs


def check(
    run: ItemRun,
    services: Services,
    kernel: Any,
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    grad_mode: Any,
) -> Any:
    """The correctness trials; a wrong kernel fails the item here."""
    from ..measure.correctness import check_correctness

    try:
        with grad_mode():
            correctness = check_correctness(
                kernel,
                reference,
                make_inputs,
                device=run.device,
                trials=run.settings.trials.value,
                rtol=run.settings.rtol.value,
                atol=run.settings.atol.value,
            )
    except KernelproError:
        raise
    except Exception as exc:
        _note_cuda_error(services, exc, run.name)
        raise KernelproError(f"{run.name} raised {_describe_exception(exc)}") from exc
    run.record.correctness = CorrectnessPart.from_dict(correctness.to_dict())
    if getattr(correctness, "cuda_error", False) and services.cuda_poisoned_by is None:
        services.cuda_poisoned_by = run.name
    if not correctness.passed:
        failure = correctness.failure or "no detail"
        if failure.startswith("The kernel raised"):
            raise KernelproError(f"{run.name}: {failure}")
        raise KernelproError(f"{run.name} is wrong: {failure}")
    return correctness


def time_item(
    run: ItemRun, services: Services, kernel: Any, inputs: tuple[Any, ...], grad_mode: Any
) -> tuple[float, Callable[[], Any]]:
    """Time the kernel on `inputs`; returns the median and a re-measurement (the gate's
    confirmation times the kernel again the same way)."""
    from ..measure.timing import TimingBudget, time_kernel

    settings, device, record = services.settings, run.device, run.record
    budget = TimingBudget(
        warmup_ms=settings.warmup_ms,
        max_time_s=settings.budget_for(device),
        target_rel_ci=settings.target_rel_ci,
        cuda_graph=settings.cuda_graph,
        cpu_flush=settings.cpu_flush,
        clock_anchor=settings.clock_anchor,
        working_set_bytes=_input_bytes(inputs),
    )

    def remeasure() -> Any:
        with grad_mode():
            return time_kernel(lambda: kernel(*inputs), device=device, budget=budget)

    try:
        timing = remeasure()
    except Exception as exc:
        _note_cuda_error(services, exc, run.name)
        raise KernelproError(f"timing {run.name} failed: {_describe_exception(exc)}") from exc
    record.timing = TimingPart.from_dict(timing.to_dict())
    record.device = timing.device
    if timing.threads is not None:
        # Timings with other thread counts are not comparable: the count is part of the device.
        plural = "s" * (timing.threads != 1)
        record.device = f"{timing.device[:-1]}, {timing.threads} thread{plural})"
    return timing.stats.median_s, remeasure


def roofline_floor(run: ItemRun, median_s: float) -> None:
    """`min_roofline` outside check mode: the gate's one rule (`gate.verdict.roofline_floor`),
    failing the item with the numbers behind it."""
    from ..gate.verdict import roofline_floor as floor

    record = run.record
    fails, reason = floor(record.min_roofline, record.efficiency, True)
    if fails and record.efficiency is None:
        raise KernelproError(f"{run.name}: {reason}")
    if fails:
        raise KernelproError(
            f"{run.name} {reason} set in its marker (median {median_s * 1e6:.1f} us vs "
            f"roofline {(record.roofline_time_s or 0) * 1e6:.1f} us)"
        )


def _grad_mode(problem: Any) -> Any:
    """`torch.no_grad` for nn.Module kernels and KernelBench problems, else a no-op.

    A module's parameters require gradients, so a forward outside no_grad records the
    autograd graph and keeps every activation it saves alive as long as the output lives:
    the check held a network's saved activations (ten times its footprint and more) and the
    timing paid for recording the graph on every call. KernelBench's own evaluation runs the
    models under no_grad. Plain functions keep the caller's mode (one may use autograd).
    """
    import contextlib

    if problem.kind in ("kernelbench", "module"):
        import torch

        return torch.no_grad
    return contextlib.nullcontext


def _recheck_after_timing(
    kernel: Any,
    reference: Any,
    inputs: tuple[Any, ...],
    make_inputs: Any,
    run: ItemRun,
    correctness: Any,
) -> None:
    """A kernel must stay correct after it was timed (see `recheck_after_timing`)."""
    from ..measure.correctness import recheck_after_timing

    try:
        failure = recheck_after_timing(
            kernel,
            reference,
            inputs,
            lambda: make_inputs(1_000_033),
            device=run.device,
            correctness=correctness,
            rtol=run.settings.rtol.value,
            atol=run.settings.atol.value,
        )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(
            f"the reference raised {_describe_exception(exc)} when {run.name} was "
            "checked again after timing"
        ) from exc
    if failure is not None:
        raise KernelproError(f"{run.name} is wrong: {failure}")


def _note_cuda_error(services: Services, exc: BaseException, name: str) -> None:
    from ..measure.correctness import is_cuda_error

    if is_cuda_error(exc) and services.cuda_poisoned_by is None:
        services.cuda_poisoned_by = name


def roofline(
    run: ItemRun,
    services: Services,
    reference: Any,
    inputs: tuple[Any, ...],
    median_s: float,
    memory: Any,
) -> None:
    """The reference's FLOPs and bytes on the device's ceilings: the roofline and the
    kernel's share of it."""
    from ..measure.peak_paths import record_pricing
    from ..measure.roofline import analyze_reference

    problem, device, record = run.problem, run.device, run.record
    try:
        ceilings = services.ceilings_for(device)  # a first measurement is not the reference's
        spec = services.spec_for(device)
        with memory.reference_run():  # the reference's own peak: part of the footprint
            analysis = analyze_reference(
                reference,
                inputs,
                ceilings=ceilings,
                flops=problem.flops,
                bytes=problem.bytes,
                op_cost_hook=services.op_cost_hook,
                spec=spec,
            )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(
            f"roofline analysis of the reference of {run.name} failed: "
            f"{_describe_exception(exc)}; pass flops= and bytes= in the marker to skip counting"
        ) from exc
    record.roofline = RooflinePart.from_dict(analysis.to_dict())
    # A kernel faster than the op-level peak allows is priced at the peak its rate implies
    # (measure/peak_paths.py); the roofline part keeps the op-level rule's numbers.
    efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    record.efficiency = analysis.efficiency(median_s) if efficiency is None else efficiency


def profile(run: ItemRun, services: Services, device: str | None = None) -> None:
    """ncu, SASS and timeline of the kernel, then the tools' findings and guidance; a
    profiler failure never fails the kernel."""
    from .profile import profile_item

    device = run.device if device is None else device
    record = run.record
    if not device.startswith("cuda"):
        record.extra["profile_text"] = (
            "profile: not collected: ncu, SASS and timeline need a CUDA GPU"
        )
        record.extra["profile_skipped"] = "no CUDA GPU"
        return
    from ..measure.gpu_memory import memory_state, release_cached

    # The profiler runs the kernel in child processes (ncu, kineto): give them the memory
    # this process has cached but does not use; the record says what they had.
    release_cached(device, 0)
    record.extra["profile_gpu_memory"] = memory_state(device)
    try:
        profile_item(run, services, device)
    except Exception as exc:  # a profiler failure never fails the kernel
        record.extra["profile_text"] = f"profile: failed: {_describe_exception(exc)}"


def gate(run: ItemRun, services: Services, remeasure: Callable[[], Any]) -> None:
    """The verdict against the baseline (a regression is confirmed by timing it again, and
    profiled); a failing verdict fails the item."""
    from ..gate.verdict import compare, confirm, needs_confirmation
    from ..measure.peak_paths import kernel_efficiency

    record = run.record
    baseline = services.baseline()
    entry = baseline.entry_for(record) if baseline is not None else None
    cross_cpu = services.settings.cpu_cross_device
    verdict = compare(record, entry, threshold=record.threshold, cross_cpu=cross_cpu)
    if needs_confirmation(verdict):
        timing = remeasure()
        confirmed = KernelRecord.from_dict(record.to_dict())
        confirmed.timing = TimingPart.from_dict(timing.to_dict())
        if record.roofline_time_s is not None:
            confirmed.efficiency = kernel_efficiency(record.roofline, timing.stats.median_s)
        verdict = confirm(verdict, confirmed, entry, cross_cpu=cross_cpu)
        record.extra["confirmation_timing"] = timing.to_dict()
    record.gate = VerdictPart.from_dict(verdict.to_dict())
    if verdict.failed and verdict.status == "regressed" and record.profile is None:
        _auto_profile(run, services)
    if verdict.failed:
        raise KernelproError(f"{record.name}: {verdict.message}")


def _auto_profile(run: ItemRun, services: Services) -> None:
    """A regression comes with its profile (what changed, in the counters' words), within the
    session's budget of automatic profiles; past it, the record says how to profile it."""
    settings, record = services.settings, run.record
    spent = services.auto_profile_s
    if (
        services.auto_profiles_done >= settings.auto_profiles
        or spent >= settings.auto_profile_time_s
    ):
        record.extra["profile_text"] = (
            f"profile: not collected automatically: {services.auto_profiles_done} regressed "
            f"kernel(s) were already profiled in {spent:.0f} s (budget: "
            f"--kernelpro-auto-profiles={settings.auto_profiles}, "
            f"--kernelpro-auto-profile-time={settings.auto_profile_time_s:g}). Profile this one "
            f"with: pytest {shlex.quote(run.nodeid)} --kernelpro-profile"
        )
        return
    started = time.perf_counter()
    try:
        profile(run, services, record.device_kind)
    finally:
        services.auto_profiles_done += 1
        services.auto_profile_s += time.perf_counter() - started
