"""What one kernel item does when it runs: check, time, roofline, profile, gate.

Every failure becomes a `KernelproError` that names what went wrong and the fix, so one
bad kernel fails alone and the session goes on.
"""

from __future__ import annotations

import contextlib
import shlex
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from .errors import KernelproError
from .items import RECORD_KEY
from .results import KernelRecord

if TYPE_CHECKING:
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


def run_kernel_item(item: KernelItem, session: KernelproSession) -> None:
    from .item_limits import ItemTimeout
    from .measure.gpu_memory import ItemMemory, is_out_of_memory

    record = new_record(item)
    item.stash[RECORD_KEY] = record
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
    from .item_limits import item_time_limit, timeout_message

    settings = session.settings
    limit = settings.item_timeout_s
    phase = ["starting"]

    def message() -> str:
        assert limit is not None
        source = settings.sources.get("item_timeout", "default")
        return timeout_message(item.problem.display_name, limit, source, phase[0])

    def on_native_hang(text: str) -> None:
        from .reporting import write_session_outputs

        record.outcome = "failed"
        record.message = text
        session.add_record(record)
        if not session.is_xdist_worker:
            write_session_outputs(session)

    with item_time_limit(limit, message, on_native_hang), _cpu_threads(item, session, record):
        _run(item, session, record, phase, memory)


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

    from .measure.cpuload import policy_threads

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
    from .measure.correctness import check_correctness
    from .measure.gpu_memory import module_bytes, tensor_bytes_of
    from .measure.timing import TimingBudget, time_kernel

    settings = session.settings
    problem = item.problem
    choice = session.choose_device(problem)
    if choice.device is None and choice.fail:
        raise KernelproError(choice.skip_reason or "no CUDA GPU")
    if choice.device is None:
        pytest.skip(choice.skip_reason or "no device")
    device = choice.device
    record.device_kind = "cuda" if device.startswith("cuda") else "cpu"
    if record.device_kind == "cuda":
        import os

        # Which physical GPU (pinned per pytest-xdist worker) measured this kernel.
        record.extra["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        record.extra["xdist_worker"] = os.environ.get("PYTEST_XDIST_WORKER")
    if record.device_kind == "cuda" and session.cuda_poisoned_by:
        raise KernelproError(
            f"not run: the CUDA context was broken by an earlier CUDA error in "
            f"{session.cuda_poisoned_by}; a CUDA error cannot be recovered inside one process. "
            "Fix that kernel, or run with pytest-xdist (-n 1) so a crashed worker is replaced"
        )
    record.threshold = problem.threshold or settings.threshold_for(record.device_kind)
    record.min_roofline = problem.min_roofline
    memory.device = device
    memory.start()

    phase[0] = "building the kernel and its reference"
    try:
        kernel, reference = problem.instantiate(device)
    except Exception as exc:
        raise KernelproError(
            f"building {problem.display_name} failed: {_describe_exception(exc)}"
        ) from exc
    memory.params_bytes = module_bytes(reference)

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

    trials = problem.trials or settings.trials
    phase[0] = f"checking correctness ({trials} trials)"
    grad_mode = _grad_mode(problem)
    try:
        with grad_mode():
            correctness = check_correctness(
                kernel,
                reference,
                make_inputs,
                device=device,
                trials=trials,
                rtol=problem.rtol,
                atol=problem.atol,
            )
    except KernelproError:
        raise
    except Exception as exc:
        _note_cuda_error(session, exc, problem.display_name)
        raise KernelproError(f"{problem.display_name} raised {_describe_exception(exc)}") from exc
    record.correctness = correctness.to_dict()
    if getattr(correctness, "cuda_error", False) and session.cuda_poisoned_by is None:
        session.cuda_poisoned_by = problem.display_name
    if not correctness.passed:
        failure = correctness.failure or "no detail"
        if failure.startswith("The kernel raised"):
            raise KernelproError(f"{problem.display_name}: {failure}")
        raise KernelproError(f"{problem.display_name} is wrong: {failure}")
    if settings.correctness_only:
        record.extra["correctness_only"] = True
        return

    phase[0] = "making the timing inputs"
    inputs = make_inputs(1_000_003)
    budget = TimingBudget(
        warmup_ms=settings.warmup_ms,
        max_time_s=settings.budget_for(device),
        target_rel_ci=settings.target_rel_ci,
        cuda_graph=settings.cuda_graph,
        cpu_flush=settings.cpu_flush,
        working_set_bytes=_input_bytes(inputs),
    )
    phase[0] = "timing"

    def remeasure() -> Any:
        with grad_mode():
            return time_kernel(lambda: kernel(*inputs), device=device, budget=budget)

    try:
        timing = remeasure()
    except Exception as exc:
        _note_cuda_error(session, exc, problem.display_name)
        raise KernelproError(
            f"timing {problem.display_name} failed: {_describe_exception(exc)}"
        ) from exc
    record.timing = timing.to_dict()
    record.device = timing.device
    if timing.threads is not None:
        # Timings with other thread counts are not comparable: the count is part of the device.
        plural = "s" * (timing.threads != 1)
        record.device = f"{timing.device[:-1]}, {timing.threads} thread{plural})"

    phase[0] = "checking the kernel again after timing"
    with grad_mode():
        _recheck_after_timing(kernel, reference, inputs, make_inputs, device, problem, correctness)

    phase[0] = "counting the reference's FLOPs and bytes"
    _roofline(session, record, reference, inputs, device, problem, timing.stats.median_s, memory)

    # Not for --kernelpro-optimize alone: the search profiles the reference (Benchmarking
    # Agent) and every correct candidate, and nothing reads the item's own profile; on the
    # H200 it cost 22 s per kernel (bench/results/2026-12-01-optimize-h200.md).
    if settings.profile:
        phase[0] = "profiling"
        _profile(item, session, record, device)
    if settings.optimize:
        from .optimize import optimize_item

        phase[0] = "optimizing"
        optimize_item(item, session, record, device)
    if settings.check:
        phase[0] = "gating (confirmation re-measurement, regression profile)"
        _gate(item, session, record, remeasure)

    # In check mode the verdict already fails a kernel below its min_roofline.
    if not settings.check and record.min_roofline is not None and record.efficiency is not None:
        if record.efficiency < record.min_roofline:
            raise KernelproError(
                f"{problem.display_name} reaches {record.efficiency:.1%} of its roofline, below "
                f"min_roofline={record.min_roofline:.0%} set in its marker "
                f"(median {timing.stats.median_s * 1e6:.1f} us vs roofline "
                f"{(record.roofline or {}).get('roofline_time_s', 0) * 1e6:.1f} us)"
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
    device: str,
    problem: Any,
    correctness: Any,
) -> None:
    """A kernel must stay correct after it was timed (see `recheck_after_timing`)."""
    from .measure.correctness import recheck_after_timing

    try:
        failure = recheck_after_timing(
            kernel,
            reference,
            inputs,
            lambda: make_inputs(1_000_033),
            device=device,
            correctness=correctness,
            rtol=problem.rtol,
            atol=problem.atol,
        )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(
            f"the reference raised {_describe_exception(exc)} when {problem.display_name} was "
            "checked again after timing"
        ) from exc
    if failure is not None:
        raise KernelproError(f"{problem.display_name} is wrong: {failure}")


def _note_cuda_error(session: KernelproSession, exc: BaseException, name: str) -> None:
    from .measure.correctness import is_cuda_error

    if is_cuda_error(exc) and session.cuda_poisoned_by is None:
        session.cuda_poisoned_by = name


def _roofline(
    session: KernelproSession,
    record: KernelRecord,
    reference: Any,
    inputs: tuple[Any, ...],
    device: str,
    problem: Any,
    median_s: float,
    memory: Any,
) -> None:
    from .measure.roofline import analyze_reference

    try:
        ceilings = session.ceilings_for(device)  # a first measurement is not the reference's
        spec = session.spec_for(device)
        with memory.reference_run():  # the reference's own peak: part of the footprint
            analysis = analyze_reference(
                reference,
                inputs,
                ceilings=ceilings,
                flops=problem.flops,
                bytes=problem.bytes,
                op_cost_hook=session.op_cost_hook,
                spec=spec,
            )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(
            f"roofline analysis of the reference of {problem.display_name} failed: "
            f"{_describe_exception(exc)}; pass flops= and bytes= in the marker to skip counting"
        ) from exc
    record.roofline = analysis.to_dict()
    record.efficiency = analysis.efficiency(median_s)


def _profile(
    item: KernelItem, session: KernelproSession, record: KernelRecord, device: str
) -> None:
    from .profiling import profile_item

    if not device.startswith("cuda"):
        record.extra["profile_text"] = (
            "profile: not collected: ncu, SASS and timeline need a CUDA GPU"
        )
        record.extra["profile_skipped"] = "no CUDA GPU"
        return
    from .measure.gpu_memory import release_cached

    # The profiler runs the kernel in child processes (ncu, kineto): give them the memory
    # this process has cached but does not use.
    release_cached(device, 0)
    try:
        profile_item(item, session, record, device)
    except Exception as exc:  # a profiler failure never fails the kernel
        record.extra["profile_text"] = f"profile: failed: {_describe_exception(exc)}"


def _gate(
    item: KernelItem, session: KernelproSession, record: KernelRecord, remeasure: Any
) -> None:
    from .gate.verdict import compare, confirm, needs_confirmation

    baseline = session.baseline()
    entry = baseline.entry_for(record) if baseline is not None else None
    cross_cpu = session.settings.cpu_cross_device
    verdict = compare(record, entry, threshold=record.threshold, cross_cpu=cross_cpu)
    if needs_confirmation(verdict):
        timing = remeasure()
        confirmed = KernelRecord.from_dict(record.to_dict())
        confirmed.timing = timing.to_dict()
        if record.roofline:
            confirmed.efficiency = record.roofline["roofline_time_s"] / timing.stats.median_s
        verdict = confirm(verdict, confirmed, entry, cross_cpu=cross_cpu)
        record.extra["confirmation_timing"] = timing.to_dict()
    record.gate = verdict.to_dict()
    if verdict.failed and verdict.status == "regressed" and record.profile is None:
        _auto_profile(item, session, record)
    if verdict.failed:
        raise KernelproError(f"{record.name}: {verdict.message}")


def _auto_profile(item: KernelItem, session: KernelproSession, record: KernelRecord) -> None:
    """A regression comes with its profile (what changed, in the counters' words), within the
    session's budget of automatic profiles; past it, the record says how to profile it."""
    settings = session.settings
    spent = session.auto_profile_s
    if (
        session.auto_profiles_done >= settings.auto_profiles
        or spent >= settings.auto_profile_time_s
    ):
        record.extra["profile_text"] = (
            f"profile: not collected automatically: {session.auto_profiles_done} regressed "
            f"kernel(s) were already profiled in {spent:.0f} s (budget: "
            f"--kernelpro-auto-profiles={settings.auto_profiles}, "
            f"--kernelpro-auto-profile-time={settings.auto_profile_time_s:g}). Profile this one "
            f"with: pytest {shlex.quote(item.nodeid)} --kernelpro-profile"
        )
        return
    started = time.perf_counter()
    try:
        _profile(item, session, record, record.device_kind)
    finally:
        session.auto_profiles_done += 1
        session.auto_profile_s += time.perf_counter() - started
