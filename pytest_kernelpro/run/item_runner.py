"""Running one kernel item: its guards, its state (`context.ItemRun`) built once, and its
stages in order.

Only this module holds the pytest item and the session; every stage takes the item's state
and values, so a stage can be called and tested alone. Every failure becomes a
`KernelproError` that names what went wrong and the fix, so one bad kernel fails alone and
the session goes on.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import KernelRecord
from pytest_kernelpro.run.context import (
    TIMING_SEED,
    DeviceModel,
    ItemRun,
    ItemSettings,
    Resolved,
    autotune_capture,
    extra_autotuners,
    record_process_facts,
    time_limit_setting,
    watching,
)
from pytest_kernelpro.run.stages import check, gate, recheck, roofline, roofline_floor, time_item

if TYPE_CHECKING:
    from pytest_kernelpro.measure.autotune_capture import AutotuneCapture
    from pytest_kernelpro.measure.gpu_memory import ItemMemory
    from pytest_kernelpro.run.items import KernelItem
    from pytest_kernelpro.run.session import DeviceChoice, KernelproSession


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
    from pytest_kernelpro.run.context import ItemTimeout

    settings = session.settings
    phase = _Phase()
    try:
        if settings.isolate and not settings.isolated_child:
            from pytest_kernelpro.run.isolate import run_isolated

            run_isolated(item, session, record)
        else:
            _run_limited(item, session, record, phase)
        record.outcome = "passed"
    except (KernelproError, ItemTimeout) as exc:
        record.outcome = "failed"
        record.message = str(exc)
        if phase.memory is not None:  # a CUDA item: an out-of-memory error gets the sizes
            from pytest_kernelpro.measure.gpu_memory import is_out_of_memory

            oom = is_out_of_memory(exc)
            if oom is not None:
                record.message = phase.memory.oom_message(item.problem.display_name, oom)
        _release_frames(exc)
        # A fresh exception without the chain: pytest keeps the last failure (sys.last_value),
        # and the chain's frames would keep this item's tensors on the GPU.
        raise KernelproError(record.message) from None
    except pytest.skip.Exception as exc:
        record.outcome = "skipped"
        record.message = str(exc.msg)
        raise
    finally:
        record.wall_s = phase.item_s(record)
        try:
            facts = phase.memory.finish() if phase.memory is not None else None
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
    item: KernelItem, session: KernelproSession, record: KernelRecord, phase: _Phase
) -> None:
    """The process set up for the item's device (CUDA context, CPU thread policy, ceilings)
    before the item's clock starts, then the stages under the item's time limit."""
    from pytest_kernelpro.run.context import item_time_limit, timeout_message

    limit = time_limit_setting(session.settings)

    def message() -> str:
        assert limit.value is not None
        return timeout_message(item.problem.display_name, limit.value, limit.source, phase.text)

    def on_native_hang(text: str) -> None:
        record.outcome = "failed"
        record.message = text
        session.add_record(record)
        if not session.is_xdist_worker:
            session.write_outputs()

    choice = session.choose_device(item.problem)
    device = choice.device
    setup_started = time.perf_counter()
    if limit.value is not None and device is not None and device.startswith("cuda"):
        _start_cuda(device)
    with cpu_thread_policy(device, session.settings.cpu_threads) as threads:
        device_model = _device_model(session, item, device) if device is not None else None
        setup_s = time.perf_counter() - setup_started
        if round(setup_s, 1):  # a probe or a new CUDA context (a cache read rounds to nothing)
            record.extra["machine_setup_s"] = round(setup_s, 3)
        with item_time_limit(limit.value, message, on_native_hang):
            device = _usable_device(session, choice)
            assert device_model is not None
            run = _item_state(item, session, record, device, limit, threads, device_model)
            _run(item, session, run, phase)


def _start_cuda(device: str) -> None:
    """Create this process's CUDA context before the item's clock starts, once: counted
    against its time limit, its seconds would fail a healthy kernel in every fresh
    `--kernelpro-isolate` child. Nothing here waits for the GPU (an earlier item's kernel may
    still run); what fails is left to the item, which reports it."""
    import torch

    if torch.cuda.is_initialized() or not torch.cuda.is_available():
        return
    with contextlib.suppress(Exception):
        torch.cuda.init()
        torch.empty(1, device=device)  # the context is made at the first allocation


@contextlib.contextmanager
def cpu_thread_policy(device: str | None, requested: int) -> Iterator[int | None]:
    """Run a CPU kernel item with the thread policy's torch thread count (yielded), then give
    the session's other tests torch's own back; a GPU (or skipped) item runs as it is (None)."""
    if device != "cpu":
        yield None
        return
    import torch

    from pytest_kernelpro.measure.timing.cpu_load import policy_threads

    before = torch.get_num_threads()
    threads = policy_threads(requested)
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _device_model(session: KernelproSession, item: KernelItem, device: str) -> DeviceModel:
    """The device's ceilings (measured or loaded once a session) and its table entry, got
    before the item's clock starts: the probe measures the machine, not the kernel, so it is
    not charged to the first item's time limit. Runs under the item's thread policy (CPU
    ceilings are per thread count). A failure is kept for the roofline stage, which fails
    the item with it (a correctness-only run never needs them); an interrupt still stops the
    session (the cache is written atomically)."""
    try:
        return DeviceModel(session.ceilings_for(device), session.spec_for(device))
    except KernelproError as exc:
        return DeviceModel(None, None, exc)
    except Exception as exc:
        error = KernelproError(
            f"the ceilings of {device} for the roofline of {item.problem.display_name} could "
            f"not be measured: {describe_exception(exc)}; pass --kernelpro-ceilings=FILE "
            "(written by `kernelpro calibrate`)"
        )
        error.__cause__ = exc
        return DeviceModel(None, None, error)


def _usable_device(session: KernelproSession, choice: DeviceChoice) -> str:
    """The chosen device, or the item's skip or failure when there is none it may use."""
    if choice.device is None and choice.fail:
        raise KernelproError(choice.skip_reason or "no CUDA GPU")
    if choice.device is None:
        pytest.skip(choice.skip_reason or "no device")
    if session.gpu_shared_by_workers and not str(choice.device).startswith("cpu"):
        raise KernelproError(session.gpu_shared_by_workers)
    return choice.device


def _item_state(
    item: KernelItem,
    session: KernelproSession,
    record: KernelRecord,
    device: str,
    time_limit: Resolved[float | None],
    threads: int | None,
    device_model: DeviceModel,
) -> ItemRun:
    """The item's state (`ItemRun`), built once its device is chosen."""
    config = session.settings
    entry, baseline_error = None, None
    if config.check and not config.correctness_only and config.remeasure_pins is None:
        try:
            baseline = session.baseline()
        except KernelproError as exc:
            baseline_error = exc
        else:
            entry = baseline.entry_for(record) if baseline is not None else None
    return ItemRun(
        nodeid=item.nodeid,
        problem=item.problem,
        locator=item.locator,
        settings=ItemSettings.resolve(item.problem, config, device),
        record=record,
        session_settings=config,
        time_limit=time_limit,
        threads=threads,
        device_model=device_model,
        time_budget_s=session.time_budget_s[device.partition(":")[0]],
        baseline_entry=entry,
        baseline_error=baseline_error,
        module=getattr(item.getparent(pytest.Module), "obj", None),
    )


@dataclass
class _Phase:
    """The running phase: named in the time limit's message and in the GPU memory account
    (`memory`, a CUDA item's only: elsewhere there is no GPU memory to account)."""

    memory: ItemMemory | None = None
    text: str = "starting"
    started: float = field(default_factory=time.perf_counter)  # the item's clock

    def item_s(self, record: KernelRecord) -> float:
        """The item's own time so far: the machine's set-up its first item triggered (CUDA
        context, ceilings probe) is no item's work and is kept apart."""
        return time.perf_counter() - self.started - record.extra.get("machine_setup_s", 0.0)

    def enter(self, text: str, memory_phase: str | None = None) -> None:
        self.text = text
        if memory_phase is not None and self.memory is not None:
            self.memory.phase(memory_phase)


@dataclass(frozen=True)
class BuiltKernel:
    """The kernel and its reference built on the item's device, with what runs them."""

    kernel: Any
    reference: Any
    make_inputs: Callable[[int], tuple[Any, ...]]
    grad_mode: Callable[[], Any]
    capture: AutotuneCapture | None  # None: no autotuner to watch (run.context.autotune_capture)


@dataclass
class _Measured:
    """What the measure stage gives the later ones."""

    correctness: Any
    inputs: tuple[Any, ...]  # the timing inputs
    median_s: float
    remeasure: Callable[[], Any] | None  # the timing again, for the gate's confirmation


def _run(item: KernelItem, session: KernelproSession, run: ItemRun, phase: _Phase) -> None:
    """The stages in order."""
    _start(run, session)
    if run.device.startswith("cuda"):
        from pytest_kernelpro.measure.gpu_memory import ItemMemory

        phase.memory = ItemMemory(device=run.device)
        phase.memory.start()
    phase.enter("building the kernel and its reference")
    built = _build_kernel(run, session, phase.memory)
    if run.session_settings.remeasure_pins is not None:
        from pytest_kernelpro.run.fresh_process import remeasure_only

        phase.enter("re-measuring in a fresh process (confirmation)", "timing")
        remeasure_only(run, built)
        return
    measured = _measure(run, session, built, phase)
    if measured is not None:
        _price_and_gate(item, session, run, built, measured, phase)


def _build_kernel(
    run: ItemRun, session: KernelproSession, memory: ItemMemory | None
) -> BuiltKernel:
    kernel, reference = _build(run, memory)
    capture = autotune_capture(
        run, run.session_settings.remeasure_pins, extra_autotuners(session.config)
    )
    return BuiltKernel(
        kernel, reference, _input_maker(run, memory), _grad_mode(run.problem), capture
    )


def _measure(
    run: ItemRun, session: KernelproSession, built: BuiltKernel, phase: _Phase
) -> _Measured | None:
    """The measure stage: the correctness trials, the timing and the re-check after timing
    (None under --kernelpro-correctness-only, which stops after the trials)."""
    kernel, reference, make_inputs = built.kernel, built.reference, built.make_inputs
    grad_mode = built.grad_mode
    trials = run.settings.trials.value
    phase.enter(f"checking correctness ({trials} trial{'' if trials == 1 else 's'})", "check")
    with watching(built.capture), _noting_cuda_errors(session, run):
        # the first calls are where an autotuner picks its config
        correctness = check(run, kernel, reference, make_inputs, grad_mode)
    record_process_facts(run, built.capture)
    if run.session_settings.correctness_only:
        run.record.extra["correctness_only"] = True
        return None

    phase.enter("making the timing inputs", "timing")
    inputs = make_inputs(TIMING_SEED)
    phase.enter("timing")
    with _noting_cuda_errors(session, run):
        median_s, remeasure = time_item(
            run, kernel, inputs, grad_mode,
            reference=reference, make_inputs=make_inputs, correctness=correctness,
        )  # fmt: skip
    if built.capture is not None:
        built.capture.after_timing()
    record_process_facts(run, built.capture)

    phase.enter("checking the kernel again after timing", "recheck")
    with grad_mode():
        recheck(kernel, reference, inputs, make_inputs, run, correctness)
    return _Measured(correctness, inputs, median_s, remeasure)


def _price_and_gate(
    item: KernelItem,
    session: KernelproSession,
    run: ItemRun,
    built: BuiltKernel,
    measured: _Measured,
    phase: _Phase,
) -> None:
    """The roofline, the profile, other plugins' work, then the gate (or the roofline floor)."""
    phase.enter("counting the reference's FLOPs and bytes", "roofline")
    roofline(
        run,
        built.reference,
        measured.inputs,
        measured.median_s,
        phase.memory,
        reprobe_ceilings=lambda why: session.reprobe_ceilings(run.device, why),
        op_cost_hook=session.op_cost_hook,
    )

    # Not for --kernelpro-optimize alone: the search profiles the reference (Benchmarking
    # Agent) and every correct candidate, and nothing reads the item's own profile, which
    # costs seconds per kernel on a GPU.
    if run.session_settings.profile:
        from pytest_kernelpro.run.profile_stage import profile

        phase.enter("profiling", "profile")
        profile(run, session.profiling)

    def set_phase(text: str) -> None:
        phase.enter(text, text)

    # Another plugin's work on the measured item (the optimizer's search), the record's time
    # so far what the gate spent checking and timing it (the search sizes its limits on it).
    run.record.wall_s = phase.item_s(run.record)
    if not run.session_settings.check:  # what only the gate reads is not held beside that work
        from pytest_kernelpro.measure.gpu_memory import release_cached

        measured.inputs, measured.remeasure, measured.correctness = (), None, None
        release_cached(run.device, 0)  # and torch's CUDA cache goes back to the device
    session.config.hook.pytest_kernelpro_item_measured(
        run=run, session=session, set_phase=set_phase
    )
    if not run.session_settings.check:
        # In check mode the verdict applies the same floor.
        roofline_floor(run, measured.median_s)
        return
    phase.enter("gating (confirmation re-measurement, regression profile)", "gate")
    assert measured.remeasure is not None  # released only where no gate runs
    rule = getattr(measured.correctness, "rule_state", None)

    def fresh_remeasure(pins: list[dict[str, Any]]) -> Any:
        # Imported only when a confirmation runs in a fresh process.
        from pytest_kernelpro.run.fresh_process import remeasure_in_fresh_process

        return remeasure_in_fresh_process(item, session, pins, rule, limit=run.time_limit.value)

    gate(run, measured.remeasure, fresh_remeasure, profiling=session.profiling)


@contextlib.contextmanager
def _noting_cuda_errors(session: KernelproSession, run: ItemRun) -> Iterator[None]:
    """A CUDA error breaks this process's CUDA context: the first item that raised one is
    noted, and later CUDA items of the process fail naming it (`_start`)."""
    from pytest_kernelpro.measure.correctness_check import is_cuda_error

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
    """The record's device, threads and settings; a CUDA item after a CUDA error stops here."""
    record = run.record
    if run.threads is not None:
        record.extra["cpu_threads"] = run.threads
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


def _build(run: ItemRun, memory: ItemMemory | None) -> tuple[Any, Any]:
    try:
        kernel, reference = run.problem.instantiate(run.device)
    except Exception as exc:
        raise KernelproError(f"building {run.name} failed: {describe_exception(exc)}") from exc
    if memory is not None:
        from pytest_kernelpro.measure.gpu_memory import module_bytes

        memory.params_bytes = module_bytes(reference)
    return kernel, reference


def _input_maker(run: ItemRun, memory: ItemMemory | None) -> Callable[[int], tuple[Any, ...]]:
    """`make_inputs(seed)`: the problem's inputs on the item's device, errors named."""
    problem, device = run.problem, run.device

    def make_inputs(seed: int) -> tuple[Any, ...]:
        try:
            made = problem.make_inputs(device, seed)
            if memory is not None and memory.inputs_bytes is None:
                from pytest_kernelpro.measure.gpu_memory import tensor_bytes_of

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
    """`torch.no_grad` for nn.Module kernels and KernelBench problems (as KernelBench's own
    evaluation runs them), else a no-op: outside no_grad a module's forward records the
    autograd graph and keeps its saved activations alive with the output, and the timing pays
    for the graph on every call. Plain functions keep the caller's mode (one may use autograd)."""
    if problem.kind in ("kernelbench", "module"):
        import torch

        return torch.no_grad
    return contextlib.nullcontext
