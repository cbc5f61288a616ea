"""The trusted side of an evaluation: correctness and the reference's time, decided in a
process the candidate never ran in.

A candidate's code runs in the worker's process and can change anything there: the checks,
the timer, the result file. So the worker's own verdict is only a claim. The evaluator starts
this judge with the worker, in a fresh sandboxed process (no candidate code is loaded, its
working directory is new), and decides a candidate that claims to be correct by it, with:

- the task without the candidate, and the outputs the worker handed over for the checked calls
  (`output_name`: every correctness trial, the call on inputs changed in place, and the call
  after timing, which catches a kernel that is correct only while it is being checked), as
  sealed shared-memory handles forwarded by the session (`handles.py`: no file, no pickle,
  one copy from the device, mapped privately here). Started with the worker, the judge checks
  each output as it comes and drops it before it asks for the next (`handles.stream_outputs`);
  the worker waits meanwhile, so the session holds one output at a time;
- the judge rebuilds the reference from the problem source with the same seeds, regenerates
  each call's inputs from its seed, computes the reference outputs and compares them with the
  saved ones by the gate's rule (`measurement.verdict`: the gate's tolerances, TF32-aware, and
  its comparison); a missing or unreadable output file is a failure too, since an honest
  worker always writes them. The judge beside a worker sends why it refused an output with
  its acknowledgment: the worker, which makes no comparison of its own for those calls
  (`harness._Pipeline.judge_decides`), stops there and reports the judge's reason;
- the float64 truth is found by the first judge of a search only: its verdict carries the
  truth's numbers (`known_truth`), which the session gives every later judge
  (`_Reference.take_known_truth`): no re-run, every output decided by the calibrated
  tolerance, as the worker decides it;
- it times the reference itself (the gate's timer on new input content every call, as the
  worker times the candidate), so a candidate cannot make its speedup larger by slowing the
  reference down or by writing a number into the result.

`--preflight` only builds and runs the reference: when a worker says "the reference failed",
the evaluator asks the judge before blaming the user's problem file.

    python -m pytest_kernelpro.optimize.sandbox.judge --task TASK.json --outputs-by-handle --result OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RETIME_SEED_OFFSET = 401  # inputs of the call the re-timing worker hands over

RETIMED = "retimed"  # the output of the re-timing worker's call after timing
# Label of a checked call in harness.py -> the name its output is handed over as.
_FIXED_NAMES = {"inputs changed in place": "inplace", "after timing": "after-timing"}


def output_name(label: str) -> str | None:
    """The output name of a checked call ("trial 2/3" -> "trial-2"), None if not judged."""
    if label.startswith("trial "):
        number = label.split()[1].split("/")[0]
        return f"trial-{int(number)}" if number.isdigit() else None
    return _FIXED_NAMES.get(label)


def required_outputs(task: dict[str, Any]) -> list[tuple[str, int]]:
    """(output name, input seed) of every output the judge checks, from the task alone."""
    seed = int(task.get("seed", 42))
    if task.get("retime"):  # the re-timing worker hands over the output of one call after timing
        return [(RETIMED, seed + RETIME_SEED_OFFSET)]
    trials = max(1, int(task.get("correct_trials", 3)))
    names = [(f"trial-{k + 1}", seed + 1 + k) for k in range(trials)]
    return [*names, ("inplace", seed + 102), ("after-timing", seed + 301)]


def save_output(name: str, holder: list[Any]) -> list[Any]:
    """Hand the output `holder` holds (its only item, taken from it) to the session by
    handle (`handles.send_output`: each tensor copied once from the device into a sealed
    memfd, numbers as they are, the device's copy freed before the judge is told); returns
    this process's private mapping of them."""
    import torch

    from pytest_kernelpro.optimize.sandbox.checks import flatten
    from pytest_kernelpro.optimize.sandbox.handles import send_output

    return send_output(torch, name, flatten(holder.pop()))


class _Reference:
    def __init__(self, task: dict[str, Any]) -> None:
        import torch

        from pytest_kernelpro.optimize.sandbox.loader import load_source
        from pytest_kernelpro.problem.build import build_module, init_inputs_of

        requested = task.get("device", "auto")
        if requested == "auto":
            requested = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(requested)
        if task.get("cpu_threads"):
            torch.set_num_threads(int(task["cpu_threads"]))
        from pytest_kernelpro.optimize.sandbox.measurement import (
            apply_session_precision,
            steady_host_heap,
        )

        steady_host_heap(self.device)  # before its first comparison, as the worker's
        apply_session_precision(torch, task)  # the session's TF32 flags, as the worker's
        self.seed = int(task.get("seed", 42))
        self.task = task
        # The gate's rule, as the worker's: its truth and reduced precision come from the
        # first output (measurement.py).
        from pytest_kernelpro.optimize.sandbox.measurement import new_rule

        self.rule = new_rule(task)
        self._calls = 0
        # Whether the first output's reference is kept from the truth's call to the first
        # comparison (one draw and one call) rather than made again from its seed after the
        # truth's re-run and when the first output comes (three of each): never on a GPU,
        # where a draw and a call take milliseconds and the kept output would sit beside the
        # worker's first call on the same device (bench/results/2026-12-06-device-calls6.md);
        # on the CPU where one more output fits the memory bound, decided at the truth's call
        # (`footprint.Footprint.room_for_kept_reference`), and only where the truth is made
        # before any output is handed over (`truth_first`: the judge beside a worker, told
        # its truth). A judge that finds its truth on a handed-over output (the re-timing
        # worker's) holds that output beside the re-run already: it makes the reference's
        # output again, as a small problem's judge does.
        self.keeps_reference = False
        self.truth_first = False
        self.truth_taken = False  # an earlier judge's (`take_known_truth`)
        # Whether the reference writes its inputs, and whether its output aliases them, found
        # on the truth's call (None: not yet).
        self.modifies_inputs: bool | None = None
        self.aliases_inputs: bool | None = None
        # The first output's leaves as the worker names them (its output is not flattened):
        # flattened leaf path -> that path.
        self.worker_paths: dict[str, str] = {}
        self.module = load_source(task["reference"], "kernelpro_reference")
        # As the worker and the gate build it (`problem.build`): same seed, same weights.
        self.model = build_module(
            self.module.Model, init_inputs_of(self.module), str(self.device), seed=self.seed
        )

    def take_known_truth(self, known: Mapping[str, Any]) -> None:
        """The truth an earlier judge of this search found (`known_truth`): the rule is
        calibrated by its numbers and the reference's first call here is an ordinary one (no
        float64 re-run, no reduced-precision search), so every output, the first included,
        is decided by the calibrated tolerance, as the worker decides it. Raises KeyError,
        TypeError or ValueError on another shape (`measurement.take_truth`): the rule is then
        left as it was, to find the truth here."""
        from pytest_kernelpro.optimize.sandbox.measurement import new_rule, take_truth

        rule = new_rule(self.task)
        take_truth(rule, known["payload"])
        paths = {str(k): str(v) for k, v in dict(known["paths"]).items()}
        modifies, aliases = known.get("modifies_inputs"), known.get("aliases_inputs")
        self.rule, self.worker_paths = rule, paths
        self.modifies_inputs = modifies if isinstance(modifies, bool) else None
        self.aliases_inputs = aliases if isinstance(aliases, bool) else None
        self._calls = 1
        self.truth_taken = True

    def known_truth(self) -> dict[str, Any] | None:
        """What a later judge of this search takes instead of finding the truth again
        (`take_known_truth`): the truth's numbers and the worker's names of the leaves; None
        before the truth is found. The truth depends on the reference and the first checked
        call's seed only, the same in every evaluation of a search."""
        from pytest_kernelpro.optimize.sandbox.measurement import truth_payload

        if self.rule.truth is None:
            return None
        return {
            "payload": truth_payload(self.rule),
            "paths": dict(self.worker_paths),
            **self._reference_calls(),
        }

    def _reference_calls(self) -> dict[str, bool | None]:
        """What the truth's call found of the reference's calls: whether it writes its inputs
        and whether its output aliases them."""
        return {"modifies_inputs": self.modifies_inputs, "aliases_inputs": self.aliases_inputs}

    def worker_truth(self) -> dict[str, Any]:
        """What the worker beside this judge is told before its first call
        (`harness._Pipeline.judge_truth`): the truth's numbers under its names of the leaves,
        and whether the reference writes its inputs or returns an alias of them (found on the
        truth's call: the worker then gives the candidate sealed inputs or copies, and decides
        whether an aliasing output is allowed, without a reference call of its own)."""
        from pytest_kernelpro.optimize.sandbox.measurement import truth_payload, worker_named

        named = worker_named({"payload": truth_payload(self.rule), "paths": self.worker_paths})
        return {**named, **self._reference_calls()}

    def worker_failure(self, decided: Any) -> str:
        """The reason of a refused output (`measurement.verdict`'s) naming its leaves as the
        worker does (its output is not flattened: "output", not "output[0]"): what the worker
        reports, so the candidate's author reads its own output's names."""
        import dataclasses

        from pytest_kernelpro.optimize.sandbox.measurement import failure_reason

        failed = []
        for report in decided.reports:
            if report.ok:
                continue
            named = self.worker_paths.get(report.path, report.path)
            # Every mention: the rule's note on a constant factor comes before the leaf's own.
            message = (report.message or "").replace(f"{report.path}:", f"{named}:")
            failed.append(dataclasses.replace(report, message=message))
        return failure_reason(failed) if failed else str(decided.failure)

    def inputs(self, seed: int) -> list[Any]:
        from pytest_kernelpro.optimize.sandbox.measurement import make_inputs

        return make_inputs(self.module, seed, self.device)

    def output_again(self, seed: int, made: bytes) -> list[Any]:
        """The first output's reference made again (inputs drawn from `seed`), where the
        judge kept only the `checks.digest` (`made`) of the one its truth ran beside. The
        truth's reference - truth is of that output, so the one made again must have the
        same bytes. A reference that gives other bytes for the same inputs (not
        deterministic) has its truth found again on this call, which the first output is
        then compared with (`output`'s first call)."""
        from pytest_kernelpro.optimize.sandbox.checks import digest
        from pytest_kernelpro.optimize.sandbox.measurement import new_rule

        again = self.output(seed, truth=False)
        if digest(again) == made:
            return again
        del again
        self.rule, self._calls = new_rule(self.task), 0
        return self.output(seed)

    def output(self, seed: int, *, truth: bool = True) -> Any:
        """The reference's output leaves for the inputs of `seed`; the first call also finds
        the reduced precision its fp32 matmuls/convs run in and re-runs it in higher
        precision for the truth, as the worker's first call does."""
        import time

        import torch

        from pytest_kernelpro.measure.correctness_check import clone_inputs, wide_dtype
        from pytest_kernelpro.measure.output_rule import leaves_of, map_tensors
        from pytest_kernelpro.optimize.sandbox.checks import (
            flat_paths,
            flatten,
            same_values,
            shares_storage,
        )
        from pytest_kernelpro.optimize.sandbox.measurement import find_truth, run_reference

        truth_now = self._calls == 0 and truth
        # The truth's inputs: made once, the call running on a copy (a reference may write
        # its inputs), instead of made again by the maker after the call (a copy is a
        # fraction of a large input's random draw). Held beside the call's copy and output
        # (2I + O), below the truth's own peak.
        kept = [self.inputs(seed)] if truth_now else []

        def call() -> Any:
            args = clone_inputs(torch, kept[0]) if kept else self.inputs(seed)
            with torch.no_grad():
                out = self.model(*args)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if kept:  # the truth's call, on a copy of inputs kept as drawn
                self.modifies_inputs = not same_values(kept[0], args)
                self.aliases_inputs = shares_storage(out, args)
            del args
            return out

        started = time.perf_counter()
        out, reduced = run_reference(torch, call, self.device, first=self._calls == 0)
        leaves = flatten(out)
        if truth_now:
            flat = [path for path, _ in leaves_of(torch, leaves)]
            self.worker_paths = dict(zip(flat, flat_paths(out), strict=True))
        del out
        if self._calls == 0:
            self.rule.reduced = reduced
        if truth_now:
            # The kept inputs are given away: the truth drops them once widened, so the
            # float64 re-run holds one input set fewer (they are the judge's own; the
            # worker's are not touched).
            reference_s = time.perf_counter() - started
            made: list[list[Any]] = []
            described: Any = leaves
            remake: Callable[[], list[Any]] | None = None
            if self.device.type == "cpu":
                self.keeps_reference = self.truth_first and _room_for_kept_reference(
                    torch, kept[0], leaves
                )
            if not self.keeps_reference and wide_dtype(torch, leaves)[0] is not None:
                # The float64 re-run holds its widened inputs and output (2I + 2O); the
                # reference's output beside them would be a third output: it goes, and the
                # one the truth measures is made again from the seed once the re-run's
                # inputs are gone (`run_truth`'s `remake`). An output with no wider type to
                # re-run in has no re-run: it stays. Where one more output fits
                # (`keeps_reference`) it stays beside the re-run too: no second draw.
                described = map_tensors(torch, leaves, lambda t: t.detach().to("meta"))
                del leaves

                def again() -> list[Any]:
                    made.append(self.output_of(seed))
                    return made[-1]

                remake = again

            find_truth(
                torch,
                self.rule,
                self.model,
                kept.pop(),
                described,
                self.device,
                reference_s=reference_s,
                arrange=flatten,
                consume_inputs=True,
                remake=remake,
            )
            del described
            if remake is not None:  # not called where the truth was skipped before its re-run
                leaves = made.pop() if made else self.output_of(seed)
        self._calls += 1
        return leaves

    def output_of(self, seed: int) -> list[Any]:
        """The reference's output leaves on a new draw of `seed`'s inputs."""
        import torch

        from pytest_kernelpro.optimize.sandbox.checks import flatten

        with torch.no_grad():
            return flatten(self.model(*self.inputs(seed)))


def _room_for_kept_reference(torch: Any, inputs: Sequence[Any], leaves: Sequence[Any]) -> bool:
    """Whether one more output of this problem fits the memory bound (its inputs' and output
    leaves' bytes, `footprint.Footprint.room_for_kept_reference`)."""
    from pytest_kernelpro.optimize.sandbox.checks import flatten
    from pytest_kernelpro.optimize.sandbox.footprint import Footprint, tensor_bytes

    inputs_bytes = tensor_bytes(torch, flatten(list(inputs)))
    return Footprint(inputs_bytes, tensor_bytes(torch, leaves)).room_for_kept_reference()


def judge(
    task: dict[str, Any],
    outputs: Mapping[str, list[Any]] | Iterable[tuple[str, list[Any]]],
    tell_truth: Callable[[dict[str, Any]], None] | None = None,
    failures: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Check the handed-over outputs against the reference and time the reference.

    `tell_truth` (the judge beside a worker: `handles.send_truth`): the first output's
    reference and float64 truth are made before that output is asked for, and the truth's
    numbers go to the worker (`measurement.truth_payload`), which waits for them before its
    first call and finds no truth of its own (`harness._Pipeline.judge_truth`). The truth's
    re-run then holds neither a handed-over output nor the worker's truth beside it. The
    first output is still compared with the truth here, by the gate's rule; one that fails
    it but passes the tolerance the worker was given is "wrong" (an honest worker's claim),
    not a claim the worker broke.

    `outputs` is (name, leaves) in the order the worker handed them over
    (`handles.stream_outputs`: each checked as it comes, while the worker waits, and dropped
    before the next is asked for), or a mapping by name. They must come in the order of `required_outputs`, each once:
    the first is the call the truth is found on, as in the worker. Every output is taken
    (and so acknowledged) even after one failed, unchecked then: the worker is never left
    waiting, and the first failure is the verdict.

    `failures` (the judge beside a worker: `handles.stream_outputs`, which sends each with its
    acknowledgment): why each refused output was refused, by name, set before the next is
    asked for. The worker makes no comparison of its own for a call this judge decides
    (`harness._Pipeline.judge_decides`): it stops at the first refusal with that reason."""
    import torch

    from pytest_kernelpro.optimize.sandbox.measurement import (
        fresh_calls,
        new_rule,
        take_truth,
        time_call,
        truth_payload,
        verdict,
    )

    ref = _Reference(task)
    required = required_outputs(task)
    if task.get("known_truth") is not None:
        try:
            ref.take_known_truth(task["known_truth"])
        except (KeyError, TypeError, ValueError):
            pass  # found here instead, as by the first judge of the search
    first_expected: list[Any] = []  # the first output's reference, made ahead (`tell_truth`)
    first_made: list[bytes] = []  # or its digest (not `keeps_reference`): made again when due
    told: dict[str, Any] | None = None  # as this judge names the leaves (flattened)
    if tell_truth is not None and required and not ref.truth_taken:
        from pytest_kernelpro.optimize.sandbox.checks import digest
        from pytest_kernelpro.optimize.sandbox.handles import release_freed_heap

        ref.truth_first = True
        first_expected.append(ref.output(required[0][1]))
        if not ref.keeps_reference:
            # The worker's first call runs beside what this judge keeps: reference - truth,
            # which only the first comparison needs, and the reference's output, which is
            # made again from its seed when the first output comes (`output_again`),
            # so the judge holds one output's size meanwhile, not two (where one more
            # output fits, `keeps_reference`, it keeps both: no third draw).
            first_made.append(digest(first_expected.pop()))
        # The truth's freed chunks stay in glibc's heap (half a 1 GiB softmax's footprint,
        # bench/results/2026-12-05-optimizer-memory7-cpu.md): given back before the worker,
        # told, starts its first call beside what this judge keeps for it.
        release_freed_heap()
    if tell_truth is not None and required:
        told = truth_payload(ref.rule)
        tell_truth(ref.worker_truth())
    if isinstance(outputs, Mapping):  # in order, up to the first one missing
        names = [name for name, _seed in required]
        given = names[: next((i for i, n in enumerate(names) if n not in outputs), len(names))]
        outputs = [(name, outputs[name]) for name in given]
    checked: list[str] = []
    worst_abs, worst_rel = 0.0, 0.0
    failure: str | None = None
    wrong = False  # the failure is the gate's rule's, on an output an honest worker passes
    for name, saved in outputs:
        if failure is None:
            position = len(checked)
            want = required[position][0] if position < len(required) else None
            if name != want:
                failure = (
                    f"{name}: handed over where {want or 'no further output'} was due (the "
                    "checked outputs come once each, in order)"
                )
            else:
                if position == 0 and first_expected:
                    expected = first_expected.pop()
                elif position == 0 and first_made:
                    expected = ref.output_again(required[0][1], first_made.pop())
                else:
                    expected = ref.output(required[position][1])
                decided = verdict(torch, saved, expected, ref.rule)
                if decided.ok:
                    worst_abs = max(worst_abs, decided.max_abs)
                    worst_rel = max(worst_rel, decided.max_rel)
                    checked.append(name)
                else:
                    failure = f"{name}: {decided.failure}"
                    if failures is not None:
                        failures[name] = ref.worker_failure(decided)
                    if position == 0 and told is not None and not ref.truth_taken:
                        # What the worker decided this call by: the truth calibrated (a judge
                        # that took an earlier one's truth decided by it already: the same
                        # verdict, whose failure passes are most of a judge's time on a large
                        # wrong output, bench/results/2026-12-06-optimizer-speed16-cpu.md).
                        claim = new_rule(task)
                        take_truth(claim, told)
                        wrong = verdict(torch, saved, expected, claim).ok
                del expected
        if failure is not None and failures is not None:
            failures.setdefault(name, failure)  # out of order, or after a refused one
        # This output's memory goes before the next is asked for: the mapping here is its
        # last holder (the session closed its descriptor once forwarded).
        del saved
    # The truth depends on the reference and the seed alone: a later judge of the search
    # takes it (`WorkerClaims._run_judge`) whatever this candidate's verdict.
    known = None if ref.truth_taken else ref.known_truth()
    found: dict[str, Any] = {"truth_taken": True} if ref.truth_taken else {}
    if known is not None:
        found["known_truth"] = known
    if failure is not None:
        return {"ok": False, "reason": failure, "wrong": wrong, **found}
    if len(checked) < len(required):
        missing = required[len(checked)][0]
        return {"ok": False, "reason": f"{missing}: no output {missing} was handed over", **found}
    result = {"ok": True, "checked": checked, "max_abs_err": worst_abs, "max_rel_err": worst_rel}
    result.update(found)
    # Rule, factor, both errors against the truth, the truth's cost (nested: the result's
    # own "reference_error" means the reference failed).
    result["accuracy"] = ref.rule.summary()
    if task.get("retime") or task.get("reference_timed"):
        # The winner's confirmation compares the fresh candidate time with the search's
        # (`optimize/sandbox/confirm.py`); a reference time is no part of that decision.
        # `reference_timed`: an earlier judge of this search timed it
        # (`worker_claims.WorkerClaims._run_judge`).
        return result
    # Timed as the worker times the candidate (new input content before every call, from the
    # problem's input maker): the speedup divides two times of one protocol.
    args = ref.inputs(ref.seed)
    with torch.no_grad():
        fresh = fresh_calls(torch, ref.model, args, ref.device, make_draw=ref.inputs)
        result["reference_timing"] = time_call(None, task, ref.device, fresh=fresh)
    return result


def preflight(task: dict[str, Any]) -> dict[str, Any]:
    """Build the reference and run it once: does the problem itself work?"""
    ref = _Reference(task)
    ref.output(ref.seed + 1, truth=False)
    return {"ok": True}


def main(argv: Sequence[str] | None = None) -> int:
    """Judge entry point (see the module docstring); the result is a JSON file."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kernelpro.optimize.sandbox.judge")
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--outputs-by-handle", action="store_true")
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--preflight", action="store_true")
    args = parser.parse_args(argv)
    task = json.loads(args.task.read_text(encoding="utf-8"))
    from pytest_kernelpro.optimize.sandbox.loader import add_session_path

    add_session_path(task.get("sys_path") or ())  # the kernel's modules, as pytest saw them
    from pytest_kernelpro.optimize.sandbox.handles import HandleError

    try:
        if args.preflight:
            result = preflight(task)
        else:
            if not args.outputs_by_handle:
                parser.error("--outputs-by-handle is required unless --preflight")
            import torch

            from pytest_kernelpro.optimize.sandbox.handles import send_truth, stream_outputs

            # A re-timing worker finds its own truth before the candidate runs (`worker.retime`).
            tell = None if task.get("retime") else send_truth
            failures: dict[str, str] = {}  # sent with each acknowledgment
            streamed = stream_outputs(torch, acknowledge=True, failures=failures)
            result = judge(task, streamed, tell, failures)
    except HandleError as exc:  # the channel, not the reference
        result = {"ok": False, "judge_error": f"the outputs' channel: {exc}"}
    except Exception as exc:
        from pytest_kernelpro.optimize.sandbox.checks import classify_exception

        result = {
            "ok": False,
            "reference_error": classify_exception(exc),
            "traceback": traceback.format_exc()[-4000:],
        }
    from pytest_kernelpro.fileio import atomic_write_json

    atomic_write_json(args.result, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
