"""Running one kernel item: the entry, its guards, the stages in order, and the stages.

`run_kernel_item` is the entry (from `KernelItem.runtest`): the item's time limit, CPU thread
policy, GPU memory accounting and isolation around `_run`, which chooses the device, resolves
the item's settings once (`context.ItemSettings`), builds the kernel and its reference, and
calls the stages in order: `check`, `time_item`, `recheck`, `roofline`, `profile`, `gate` (or
`roofline_floor` outside check mode). Between the roofline and the gate, other plugins work on
the measured item through the `pytest_kernelpro_item_measured` hook (the optimizer plugin runs
its search there). `remeasure_only` is the run of the fresh process that confirms a
regression (`fresh_process.py`): one pinned call, then the timing.

Each stage is a function of the item's `ItemRun` and the values it needs, which `_run` looks
up once and passes: the session-wide settings, the device's ceilings and spec, the baseline
entry, the profiling setup. No stage sees the pytest item or the session, so a stage can be
called and tested alone.

Every failure becomes a `KernelproError` that names what went wrong and the fix, so one
bad kernel fails alone and the session goes on.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
import traceback
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import (
    CorrectnessPart,
    KernelRecord,
    RooflinePart,
    TimingPart,
    VerdictPart,
)
from pytest_kernelpro.run.context import (
    ItemRun,
    ItemSettings,
    autotune_capture,
    extra_autotuners,
    record_process_facts,
)
from pytest_kernelpro.run.fresh_process import read_rule, remeasure_in_fresh_process

if TYPE_CHECKING:
    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.measure.environment import AutotuneCapture
    from pytest_kernelpro.run.context import Profiling
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
    from pytest_kernelpro.measure.gpu_memory import ItemMemory, is_out_of_memory
    from pytest_kernelpro.run.context import ItemTimeout

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
    from pytest_kernelpro.run.context import item_time_limit, timeout_message

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

    # The device is chosen once per item; every later step gets the choice.
    choice = session.choose_device(item.problem)
    device = choice.device
    if limit is not None and device is not None and device.startswith("cuda"):
        _start_cuda(device)
    with _cpu_threads(device, session.settings.cpu_threads, record):
        if device is not None:
            _measure_ceilings_first(session, device)
        with item_time_limit(limit, message, on_native_hang):
            _run(item, session, record, phase, memory, choice)


def _measure_ceilings_first(session: KernelproSession, device: str) -> None:
    """Measure (or load) the device's ceilings before the item's clock starts, once a session.

    The probe measures the machine, not the kernel: charged to the first item's time limit,
    a loaded machine failed that item (and, the probe being lost with it, every later one)
    while the same limit passed on a quiet one. Runs under the item's thread policy (CPU
    ceilings are per thread count). A failure is left to the item, which reports it with its
    name (`_device_model`); an interrupt still stops the session (the cache is written
    atomically, so nothing half-measured is kept).
    """
    with contextlib.suppress(Exception):
        session.ceilings_for(device)


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
def _cpu_threads(device: str | None, requested: int, record: KernelRecord) -> Iterator[None]:
    """A CPU kernel item runs under the thread policy; a GPU (or skipped) one as it is."""
    if device != "cpu":
        yield None
        return
    with cpu_thread_policy(requested) as threads:
        record.extra["cpu_threads"] = threads
        yield None


@contextlib.contextmanager
def cpu_thread_policy(requested: int) -> Iterator[int]:
    """Run a CPU kernel item with the thread policy's torch thread count (measure.timing.cpu),
    restoring torch's own setting afterwards (ordinary tests in the session keep theirs)."""
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


def _run(
    item: KernelItem,
    session: KernelproSession,
    record: KernelRecord,
    phase: list[str],
    memory: Any,
    choice: DeviceChoice,
) -> None:
    """The stages in order; `phase[0]` names the running one (for the time limit's message)."""
    settings = session.settings
    problem = item.problem
    if choice.device is None and choice.fail:
        raise KernelproError(choice.skip_reason or "no CUDA GPU")
    if choice.device is None:
        pytest.skip(choice.skip_reason or "no device")
    if session.gpu_shared_by_workers and not str(choice.device).startswith("cpu"):
        raise KernelproError(session.gpu_shared_by_workers)
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

    def set_phase(text: str) -> None:
        phase[0] = text
        memory.phase(text)

    # Another plugin's work on the measured item (the optimizer's search).
    session.config.hook.pytest_kernelpro_item_measured(
        run=run, session=session, set_phase=set_phase
    )
    if settings.check:
        phase[0] = "gating (confirmation re-measurement, regression profile)"
        memory.phase("gate")
        baseline = session.baseline()
        gate(
            run,
            settings,
            remeasure,
            lambda pins: remeasure_in_fresh_process(
                item, session, pins, getattr(correctness, "rule_state", None)
            ),
            entry=baseline.entry_for(record) if baseline is not None else None,
            profiling=session.profiling,
        )
    else:
        # In check mode the verdict applies the same floor.
        roofline_floor(run, median_s)


def remeasure_only(
    run: ItemRun,
    config: KernelproConfig,
    kernel: Any,
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    grad_mode: Callable[[], Any],
    capture: AutotuneCapture,
) -> None:
    """The fresh process of a confirmation: one call with the pins applied (the autotuners
    take the baseline's configs from their caches from then on), then the timing, made the
    way the item's own timing is (the same inputs, fresh ones per call checked against the
    reference)."""
    inputs = make_inputs(1_000_003)  # the item's timing inputs
    with capture.watching(), grad_mode():
        try:
            kernel(*inputs)
        except Exception as exc:
            raise KernelproError(
                f"{run.name} raised {describe_exception(exc)} in the re-measuring process"
            ) from exc
    record_process_facts(run, capture)
    # The parent's calibrated rule checks the sampled outputs (fresh_process.py); without it,
    # the dtype's default tolerance would.
    rule = read_rule(config.remeasure_pins)
    parent = None if rule is None else SimpleNamespace(rule_state=rule, tf32=False)
    time_item(
        run, config, kernel, inputs, grad_mode,
        reference=reference, make_inputs=make_inputs, correctness=parent,
    )  # fmt: skip
    capture.after_timing()
    record_process_facts(run, capture)
    run.record.extra["remeasure_child"] = True


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


# The stages: each takes the item's run and values, fills its part of the record, and never
# sees the pytest item or the session (module docstring).


def check(
    run: ItemRun,
    kernel: Any,
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    grad_mode: Any,
) -> Any:
    """The correctness trials; a wrong kernel fails the item here."""
    from pytest_kernelpro.measure.correctness import check_correctness

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
                kernelbench=run.problem.kind == "kernelbench",
            )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(f"{run.name} raised {describe_exception(exc)}") from exc
    run.record.correctness = CorrectnessPart.from_dict(correctness.to_dict())
    if not correctness.passed:
        failure = correctness.failure or "no detail"
        if failure.startswith("The kernel raised"):
            raise KernelproError(f"{run.name}: {failure}")
        raise KernelproError(f"{run.name} is wrong: {failure}")
    return correctness


def time_item(
    run: ItemRun,
    config: KernelproConfig,
    kernel: Any,
    inputs: tuple[Any, ...],
    grad_mode: Any,
    *,
    reference: Any = None,
    make_inputs: Callable[[int], tuple[Any, ...]] | None = None,
    correctness: Any = None,
) -> tuple[float, Callable[[], Any]]:
    """Time the kernel on `inputs`; returns the median and a re-measurement (the gate's
    confirmation times the kernel again the same way). With the reference and the input
    maker, every timed call gets fresh inputs and sampled outputs are checked against the
    reference (`measure.timing.fresh_inputs`); a kernel that did less than its work while
    timed fails here, naming what was seen."""
    from pytest_kernelpro.measure.timing import DishonestTiming, TimingBudget, time_kernel

    settings, device, record = config, run.device, run.record
    budget = TimingBudget(
        warmup_ms=settings.warmup_ms,
        max_time_s=settings.budget_for(device),
        target_rel_ci=settings.target_rel_ci,
        cuda_graph=settings.cuda_graph,
        cpu_flush=settings.cpu_flush,
        clock_anchor=settings.clock_anchor,
        working_set_bytes=_input_bytes(inputs),
        streams=run.problem.extra.get("streams") or "current",
    )
    with grad_mode():
        fresh = _fresh_inputs(run, kernel, inputs, reference, make_inputs, correctness)

    timings = [0]

    def remeasure() -> Any:
        if timings[0] and fresh is not None:
            # A re-measurement: the post-timing re-check wrote other contents into the timed
            # tensors since; the ring's turn must hold again before a call is checked.
            fresh.resume()
        timings[0] += 1
        with grad_mode():
            return time_kernel(lambda: kernel(*inputs), device=device, budget=budget, fresh=fresh)

    try:
        timing = remeasure()
    except DishonestTiming as exc:
        raise KernelproError(f"{run.name} is refused: {exc}") from exc
    except Exception as exc:
        raise KernelproError(f"timing {run.name} failed: {describe_exception(exc)}") from exc
    record.timing = TimingPart.from_dict(timing.to_dict())
    record.device = timing.device
    if timing.threads is not None:
        # Timings with other thread counts are not comparable: the count is part of the device.
        plural = "s" * (timing.threads != 1)
        record.device = f"{timing.device[:-1]}, {timing.threads} thread{plural})"
    return timing.stats.median_s, remeasure


def _fresh_inputs(
    run: ItemRun,
    kernel: Any,
    inputs: tuple[Any, ...],
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]] | None,
    correctness: Any,
) -> Any:
    """The timed call's `FreshInputs`: new content every call from the item's own input maker,
    the outputs of calls chosen after they returned compared with the reference's by the correctness trials' rule (`measure.accuracy`: the
    tolerance the first trial's truth calibrated, else the dtype rule)."""
    import torch

    from pytest_kernelpro.measure.accuracy import CorrectnessRule
    from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs

    check = None
    if reference is not None:
        # The trials' rule, with what their truth calibrated (as the re-check after timing).
        rule = getattr(correctness, "rule_state", None)
        if not isinstance(rule, CorrectnessRule):
            rule = CorrectnessRule(rtol=run.settings.rtol.value, atol=run.settings.atol.value)
            rule.reduced = "tf32" if getattr(correctness, "tf32", False) else None

        def check(got: Any, expected: Any) -> str | None:
            failed = [r for r in rule.judge(torch, got, expected) if not r.ok]
            return " ".join(r.message or "" for r in failed[:2]) if failed else None

    return fresh_inputs(
        torch,
        kernel,
        inputs,
        device=run.device,
        make_draw=make_inputs,
        reference=reference,
        check=check,
        name=run.name,
    )


def roofline_floor(run: ItemRun, median_s: float) -> None:
    """`min_roofline` outside check mode: the gate's one rule (`gate.verdict.roofline_floor`),
    failing the item with the numbers behind it."""
    from pytest_kernelpro.gate.verdict import roofline_floor as floor

    record = run.record
    fails, reason = floor(record.min_roofline, record.efficiency, True)
    if fails and record.efficiency is None:
        raise KernelproError(f"{run.name}: {reason}")
    if fails:
        raise KernelproError(
            f"{run.name} {reason} set in its marker (median {median_s * 1e6:.1f} us vs "
            f"roofline {(record.roofline_time_s or 0) * 1e6:.1f} us)"
        )


def recheck(
    kernel: Any,
    reference: Any,
    inputs: tuple[Any, ...],
    make_inputs: Any,
    run: ItemRun,
    correctness: Any,
) -> None:
    """A kernel must stay correct after it was timed (see `recheck_after_timing`)."""
    from pytest_kernelpro.measure.correctness import recheck_after_timing

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
            f"the reference raised {describe_exception(exc)} when {run.name} was "
            "checked again after timing"
        ) from exc
    if failure is not None:
        raise KernelproError(f"{run.name} is wrong: {failure}")


def roofline(
    run: ItemRun,
    reference: Any,
    inputs: tuple[Any, ...],
    median_s: float,
    memory: Any,
    *,
    ceilings: Ceilings,
    reprobe_ceilings: Callable[[str], Ceilings],
    spec: DeviceSpec | None,
    op_cost_hook: Callable[..., Any],
) -> None:
    """The reference's FLOPs and bytes on the device's `ceilings`: the roofline and the
    kernel's share of it (`reprobe_ceilings(why)` measures them again, once a kernel beats
    untrusted ones)."""
    from pytest_kernelpro.measure.ceilings import exceedance_note, exceeds_every_ceiling
    from pytest_kernelpro.measure.roofline import (
        analyze_reference,
        could_be_impossible,
        impossible_failure,
        record_pricing,
    )

    problem, record = run.problem, run.record

    def analyze(ceilings: Any) -> Any:
        try:
            with memory.reference_run():  # the reference's own peak: part of the footprint
                return analyze_reference(
                    reference,
                    inputs,
                    ceilings=ceilings,
                    flops=problem.flops,
                    bytes=problem.bytes,
                    op_cost_hook=op_cost_hook,
                    spec=spec,
                )
        except KernelproError:
            raise
        except Exception as exc:
            raise KernelproError(
                f"roofline analysis of the reference of {run.name} failed: "
                f"{describe_exception(exc)}; pass flops= and bytes= in the marker to skip counting"
            ) from exc

    analysis = analyze(ceilings)
    record.roofline = RooflinePart.from_dict(analysis.to_dict())
    # A kernel faster than the op-level peak allows is priced at the peak its rate implies
    # (measure/roofline.py); the roofline part keeps the op-level rule's numbers.
    efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    if could_be_impossible(record.peak_used, record.timing) and not ceilings.trusted:
        # Compulsory bytes beyond the bandwidth ceiling: before anything is blamed, re-probe
        # ceilings that load may have lowered (measure/ceilings.py), then price it again.
        ceilings = reprobe_ceilings(f"{run.name} exceeded them")
        if ceilings.trusted:
            analysis = analyze(ceilings)
            record.roofline = RooflinePart.from_dict(analysis.to_dict())
            efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    record.extra["ceilings_trusted"] = ceilings.trusted
    if exceeds_every_ceiling(record.peak_used) and ceilings.device_type == "cpu":
        assert record.peak_used is not None
        record.peak_used["note"] = f"{record.peak_used['note']}; {exceedance_note(ceilings)}"
    record.efficiency = analysis.efficiency(median_s) if efficiency is None else efficiency
    impossible = impossible_failure(
        record.peak_used, ceilings=ceilings, median_s=median_s, timing=record.timing
    )
    if impossible is not None:
        raise KernelproError(f"{run.name}: {impossible}")


def profile(run: ItemRun, profiling: Profiling, device: str | None = None) -> None:
    """ncu, SASS and timeline of the kernel, then the tools' findings and guidance; a
    profiler failure never fails the kernel."""
    device = run.device if device is None else device
    record = run.record
    if not device.startswith("cuda"):
        record.extra["profile_text"] = (
            "profile: not collected: ncu, SASS and timeline need a CUDA GPU"
        )
        record.extra["profile_skipped"] = "no CUDA GPU"
        return
    from pytest_kernelpro.measure.gpu_memory import memory_state, release_cached

    # The profiler runs the kernel in child processes (ncu, kineto): give them the memory
    # this process has cached but does not use; the record says what they had.
    release_cached(device, 0)
    record.extra["profile_gpu_memory"] = memory_state(device)
    try:
        _profile_item(run, profiling, device)
    except Exception as exc:  # a profiler failure never fails the kernel
        record.extra["profile_text"] = f"profile: failed: {describe_exception(exc)}"


def _profile_item(run: ItemRun, profiling: Profiling, device: str) -> None:
    """Fill the record's profile, the tools' findings, guidance and the report text."""
    from pytest_kernelpro.analysis import RooflineFacts, profile_and_analyze
    from pytest_kernelpro.record import ProfilePart

    record = run.record
    capture = profiling.capture
    facts = RooflineFacts.from_roofline(
        record.roofline.to_dict() if record.roofline else None,
        median_s=record.median_s,
        efficiency=record.efficiency,
    )
    analysis = profile_and_analyze(
        run.locator,
        facts,
        so_paths=capture.so_paths if capture else (),
        ptxas=capture.ptxas if capture else (),
        device=device,
        timeout_s=profiling.timeout_s,
        ncu_path=os.environ.get("KERNELPRO_NCU"),
    )
    record.profile = ProfilePart.from_dict(analysis.report.to_dict())
    record.extra["tools"] = analysis.tool_run.to_dict()
    record.extra["profile_wall_s"] = analysis.profile_s
    record.guidance = analysis.guidance_md or None
    record.extra["profile_text"] = analysis.text


def gate(
    run: ItemRun,
    config: KernelproConfig,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any] | None = None,
    *,
    entry: BaselineEntry | None,
    profiling: Profiling,
) -> None:
    """The verdict against the baseline `entry` (a regression is confirmed by timing it again,
    in a fresh process by default, with the baseline's autotune choices pinned, and
    profiled); a failing verdict fails the item."""
    from pytest_kernelpro.gate.confirmation import (
        compare_choices,
        confirm,
        name_environment,
        needs_confirmation,
        note_picks,
        settle,
    )
    from pytest_kernelpro.gate.verdict import compare
    from pytest_kernelpro.measure.roofline import kernel_efficiency

    record = run.record
    cross_cpu = config.cpu_cross_device
    verdict = compare(record, entry, threshold=record.threshold, cross_cpu=cross_cpu)
    picks = compare_choices(
        record.autotune.choices if record.autotune else None,
        entry.autotune if entry is not None else None,
    )
    if needs_confirmation(verdict) and entry is not None:
        first_change = verdict.change
        timing, remeasured = _confirmation_timing(
            run, config, remeasure, fresh_remeasure, picks.baseline_choices
        )
        confirmed = KernelRecord.from_dict(record.to_dict())
        confirmed.timing = timing
        if record.roofline_time_s is not None and timing.median_s is not None:
            confirmed.efficiency = kernel_efficiency(record.roofline, timing.median_s)
        verdict = confirm(verdict, confirmed, entry, cross_cpu=cross_cpu, where=remeasured.words())
        record.extra["confirmation_timing"] = timing.to_dict()
        verdict = settle(verdict, picks, remeasured, config.autotune_mismatch, first_change)
    elif entry is not None:
        verdict = note_picks(verdict, picks)
    if entry is not None:
        verdict = name_environment(
            verdict,
            record.environment.to_dict() if record.environment else None,
            entry.environment,
            record.autotune.library if record.autotune else None,
            entry.library,
        )

    record.gate = VerdictPart.from_dict(verdict.to_dict())
    if verdict.failed and verdict.status == "regressed" and record.profile is None:
        _auto_profile(run, profiling)
    if verdict.failed:
        raise KernelproError(f"{record.name}: {verdict.message}")


def _confirmation_timing(
    run: ItemRun,
    config: KernelproConfig,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any] | None,
    pins: tuple[dict[str, Any], ...],
) -> tuple[TimingPart, Any]:
    """The confirmation's timing and how it was made: in a fresh process with `pins` (the
    baseline's autotune choices) when the setting says so and the process gives a timing,
    else in this process (the fallback says why)."""
    from pytest_kernelpro.gate.confirmation import Remeasurement

    fallback = None
    if config.confirm_process == "fresh" and fresh_remeasure is not None:
        fresh = fresh_remeasure(list(pins))
        if fresh.timing is not None:
            autotune = fresh.autotune or {}
            return TimingPart.from_dict(fresh.timing), Remeasurement(
                fresh=True,
                wall_s=round(fresh.wall_s, 3),
                choices=tuple(autotune.get("choices") or ()),
                pin_problems=tuple(autotune.get("pin_problems") or ()),
                pinned_requested=bool(pins),
            )
        fallback = f"the fresh process gave no timing ({fresh.error}); re-measured in this one"
        run.record.extra["confirmation_fresh_process_error"] = fresh.error
    started = time.perf_counter()
    timing = TimingPart.from_dict(remeasure().to_dict())
    wall = round(time.perf_counter() - started, 3)
    return timing, Remeasurement(fresh=False, wall_s=wall, fallback=fallback)


def _auto_profile(run: ItemRun, profiling: Profiling) -> None:
    """A regression comes with its profile (what changed, in the counters' words), within the
    session's budget of automatic profiles; past it, the record says how to profile it."""
    record = run.record
    if not profiling.auto_profile_allowed():
        record.extra["profile_text"] = (
            f"profile: not collected automatically: {profiling.auto_done} regressed "
            f"kernel(s) were already profiled in {profiling.auto_spent_s:.0f} s (budget: "
            f"--kernelpro-auto-profiles={profiling.auto_limit}, "
            f"--kernelpro-auto-profile-time={profiling.auto_time_s:g}). Profile this one "
            f"with: pytest {shlex.quote(run.nodeid)} --kernelpro-profile"
        )
        return
    started = time.perf_counter()
    try:
        profile(run, profiling, record.device_kind)
    finally:
        profiling.auto_done += 1
        profiling.auto_spent_s += time.perf_counter() - started


def _input_bytes(inputs: tuple[Any, ...]) -> int:
    """Bytes of the tensors among the inputs (the working set of a CPU cache flush)."""
    total = 0
    for value in inputs:
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
    return total
