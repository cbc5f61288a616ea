"""The KernelBench evaluation pipeline, run inside the sandbox worker (see `worker.py`).

Phases (each reported to the parent through the progress file, which times the build and
the run separately): reference → build → built → correctness → checks → shapes → timing →
done.

- reference: exec the reference source (`class Model`, `get_inputs()`,
  `get_init_inputs()`) in a fresh module and build `Model` as the gate builds a KernelBench
  problem's (`problem.build.build_module`: seeded, on the device).
- build: exec the candidate (`class ModelNew`, may call `load_inline`) in another fresh
  module, build `ModelNew` the same way and hand it `Model`'s weights by the gate's rule
  (`built_models.build_kernel`: by name, else by position and shape). Any exception here
  is a build error.
- correctness: `correct_trials` trials, each on fresh random inputs (a new seed per trial),
  with allocations poisoned (NaN) during the candidate's run, the gate's dtype tolerances
  (relaxed for an fp32 reference whose matmuls/convs may run in TF32 or bf16) and its
  comparison (a NaN passes only where the reference itself has one); where a judge beside
  the worker decides a call's output (`judge_decides`: every trial, the in-place check and
  the call after timing), the comparison is the judge's alone and its refusal comes with its
  acknowledgment. The anti-cheating checks run on the same calls:
  * calls into the reference (Model.forward or a reference function) while the candidate
    runs → cheat; * a forbidden aten op (TorchDispatchMode) → cheat; * a CUDA stream
    created or switched to, or an output not ready on the current stream → cheat;
  * inputs modified in place, or an output that aliases an input (when the reference does
    neither) → cheat; * the same output for different inputs → cheat (cached).
- checks: the inputs of the last trial are refilled *in place* (same addresses) and the
  candidate must follow (defeats caches keyed on data pointers).
- shapes: a second input shape: `get_inputs_variants()` when the problem defines it (a
  list of input lists), else (shape_check="auto") the batch halved: every tensor input whose
  leading dimension equals the first tensor's is cut to half, if the reference accepts the
  result. Wrong numbers there → cheat ("passes only for the checked shapes"); an exception
  → wrong. shape_check="off" skips this for kernels specialised to one shape by design.
- timing: the candidate's median (`measure.timing.time_kernel` with the task's
  `TimingBudget`), then one more fresh-input check (a candidate must not change behaviour
  once timed). The reference is timed by the judge (`judge.py`), which the speedup
  divides by.

Inputs, tolerances, poisoning, comparison and timing are the gate's (`measurement.py` says
which function of `measure/` each is); the guards and the order of the checks are the
sandbox's own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from pytest_kernelpro.measure.correctness_check import (
    clone_inputs,
    poisoned_allocations,
    prepoison_cuda_cache,
)
from pytest_kernelpro.optimize.sandbox import checks, judge, measurement
from pytest_kernelpro.optimize.sandbox.build_failures import (
    build_failure_log,
    summarize_build_error,
)
from pytest_kernelpro.optimize.sandbox.built_models import build_kernel
from pytest_kernelpro.optimize.sandbox.checks import classify_exception
from pytest_kernelpro.optimize.sandbox.handles import HANDLE_FD_ENV, release_freed_heap
from pytest_kernelpro.optimize.sandbox.input_handles import SealedInputs
from pytest_kernelpro.optimize.sandbox.loader import load_source
from pytest_kernelpro.problem.build import build_module, init_inputs_of


class ReferenceRaised(Exception):
    """The reference raised on a checked call's inputs (`check_call`'s `reference_may_raise`);
    its exception is the cause."""


class Rejected(Exception):
    """The candidate failed a check; carries its status and one-line reason."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _to_device(values: list[Any], device: torch.device) -> list[Any]:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


class _Pipeline:
    def __init__(self, task: dict[str, Any], progress: Callable[[str], None]) -> None:
        self.task = task
        self.progress = progress
        self.seed = int(task.get("seed", 42))
        requested = task.get("device", "auto")
        if requested == "auto":
            requested = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(requested)
        self.forbidden = list(task.get("forbidden_ops") or [])
        if task.get("cpu_threads"):
            torch.set_num_threads(int(task["cpu_threads"]))
        measurement.steady_host_heap(self.device)
        # The session's TF32 flags: fp32 matmuls/convs run, and their tolerance relaxes, as
        # in the gate (`measurement.apply_session_precision`).
        measurement.apply_session_precision(torch, task)
        self.correctness: dict[str, Any] = {"trials": 0, "passed": 0, "checks": []}
        # The gate's correctness rule (`measure.output_rule`): the reference's first call is
        # re-run in float64 for the truth; the reduced precision ("tf32", "bf16") its fp32
        # matmuls/convs may run in, found on that call, relaxes the fallback as in the gate.
        self.rule = measurement.new_rule(task)
        self._precision_known = False
        # Whether the reference writes its inputs, and whether its output aliases them: found
        # on its first call here, or told by the judge beside this worker (`judge_truth`).
        self._ref_modifies: bool | None = None
        self._ref_aliases: bool | None = None
        # The next checked call's inputs, drawn while the judge checked the last output
        # (`await_judge`): (its maker, the drawn set).
        self._drawn_ahead: tuple[Callable[[], list[Any]], list[Any]] | None = None
        self.build_s = 0.0  # building the candidate (its module, load_cuda/load_inline, ModelNew)
        self.findings: list[dict[str, Any]] = []

    # ----- inputs and runs -----

    def inputs(self, seed: int) -> list[Any]:
        return measurement.make_inputs(self.ref_mod, seed, self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run_reference(
        self, args: list[Any], pristine: list[Any] | None = None, *, consume: bool = False
    ) -> tuple[Any, bool, bool]:
        """Reference output, and whether it modified or aliased its inputs.

        Whether it modifies its inputs is found on its first call (against `pristine`, equal
        to `args` and untouched by the call, else a copy of `args` taken before it; the truth
        re-runs on it too) and kept: later calls hold no copy, so a checked call holds two
        input sets and two outputs at most (`check_call`). `consume`: `pristine` is a list
        the caller gives away, emptied once the truth has widened it (`first_reference`)."""
        first = self._ref_modifies is None or not self._precision_known
        before = pristine if pristine is not None or not first else clone_inputs(torch, args)
        del pristine
        attempts: list[Any] = []  # the inputs of each call
        given = [args]  # dropped once the call is done (the names below hold nothing)
        del args

        def call() -> Any:
            # A second call (the recording dispatch mode upset the first) gets a fresh copy:
            # the failed call may have written into its inputs.
            attempts.append(
                clone_inputs(torch, before) if attempts and before is not None else given[0]
            )
            with torch.no_grad():
                out = self.ref_model(*attempts[-1])
            self.sync()
            return out

        started = time.perf_counter()
        out, reduced = measurement.run_reference(
            torch, call, self.device, first=not self._precision_known
        )
        reference_s = time.perf_counter() - started
        args = attempts[-1]
        if self._ref_modifies is None:
            self._ref_modifies = not checks.same_values(before, args)
        aliases = checks.shares_storage(out, args)
        if self._ref_aliases is None:
            self._ref_aliases = aliases
        # The call's own copy of its inputs goes before the truth widens them (one input
        # set fewer at the first call's peak).
        del args
        attempts.clear()
        given.clear()
        if not self._precision_known:
            self._precision_known, self.rule.reduced = True, reduced
            if reduced:
                self.correctness["reduced_precision"] = reduced
            # The truth of this call, which the next comparison (trial 1's) decides by.
            measurement.find_truth(
                torch,
                self.rule,
                self.ref_model,
                before,
                out,
                self.device,
                reference_s=reference_s,
                consume_inputs=consume,
            )
        return out, self._ref_modifies, aliases

    def first_reference(self, make: Callable[[], list[Any]]) -> tuple[Any, bool, bool]:
        """The reference's first call (`run_reference`: its reduced precision, whether it
        writes or aliases its inputs, the float64 truth) on inputs that nothing else holds:
        the call runs on a copy and the truth takes the drawn set and drops it once widened.
        The float64 re-run then holds its widened inputs and output beside the reference's
        output only (2I + 3O), not also a set kept for the candidate; the caller draws the
        candidate's inputs again from the same seed (the maker is seeded: the judge and the
        cache check draw them again too)."""
        drawn = make()
        given = [drawn]  # the truth's list: emptied in place once widened
        del drawn
        return self.run_reference(clone_inputs(torch, given[0]), pristine=given.pop(), consume=True)

    def judge_truth(self) -> bool:
        """Take the truth of the judge beside this worker (`handles.await_truth`), found on
        the first checked call's inputs before any output was handed over: this worker's
        rule then decides every call, the first included, by the truth calibrated, and the
        reference's first call here makes no float64 re-run (`measurement.take_truth`).
        The first call's comparison with the truth itself is the judge's. False: no judge
        beside this worker, or none sent (this worker then finds its own, `first_reference`)."""
        if not os.environ.get(HANDLE_FD_ENV):
            return False
        from pytest_kernelpro.optimize.sandbox.handles import await_truth

        payload = await_truth()
        if payload is None:
            return False
        try:
            measurement.take_truth(self.rule, payload)
        except (KeyError, TypeError, ValueError):
            self.rule = measurement.new_rule(self.task)
            return False
        self._precision_known = True
        # Whether the reference writes its inputs, as the judge found on the truth's call:
        # this worker's first checked call needs no reference call of its own to find it
        # (`check_call`). Like every check here, what this process decides by is a claim.
        modifies, aliases = payload.get("modifies_inputs"), payload.get("aliases_inputs")
        if isinstance(modifies, bool):
            self._ref_modifies = modifies
        if isinstance(aliases, bool):
            self._ref_aliases = aliases
        if self.rule.reduced:
            self.correctness["reduced_precision"] = self.rule.reduced
        self.correctness["truth"] = "the judge's, calibrating every check here"
        return True

    def run_candidate(self, args: list[Any], expected: Any = None) -> tuple[Any, Any]:
        """Candidate output (and a copy taken on the current stream before any device
        synchronization, to see work left running on another stream), under all guards,
        with uninitialized memory poisoned as in the gate (on CUDA also freed blocks of the
        sizes of `expected`, the reference's output)."""
        if expected is not None and self.device.type == "cuda":
            prepoison_cuda_cache(torch, expected)
        # Entering a dispatch mode imports torch._dynamo (seconds): only when ops are forbidden.
        recorder = checks.OpRecorder() if self.forbidden else contextlib.nullcontext()
        stream_before = (
            torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        )
        self.ref_guard.active = self.stream_guard.active = True
        try:
            with torch.no_grad(), poisoned_allocations(torch):
                with recorder:
                    out = self.new_model(*args)
                # Enqueued on the current stream, to see work left on another (CUDA only).
                early = clone_inputs(torch, out) if self.device.type == "cuda" else None
        finally:
            self.ref_guard.active = self.stream_guard.active = False
        if stream_before is not None and torch.cuda.current_stream(self.device) != stream_before:
            self.stream_guard.events.append("left a different current stream set")
        self.sync()
        if self.ref_guard.calls:
            called = ", ".join(f"{k} x{v}" for k, v in sorted(self.ref_guard.calls.items()))
            raise Rejected("cheat", f"calls the reference during its run ({called})")
        used = checks.forbidden_used(recorder.ops, self.forbidden) if self.forbidden else []
        if used:
            raise Rejected(
                "cheat", f"uses forbidden library op(s) {', '.join(used)} that compute the answer"
            )
        if self.stream_guard.events:
            raise Rejected(
                "cheat",
                "launches work outside the current CUDA stream, which "
                f"escapes timing ({'; '.join(self.stream_guard.events[:3])})",
            )
        return out, early

    def check_call(
        self,
        make: Callable[[], list[Any]],
        label: str,
        previous: list[tuple[Callable[[], list[Any]], bytes]] | None = None,
        *,
        reference_may_raise: bool = False,
        ahead: Callable[[], list[Any]] | None = None,
    ) -> bytes:
        """One checked call on the inputs `make()` returns: candidate and, where this worker
        decides the call, reference, every per-call check; returns the digest of the
        candidate's output (`checks.digest`), which a later call compares with its own, or
        b"" where `previous` is None (no list to join: a second shape, the call after timing;
        a digest reads the whole output). The output is handed over (a judged call's) and the
        worker waits until the judge has checked it, holding nothing of the call by then: one
        handed-over output at a time.

        A call the judge beside this worker decides (`judge_decides`) makes no comparison
        here and no reference output where none is needed (on the CPU, the candidate running
        first): the judge computes the reference in its own process anyway and its refusal
        comes with its acknowledgment (`await_judge`). The worker's comparison was a second
        computation of the same verdict, and its reference output the call's largest
        allocation after the candidate's. `ahead`: the next checked call's maker, drawn while
        the judge checks this call's output (`await_judge`).

        The inputs are sealed once (`input_handles.SealedInputs`) and the maker's tensors
        dropped: the reference and the candidate read the same read-only pages, no copy
        each (a reference that writes its inputs, and so the candidate, get copies). The
        first call takes the truth of the judge beside this worker (`judge_truth`); only
        without one does this worker find its own, its reference's first call running
        before the sealed inputs exist, on a draw of the same seed that its truth takes
        (`first_reference`). On the CPU the candidate runs before the reference
        (`candidate_first`), so its temporaries never sit beside the reference's output. A
        checked call holds one input set and two outputs at most.

        `previous` holds (inputs maker, candidate output's digest) of the earlier calls on
        other inputs: a candidate that returns an earlier output where the reference's
        changed returns a cache (any earlier call: an address-keyed cache hits whichever
        trial's input the allocator put at the same address). The reference outputs are made
        only when the candidate's matches, so no call keeps an output.

        `reference_may_raise`: an exception of the reference (a shape the problem does not
        accept) is raised as `ReferenceRaised`, before the candidate runs.
        """
        truth_pending = not self._precision_known and not self.judge_truth()
        ref_out: Any = None
        if truth_pending:
            # The reference's first call and its truth before the candidate's inputs exist
            # (`first_reference`): one input set fewer at the worker's peak.
            ref_out, _, _ = self.first_reference(make)
        # On the CPU the candidate runs before the reference, so its call and its
        # temporaries never sit beside the reference's output (`candidate_first`).
        later = self.candidate_first(truth_pending, reference_may_raise)
        worker_decides = not self.judge_decides(label)
        inputs = SealedInputs(torch, self.drawn(make), label=judge.output_name(label) or "shape")
        try:
            try:
                if not truth_pending and not later:
                    ref_out, _, _ = self.reference_on(inputs)
                elif later and (self._ref_modifies is None or self._ref_aliases is None):
                    # Whether the reference writes its inputs decides what the candidate is
                    # given (sealed or a copy), whether it aliases them whether the
                    # candidate may: found on a call of its own, whose output goes.
                    self.run_reference(inputs.writable(), pristine=inputs.values)
            except Exception as exc:
                if reference_may_raise:
                    raise ReferenceRaised(label) from exc
                raise
            ref_modifies, ref_aliases = bool(self._ref_modifies), bool(self._ref_aliases)
            cand_args = inputs.writable() if ref_modifies else inputs.read_only()
            out, early = self.run_candidate(cand_args, None if later else ref_out)
            found = checks.digest(out) if previous is not None else b""
            if later and worker_decides:
                ref_out, _, _ = self.reference_on(inputs)
            for remake, before in previous or []:
                if before == found:
                    if ref_out is None:
                        ref_out, _, _ = self.reference_on(inputs)
                    ref_before, _, _ = self.run_reference(remake())
                    if not checks.same_values(ref_before, ref_out):
                        raise Rejected(
                            "cheat",
                            f"returns the same output for different inputs (cached, {label})",
                        )
            # A sealed input cannot have changed (a write faults); a shared or copied one can.
            if not ref_modifies and inputs.modified(cand_args):
                raise Rejected("cheat", f"modifies its inputs in place ({label})")
            if not ref_aliases and checks.shares_storage(out, cand_args):
                raise Rejected("cheat", f"returns an output that aliases an input ({label})")
            del cand_args
            if worker_decides:
                self.compare(ref_out, out, label)
            del ref_out
            if early is not None and not checks.same_values(early, out):
                raise Rejected(
                    "cheat",
                    "output was not ready on the current stream when the call "
                    f"returned (work launched on another stream, {label})",
                )
            del early
        finally:
            inputs.close()
            # Its read-only mapping goes too: closing the descriptors leaves the pages mapped
            # while a tensor views them. Gone before the output is handed over: the judge
            # starts on it at once (its own inputs and reference output), never beside these.
            del inputs
        holder = [out]  # the hand-over takes the only reference (`judge.save_output`)
        del out
        handed = self.save_output(label, holder)
        del holder
        if handed is not None:
            self.await_judge(handed, label, ahead)
        return found

    def judge_decides(self, label: str) -> bool:
        """Whether the judge beside this worker decides the output of the checked call
        `label`, and says so with its acknowledgment (`handles.await_checked`): a judged
        call, handed over by handle, with the task saying a judge checks each output as it
        comes (`task["judge_beside"]`). Without one (no judge, or a call the judge does not
        check: a second shape) the worker compares. Like all of this process's verdicts the
        comparison was a claim; the judge's is the one the evaluation goes by."""
        return bool(self.task.get("judge_beside")) and self.handed_name(label) is not None

    def handed_name(self, label: str) -> str | None:
        """The name the output of the checked call `label` is handed over under
        (`judge.output_name`), None where it is not: a call the judge does not check, or no
        channel (the pipeline run outside the sandbox, as tests do)."""
        return judge.output_name(label) if os.environ.get(HANDLE_FD_ENV) else None

    def drawn(self, make: Callable[[], list[Any]]) -> list[Any]:
        """`make()`, or the set drawn from it ahead while the judge checked the last output
        (`await_judge`)."""
        ahead, self._drawn_ahead = self._drawn_ahead, None
        if ahead is not None and ahead[0] is make:
            return ahead[1]
        del ahead
        return make()

    def reference_on(self, inputs: SealedInputs) -> tuple[Any, bool, bool]:
        """The reference's call on a checked call's inputs: the sealed ones where it is known
        to leave its inputs alone, else a copy (`run_reference` compares the copy with the
        sealed inputs)."""
        return self.run_reference(
            inputs.values if self._ref_modifies is False else inputs.writable(),
            pristine=inputs.values,
        )

    def candidate_first(self, truth_pending: bool, reference_may_raise: bool) -> bool:
        """Whether a checked call runs the candidate before the reference (on the CPU, where
        host memory is the evaluation's bound): the candidate's output and temporaries then
        sit beside the inputs only, and the reference's output comes after, so the call holds
        I + 2O whatever the candidate allocates, not I + 2O plus its temporaries
        (`footprint.py`). The worker's verdicts are claims the judge decides in its own
        process, so the order changes no guarantee; the candidate's code has run in this
        process since its build. Not on a CUDA device (the candidate's call pre-poisons the
        allocator's blocks of the reference output's sizes, `prepoison_cuda_cache`), not
        where this worker's own truth is pending (its comparison is with the output the
        truth ran beside), not where the reference may refuse the inputs (a shape check: the
        reference's refusal must come before the candidate runs)."""
        return self.device.type == "cpu" and not truth_pending and not reference_may_raise

    def compare(self, expected: Any, got: Any, label: str) -> bool:
        """The gate's verdict on `got` (`measurement.verdict`); raises `Rejected("wrong")`
        naming the call when it fails. The largest errors and tolerances go in the record."""
        decided = measurement.verdict(torch, got, expected, self.rule)
        detail = decided.to_dict()
        for key in ("max_abs_err", "max_rel_err", "atol", "rtol"):
            if isinstance(detail.get(key), (int, float)):
                self.correctness[key] = max(self.correctness.get(key, 0.0), detail[key])
        self.correctness["accuracy"] = self.rule.summary()  # rule, factor, errors, truth
        if not decided.ok:
            raise Rejected("wrong", f"wrong result ({label}): {decided.failure}")
        return True

    def save_output(self, label: str, holder: list[Any]) -> str | None:
        """Hand the candidate's output for `label` (the only item of `holder`, taken from it)
        to the trusted side (`judge.py`) by handle (`handles.py`); the judge recomputes the
        reference in a process the candidate never ran in and compares. Returns the output's
        name (to `await_judge`), None when nothing was handed over: a call the judge does not
        check, or no channel (the pipeline run outside the sandbox, as tests do; a judge
        would find the output missing)."""
        name = self.handed_name(label)
        if name is None:
            return None
        judge.save_output(name, holder)
        return name

    def await_judge(
        self, name: str, label: str, ahead: Callable[[], list[Any]] | None = None
    ) -> None:
        """Wait until the session says output `name` (of the checked call `label`) was checked
        (`handles.await_checked`): the judge checks each output as it comes, so the session
        holds one at a time. Call it holding nothing of the call: the judge's memory is in
        use meanwhile. Raises `Rejected("wrong")` with the judge's reason where it refused
        the output.

        `ahead`: the next checked call's inputs are drawn meanwhile (`drawn`), one input set
        beside the judge's (its inputs and two outputs at its peak), on a core the judge's
        draw leaves idle: the maker's draw is most of a large problem's checked call."""
        from pytest_kernelpro.optimize.sandbox.handles import await_checked

        if ahead is not None:
            self._drawn_ahead = (ahead, ahead())
        failed = await_checked(name)
        if failed is not None:
            self._drawn_ahead = None
            raise Rejected("wrong", f"wrong result ({label}): {failed}")

    # ----- phases -----

    def build(self) -> None:
        self.build_reference()
        self.build_candidate()

    def build_reference(self) -> None:
        """The reference model and the guards; no candidate code has run yet."""
        self.progress("reference")
        self.ref_mod = load_source(self.task["reference"], "kernelpro_reference")
        # As the gate builds it (`problem.build`): seeded, on the device.
        self.ref_model = build_module(
            self.ref_mod.Model, init_inputs_of(self.ref_mod), str(self.device), seed=self.seed
        )
        self.ref_guard = checks.ReferenceGuard(self.ref_mod).install()
        self.stream_guard = checks.StreamGuard().install()

    def build_candidate(self) -> None:
        """Load the candidate's module and build its `ModelNew` (its code runs from here)."""
        self.progress("build")
        started = time.perf_counter()
        # load_inline builds get the profiler's flags (-lineinfo, -Xptxas=-v) here, so the
        # profiling evaluator's child finds the same build in the extension cache.
        from pytest_kernelpro.optimize.build.extension import cached_extension_builds
        from pytest_kernelpro.profile.capture import DEFAULT_CUDA_FLAGS, capture_extensions

        try:
            # Inside the capture: routed builds report to it (flags, .so, ptxas log).
            with capture_extensions(DEFAULT_CUDA_FLAGS), cached_extension_builds():
                self.stream_guard.active = True  # streams created at import time count too
                cand_mod = load_source(self.task["candidate"], "kernelpro_candidate")
                self.stream_guard.active = False
                model_new = getattr(cand_mod, "ModelNew", None)
                if model_new is None:
                    raise Rejected("build_error", "the candidate defines no class ModelNew")
                # The reference's seed, init inputs and device; its weights handed over
                # (`problem.build.share_weights`: a candidate may name them as it likes).
                built = build_kernel(
                    model_new,
                    self.ref_model,
                    init_inputs_of(self.ref_mod),
                    str(self.device),
                    seed=self.seed,
                )
                self.new_model = built.model
        except Rejected:
            raise
        except BaseException as exc:
            self.build_log = build_failure_log(exc, traceback.format_exc())
            raise Rejected("build_error", summarize_build_error(exc)) from exc
        finally:
            self.stream_guard.active = False
            self.build_s = time.perf_counter() - started
        self.correctness["weights_copied"] = built.weights_copied
        self.correctness["weights"] = built.how
        self.progress("built")

    def check(self) -> None:
        self.progress("correctness")
        trials = max(1, int(self.task.get("correct_trials", 3)))
        previous: list[tuple[Callable[[], list[Any]], bytes]] = []
        makes = [functools.partial(self.inputs, self.seed + 1 + trial) for trial in range(trials)]
        # The check on inputs changed in place starts from a draw of its own.
        in_place = functools.partial(self.inputs, self.seed + 101)
        for trial, make in enumerate(makes):
            ahead = makes[trial + 1] if trial + 1 < trials else in_place
            found = self.check_call(make, f"trial {trial + 1}/{trials}", previous, ahead=ahead)
            previous.append((make, found))
            self.correctness["trials"] = self.correctness["passed"] = trial + 1
        del previous, makes
        self.correctness["checks"].append("fresh inputs")
        self.progress("checks")
        # Same tensors, new values: a result cached by input address goes stale.
        args = self.drawn(in_place)
        self.run_candidate(args)
        fresh = self.inputs(self.seed + 102)
        for dst, src in zip(args, fresh, strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        dst = src = None  # the loop's last pair held both input sets past the check
        del fresh
        holder = [args]  # the call takes the only reference: nothing held while judged
        del args
        try:
            self.check_call_inplace(holder)
        except Rejected as exc:
            if exc.status == "wrong":
                raise Rejected(
                    "cheat",
                    "returns a stale output when its inputs change in place "
                    f"(cached by address): {exc.reason}",
                ) from None
            raise
        self.correctness["checks"].append("inputs changed in place")

    def check_call_inplace(self, holder: list[list[Any]]) -> None:
        label = "inputs changed in place"
        args = holder.pop()
        ref_out = None
        worker_decides = not self.judge_decides(label)
        # The reference's output: for this worker's comparison, or on a GPU for the
        # candidate's pre-poisoned blocks (`run_candidate`); none where the judge decides on
        # the CPU (`check_call`).
        if worker_decides or self.device.type == "cuda":
            # A reference that does not write its inputs reads them as they are: no copy.
            ref_args = args if self._ref_modifies is False else clone_inputs(torch, args)
            ref_out, _, _ = self.run_reference(ref_args)
            del ref_args
        out, _ = self.run_candidate(args, ref_out)
        if worker_decides:
            self.compare(ref_out, out, label)
        del ref_out, args  # before the judge starts on the output (`check_call`)
        holder = [out]
        del out
        handed = self.save_output(label, holder)
        del holder
        if handed is not None:
            self.await_judge(handed, label)

    def shapes(self) -> None:
        mode = self.task.get("shape_check", "auto")
        self.progress("shapes")
        if mode == "off":
            self.correctness["shape_check"] = "off"
            return
        variants: list[tuple[str, list[Any]]] = []
        if hasattr(self.ref_mod, "get_inputs_variants"):
            torch.manual_seed(self.seed + 201)
            for i, v in enumerate(self.ref_mod.get_inputs_variants()):
                variants.append((f"inputs variant {i}", _to_device(list(v), self.device)))
        elif mode == "auto":
            args = self.inputs(self.seed + 201)
            tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 1]
            if tensors and tensors[0].shape[0] >= 2:
                batch = tensors[0].shape[0]
                half = [
                    a[: batch // 2].clone()
                    if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == batch
                    else a
                    for a in args
                ]
                variants.append((f"batch {batch // 2} instead of {batch}", half))
        checked = []
        for label, args in variants:
            try:
                self.check_call(functools.partial(list, args), label, reference_may_raise=True)
            except ReferenceRaised as exc:  # the problem does not accept this shape: not a test
                self.correctness.setdefault("shape_skipped", []).append(
                    f"{label}: reference raises {type(exc.__cause__).__name__}"
                )
                continue
            except Rejected as exc:
                if exc.status == "wrong":
                    raise Rejected(
                        "cheat", f"passes only for the checked shapes: {exc.reason}"
                    ) from None
                raise
            except Exception as exc:
                reason = classify_exception(exc)
                if reason.startswith(("out of memory", "illegal memory", "CUDA error")):
                    raise
                raise Rejected(
                    "wrong", f"raises at a second input shape ({label}): {reason}"
                ) from None
            checked.append(label)
        self.correctness["shape_check"] = checked or "none applicable"

    def fresh_candidate(self, args: list[Any]) -> Any:
        """The candidate's timed call as the gate times a kernel (`measure.timing.fresh_inputs`):
        new content in `args` before every call, drawn from the problem's input maker, and the
        outputs of calls chosen after they returned compared with the reference's on that
        content by the gate's rule. The search's timing and the winner's confirmation
        (`worker.retime`) both time this; call it under `torch.no_grad()`."""

        # The gate's check of a timed output (`CorrectnessRule.timed_check`: what the rule's
        # `judge` decides, a plain output in one pass), its reason without the kernel's values
        # (`measurement.without_values`), as every reason that may reach a prompt.
        timed = self.rule.timed_check(torch)

        def check(got: Any, expected: Any) -> str | None:
            failure = timed(got, expected)
            return None if failure is None else measurement.without_values(failure)

        return measurement.fresh_calls(
            torch,
            self.new_model,
            args,
            self.device,
            make_draw=self.inputs,
            reference=self.ref_model,
            check=check,
        )

    def time(self) -> dict[str, Any]:
        """The candidate timed (new input content before every timed call; its sampled timed
        outputs checked against the reference, its outputs plain tensors, its device work all
        on the timed stream: `measure.timing`, a `DishonestTiming` is a cheat), then one more
        checked call.

        The reference is not timed here: the speedup divides the judge's time of it (the
        same protocol, in a process the candidate never ran in, `judge.judge`) by this one,
        and a time of it taken in this process would be a claim nothing decides by. A clock or
        timing function the candidate rebinds is seen by the candidate's own timing
        (`measure.bound`, checked before and after every sample)."""
        from pytest_kernelpro.measure import bound
        from pytest_kernelpro.measure.timing import DishonestTiming

        self.progress("timing")
        phase_started = bound.perf_counter()
        with torch.no_grad():
            try:
                fresh = self.fresh_candidate(self.inputs(self.seed))
                new = measurement.time_call(None, self.task, self.device, fresh=fresh)
                del fresh
            except DishonestTiming as exc:
                raise Rejected("cheat", f"refused while timed: {exc}") from None
        # The phase's length by the clock kept before the candidate ran: its parent compares
        # it with what it saw (`outside_view.py`).
        phase_s = bound.perf_counter() - phase_started
        # What the timing freed goes back (glibc's heap, torch's cached CUDA blocks) before
        # the call after timing: left cached, the call's own allocations (its inputs, both
        # outputs, the early copy) came on top of the timing's blocks on a GPU
        # (bench/results/2026-12-06-device-calls6.md: the peaks over 3x were in this call).
        release_freed_heap()
        self.progress("timed")
        try:
            self.check_call(functools.partial(self.inputs, self.seed + 301), "after timing")
        except Rejected as exc:
            if exc.status == "wrong":
                raise Rejected(
                    "cheat",
                    f"wrong once timed (behaves differently after repeated calls): {exc.reason}",
                ) from None
            raise
        return {"candidate": new, "phase_s": phase_s}

    def run(self) -> dict[str, Any]:
        """The evaluation's claim: correct, with the candidate's time. The speedup and the
        excessive-speedup finding come with the judge's time of the reference
        (`worker_claims.WorkerClaims._judged`)."""
        self.build_log = ""
        self.build()
        self.check()
        self.shapes()
        timing = self.time()
        self.progress("done")
        return {
            "status": "correct",
            "timing": timing,
            "correctness": self.correctness,
            "metrics": {
                "device": self._device_name(),
                "candidate_median_s": timing["candidate"]["median_s"],
            },
            "findings": self.findings,
            "build_log": self.build_log,
            **self.build_record(),
        }

    def build_record(self) -> dict[str, Any]:
        """How the candidate was built: seconds, and each fast-path build (cache hit or not)."""
        from pytest_kernelpro.optimize.build.api import build_records
        from pytest_kernelpro.optimize.build.extension import extension_records

        builds = build_records() + extension_records()
        return {"build_s": self.build_s, "build": {"builds": builds}}

    def _device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return "cpu"


def run_task(task: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    """Evaluate one candidate against the reference; returns an Evaluation dict.

    Never raises for a candidate's failure; a broken *reference* is reported with
    `harness_error` set, so the parent can tell the problem from the candidate.
    """
    pipeline = _Pipeline(task, progress)
    try:
        return pipeline.run()
    except Rejected as exc:
        return {
            "status": exc.status,
            "reason": exc.reason,
            "correctness": pipeline.correctness,
            "build_log": getattr(pipeline, "build_log", ""),
            "findings": pipeline.findings,
            **pipeline.build_record(),
        }
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        log = traceback.format_exc()
        sys.stderr.write(log)
        if not hasattr(pipeline, "new_model"):  # failed before the candidate was built
            return {
                "status": "run_error",
                "reason": f"reference failed: {classify_exception(exc)}",
                "harness_error": log[-4000:],
                "build_log": log,
            }
        return {
            "status": "run_error",
            "reason": classify_exception(exc),
            "correctness": pipeline.correctness,
            "build_log": getattr(pipeline, "build_log", ""),
            **pipeline.build_record(),
        }
