"""Running one kernel item: the entry, its guards, and the stages in order.

`run_kernel_item` is the entry (from `KernelItem.runtest`): the item's time limit, CPU thread
policy, GPU memory accounting and isolation around `_run`, which chooses the device, resolves
the item's settings once (`context.ItemSettings`), builds the kernel and its reference, and
calls the stages (`stages.py`) in order; the optimize stage is the one call into
`pytest_kernelpro.optimize` (`optimize.loop.item.optimize_item`), made only under
`--kernelpro-optimize`.

Every failure becomes a `KernelproError` that names what went wrong and the fix, so one
bad kernel fails alone and the session goes on.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import KernelRecord
from pytest_kernelpro.run.context import ItemRun, ItemSettings
from pytest_kernelpro.run.fresh_process import remeasure_in_fresh_process
from pytest_kernelpro.run.process_facts import (
    autotune_capture,
    extra_autotuners,
    record_process_facts,
    remeasure_only,
)
from pytest_kernelpro.run.stages import (
    check,
    gate,
    profile,
    recheck,
    roofline,
    roofline_floor,
    time_item,
)

if TYPE_CHECKING:
    from pytest_kernelpro.run.items import KernelItem
    from pytest_kernelpro.run.session import KernelproSession


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
    from pytest_kernelpro.measure.gpu_memory import ItemMemory, is_out_of_memory
    from pytest_kernelpro.run.limits import ItemTimeout

    started = time.perf_counter()
    settings = session.settings
    memory = ItemMemory(device="cpu")
    try:
        if settings.isolate and not settings.isolated_child:
            from pytest_kernelpro.run.isolate import run_isolated

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
    from pytest_kernelpro.run.limits import item_time_limit, timeout_message

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

    The first CUDA item of a process pays for the context (seconds): counted against its
    time limit, a short limit would fail a healthy kernel in every fresh `--kernelpro-isolate`
    child, and stop a hanging kernel before it ever ran.
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
    """Run a CPU kernel item with the thread policy's torch thread count (measure.timing.cpu),
    restoring torch's own setting afterwards (ordinary tests in the session keep theirs)."""
    import torch

    from pytest_kernelpro.measure.timing.cpu import policy_threads

    before = torch.get_num_threads()
    threads = policy_threads(requested)
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


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
    capture = autotune_capture(run, settings.remeasure_pins, extra_autotuners(session.config))
    if settings.remeasure_pins is not None:
        phase[0] = "re-measuring in a fresh process (confirmation)"
        memory.phase("timing")
        remeasure_only(run, settings, kernel, reference, make_inputs, grad_mode, capture)
        return
    trials = run.settings.trials.value
    phase[0] = f"checking correctness ({trials} trial{'' if trials == 1 else 's'})"
    memory.phase("check")
    with capture.watching(), _noting_cuda_errors(session, run):
        # the first calls are where an autotuner picks its config
        correctness = check(run, kernel, reference, make_inputs, grad_mode)
    record_process_facts(run, capture)
    if settings.correctness_only:
        record.extra["correctness_only"] = True
        return

    phase[0] = "making the timing inputs"
    memory.phase("timing")
    inputs = make_inputs(1_000_003)
    phase[0] = "timing"
    with _noting_cuda_errors(session, run):
        median_s, remeasure = time_item(
            run,
            settings,
            kernel,
            inputs,
            grad_mode,
            reference=reference,
            make_inputs=make_inputs,
            correctness=correctness,
        )
    capture.after_timing()
    record_process_facts(run, capture)

    phase[0] = "checking the kernel again after timing"
    memory.phase("recheck")
    with grad_mode():
        recheck(kernel, reference, inputs, make_inputs, run, correctness)

    phase[0] = "counting the reference's FLOPs and bytes"
    memory.phase("roofline")
    ceilings, spec = _device_model(session, run)
    roofline(
        run,
        reference,
        inputs,
        median_s,
        memory,
        ceilings=ceilings,
        reprobe_ceilings=lambda why: session.reprobe_ceilings(run.device, why),
        spec=spec,
        op_cost_hook=session.op_cost_hook,
    )

    # Not for --kernelpro-optimize alone: the search profiles the reference (Benchmarking
    # Agent) and every correct candidate, and nothing reads the item's own profile, which
    # costs seconds per kernel on a GPU.
    if settings.profile:
        phase[0] = "profiling"
        memory.phase("profile")
        profile(run, session.profiling)
    if settings.optimize:
        from pytest_kernelpro.optimize.loop.item import optimize_item

        phase[0] = "optimizing"
        memory.phase("optimize")
        optimize_item(run, session)
    if settings.check:
        phase[0] = "gating (confirmation re-measurement, regression profile)"
        memory.phase("gate")
        baseline = session.baseline()
        gate(
            run,
            settings,
            remeasure,
            lambda pins: remeasure_in_fresh_process(item, session, pins),
            entry=baseline.entry_for(record) if baseline is not None else None,
            profiling=session.profiling,
        )
    else:
        # In check mode the verdict applies the same floor.
        roofline_floor(run, median_s)


def _device_model(session: KernelproSession, run: ItemRun) -> tuple[Any, Any]:
    """The device's ceilings (measured once per session) and its table entry, for the
    roofline; a failure to get them fails the item with what failed."""
    try:
        return session.ceilings_for(run.device), session.spec_for(run.device)
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(
            f"the ceilings of {run.device} for the roofline of {run.name} could not be "
            f"measured: {describe_exception(exc)}; pass --kernelpro-ceilings=FILE (written by "
            "`kernelpro calibrate`)"
        ) from exc


@contextlib.contextmanager
def _noting_cuda_errors(session: KernelproSession, run: ItemRun) -> Iterator[None]:
    """A CUDA error breaks this process's CUDA context: the first item that raised one is
    noted, and later CUDA items of the process fail naming it (`_start`)."""
    from pytest_kernelpro.measure.correctness import is_cuda_error

    try:
        yield
    except Exception as exc:
        checked = run.record.correctness
        raised = exc.__cause__ if isinstance(exc, KernelproError) else exc
        broke = (checked is not None and checked.cuda_error) or (
            raised is not None and is_cuda_error(raised)
        )
        if broke and session.cuda_poisoned_by is None:
            session.cuda_poisoned_by = run.name
        raise


def _start(run: ItemRun, session: KernelproSession) -> None:
    """The record's device and resolved settings; a CUDA item after a CUDA error stops here."""
    record = run.record
    record.device_kind = "cuda" if run.device.startswith("cuda") else "cpu"
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
    record.threshold = run.settings.threshold.value
    record.min_roofline = run.settings.min_roofline.value
    record.settings = run.settings.to_dict()


def _build(run: ItemRun, memory: Any) -> tuple[Any, Any]:
    from pytest_kernelpro.measure.gpu_memory import module_bytes

    try:
        kernel, reference = run.problem.instantiate(run.device)
    except Exception as exc:
        raise KernelproError(f"building {run.name} failed: {describe_exception(exc)}") from exc
    memory.params_bytes = module_bytes(reference)
    return kernel, reference


def _input_maker(run: ItemRun, memory: Any) -> Callable[[int], tuple[Any, ...]]:
    """`make_inputs(seed)`: the problem's inputs on the item's device, errors named."""
    from pytest_kernelpro.measure.gpu_memory import tensor_bytes_of

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
                f"input factory {name}({device!r}) raised {describe_exception(exc)}; "
                "it must return a tuple of inputs for the given device"
            ) from exc

    return make_inputs


def _grad_mode(problem: Any) -> Any:
    """`torch.no_grad` for nn.Module kernels and KernelBench problems, else a no-op.

    A module's parameters require gradients, so a forward outside no_grad records the
    autograd graph and keeps every activation it saves alive as long as the output lives:
    the check held a network's saved activations (ten times its footprint and more) and the
    timing paid for recording the graph on every call. KernelBench's own evaluation runs the
    models under no_grad. Plain functions keep the caller's mode (one may use autograd).
    """
    if problem.kind in ("kernelbench", "module"):
        import torch

        return torch.no_grad
    return contextlib.nullcontext
