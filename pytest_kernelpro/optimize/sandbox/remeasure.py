"""The final re-measurement: contenders timed again, interleaved, one process each.

`remeasure(reference, contenders, ...)` starts one worker process per contender (the user's
current kernel, the reference and the top candidates; each a module defining `ModelNew`
next to the reference's `class Model`), lets every worker build its model, copy the
reference's weights (by name, else by position and shape), check its output once against
the reference and warm up, and then runs `rounds` rounds: in each round the workers time
their kernel one after another (never two at once on one device), in an order rotated per
round, with the gate's timer (`measure.timing.time_kernel`: adaptive sampling, L2 flush).
The samples of all rounds are pooled per contender for `search.ranking.rank`.

With `budget_s` the whole re-measurement's timing is bounded (`plan_rounds`): every contender
gets the same sampling time per round, `budget_s` less the warm-ups shared out over the rounds
and contenders (never more than the search's own per-kernel budget), and the gate's adaptive
timer turns that time into samples by each kernel's measured per-call time, so a 10 µs kernel
takes hundreds of samples a round and a 6 ms GEMM tens, never fewer than
`MIN_POOLED_SAMPLES` over all rounds (the median, the lower decile and the U test stay
meaningful) nor more than `MAX_ROUND_SAMPLES` a round. After the first round the rest of the
budget is shared out again, less what one timed call cost there beyond its sampling and
warm-up (`RoundPlan.after_rounds`: the timer's first call and estimate, its statistics, the
protocol), so the rounds together keep to the budget. Only the first round warms up for the
search's full warm-up (the GPU's clock ramp from idle); later rounds follow other contenders'
GPU work with no idle gap, so they re-warm for `REWARM_MS`. Rounds stop early, with the
samples so far, once they have taken `OVERRUN` times the budget (a kernel far slower than its
search measurement); the result says so (`stopped`). Without `budget_s` every round uses the
`timing` given.

One process per contender keeps a hostile candidate from touching another's timing (a
candidate that patches torch in its own process only fools its own numbers, as in the
sandbox), and a fresh CUDA context per contender keeps a crash local. Workers get the
sandbox's scrubbed environment and run inside the candidate sandbox (`isolation.py`: PID,
network and mount namespaces, a scratch directory per contender, no capabilities), and are
killed at the time limit (with their PID namespace, every process they started).

The worker protocol is line based: the parent writes `time <round> [<budget JSON>]` or
`quit` to the worker's stdin; the worker answers `ready`, `done <round>` or `error <message>`
on stdout and writes each round's samples to `<label>.<round>.json` in the work directory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox import measurement
from pytest_kernelpro.optimize.sandbox.compile_cache import CompileCaches, point_caches
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.sandbox.result_channel import ResultChannel
from pytest_kernelpro.optimize.sandbox.safe_read import read_text

READY, DONE, ERROR = "ready", "done", "error"

MIN_POOLED_SAMPLES = 50  # per contender over all rounds: 5 of them in its lower decile
MAX_ROUND_SAMPLES = 1000  # per contender per round (the U test reduces to 200 quantiles)
REWARM_MS = 25.0  # warm-up of every round after the first (see the module doc)
OVERRUN = 2.0  # rounds stop once they took this many times the budget
MIN_SAMPLE_S = 1e-3  # the least sampling time a round plans (the timer needs > 0)
DEFAULT_WARMUP_MS = 25.0  # measure.timing.TimingBudget's, when the search's timing has none


@dataclass(frozen=True)
class RoundPlan:
    """How long each contender samples in each round (`plan_rounds`)."""

    budget_s: float  # the timing budget of all rounds together
    rounds: int
    contenders: int
    sample_s: float  # sampling time of one contender in one round
    min_samples: int  # per contender per round
    max_samples: int  # per contender per round
    first_warmup_ms: float
    warmup_ms: float  # rounds after the first
    max_sample_s: float = math.inf  # the search's own per-kernel budget
    fixed_s: float = 0.0  # measured cost per contender and round beyond sampling and warm-up

    def after_rounds(self, *, spent_s: float, rounds_done: int) -> RoundPlan:
        """The plan of the rounds left, from what the first `rounds_done` rounds, all timed
        with this plan, cost (`spent_s`): what they took beyond the planned warm-up and
        sampling is the fixed cost of one timed call (the timer's first call and estimate,
        its statistics, the protocol), and the budget left is shared out after that, so the
        rounds together keep to `budget_s`."""
        calls_done = rounds_done * self.contenders
        calls_left = (self.rounds - rounds_done) * self.contenders
        if calls_done <= 0 or calls_left <= 0:
            return self
        warm_s = self.contenders * (self.first_warmup_ms + (rounds_done - 1) * self.warmup_ms)
        fixed = (spent_s - warm_s * 1e-3 - calls_done * self.sample_s) / calls_done
        fixed = max(0.0, fixed)
        share = (self.budget_s - spent_s) / calls_left - fixed - self.warmup_ms * 1e-3
        sample_s = min(max(share, MIN_SAMPLE_S), self.max_sample_s)
        return dataclasses.replace(self, sample_s=sample_s, fixed_s=fixed)

    def timing(self, base: Mapping[str, Any], round_index: int) -> dict[str, Any]:
        """The `TimingBudget` fields of one round: `base` (the search's) with this plan's
        sampling time, sample bounds and warm-up."""
        return {
            **dict(base),
            "max_time_s": self.sample_s,
            "min_samples": self.min_samples,
            "max_samples": self.max_samples,
            "warmup_ms": self.first_warmup_ms if round_index == 0 else self.warmup_ms,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ranking's record of its own cost; no infinity in JSON)."""
        data = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if not math.isfinite(self.max_sample_s):
            data["max_sample_s"] = None
        return data


def plan_rounds(
    timing: Mapping[str, Any], *, budget_s: float, contenders: int, rounds: int
) -> RoundPlan:
    """Share `budget_s` seconds of timing out over `rounds` rounds of `contenders` workers
    (the module doc): the warm-ups first, the rest as equal sampling time, at most the
    search's own `max_time_s` per contender and round."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise KernelproError(f"remeasure budget_s={budget_s!r} must be a number of seconds > 0")
    if rounds < 1 or contenders < 1:
        raise KernelproError(
            f"remeasure needs at least one round and one contender (rounds={rounds!r}, "
            f"contenders={contenders!r})"
        )
    first = float(timing.get("warmup_ms", DEFAULT_WARMUP_MS))
    later = min(first, REWARM_MS)
    warm_s = contenders * (first + (rounds - 1) * later) * 1e-3
    sample_s = max(0.0, budget_s - warm_s) / (rounds * contenders)
    cap = timing.get("max_time_s")
    max_sample_s = float(cap) if isinstance(cap, (int, float)) and cap > 0 else math.inf
    sample_s = min(sample_s, max_sample_s)
    min_samples = math.ceil(MIN_POOLED_SAMPLES / rounds)
    cap_samples = timing.get("max_samples")
    max_samples = MAX_ROUND_SAMPLES
    if isinstance(cap_samples, int) and cap_samples > 0:
        max_samples = min(max_samples, cap_samples)
    return RoundPlan(
        budget_s=float(budget_s),
        rounds=rounds,
        contenders=contenders,
        sample_s=max(sample_s, MIN_SAMPLE_S),
        min_samples=min_samples,
        max_samples=max(max_samples, min_samples),
        first_warmup_ms=first,
        warmup_ms=later,
        max_sample_s=max_sample_s,
    )


@dataclass
class RemeasureResult:
    """Pooled samples per contender label; `errors` for those that failed."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    rounds: int = 0  # rounds completed
    order: list[list[str]] = field(default_factory=list)  # the order of each round
    wall_s: float = 0.0
    device: str = ""
    warm: list[str] = field(default_factory=list)  # contenders started from kept caches
    start_s: float = 0.0  # starting the workers until every one was ready (or failed)
    rounds_s: float = 0.0  # the interleaved rounds
    round_samples: dict[str, list[int]] = field(default_factory=dict)  # per label, per round
    plan: RoundPlan | None = None
    stopped: str = ""  # why rounds stopped before `rounds` were done ("" when they did not)
    one_at_a_time: bool = False  # each turn in its own worker (`remeasure`)
    turn_start_s: float = 0.0  # one at a time: starting and stopping the turns' workers

    def cost(self) -> dict[str, Any]:
        """What the re-measurement cost and collected (the ranking reports it)."""
        return {
            "wall_s": self.wall_s,
            "start_s": self.start_s,
            "rounds_s": self.rounds_s,
            "rounds": self.rounds,
            "samples": {k: sum(v) for k, v in self.round_samples.items()},
            "round_samples": {k: list(v) for k, v in self.round_samples.items()},
            "plan": None if self.plan is None else self.plan.to_dict(),
            "stopped": self.stopped,
            "one_at_a_time": self.one_at_a_time,
            "turn_start_s": self.turn_start_s,
        }


# The part of the device's free memory the contenders may hold together: the rest is left
# to the session's own process and the driver.
CONTENDERS_MEMORY_SHARE = 0.9


def _device_memory_share(device: str, contenders: int) -> float | None:
    """Each contender's cap on a CUDA device, as a fraction of the device's total memory
    (`torch.cuda.set_per_process_memory_fraction` in its worker): an equal share of the
    memory free now. The contenders run at once, interleaved, so without a cap one that
    keeps what it allocates (a memo of every output on fresh content grows by an output a
    call) filled the H200 and the honest contender beside it failed with out-of-memory.
    None on the CPU or when the device cannot be read."""
    if not device.startswith("cuda") or contenders < 1:
        return None
    try:
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
    except Exception:  # no CUDA here (a CPU stand-in) or the device cannot be read
        return None
    return CONTENDERS_MEMORY_SHARE * free / total / contenders if total else None


@dataclass(frozen=True)
class MemoryRoom:
    """How many contender workers the problem's memory holds at once (`workers_that_fit`):
    a CUDA device's, or the host's for a CPU problem (`where`)."""

    workers: int
    worker_bytes: int  # one worker's estimate
    free_bytes: int
    where: str = "on the GPU"

    def describe(self) -> str:
        gib = 2**30
        return (
            f"{self.workers} re-measurement worker(s) of about {self.worker_bytes / gib:.1f} GiB "
            f"each (a worker times one contender with fresh inputs) fit in "
            f"{CONTENDERS_MEMORY_SHARE:.0%} of the {self.free_bytes / gib:.1f} GiB free {self.where}"
        )


def host_memory(device: str) -> tuple[int, int] | None:
    """(available, total) bytes of this machine's memory, None where the available part
    cannot be read; `device` is not read (the host's memory serves every CPU problem)."""
    import torch

    from pytest_kernelpro.measure.timing.fresh_inputs import free_memory_bytes

    available = free_memory_bytes(torch, "cpu")
    if available is None:
        return None
    return available, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def workers_that_fit(
    reference: str,
    device: str,
    memory_of: Callable[[str], tuple[int, int] | None] | None = None,
) -> MemoryRoom | None:
    """The contender workers that fit the problem's memory at once, all alive through every
    round: each holds what the evaluation's worker holds in its timing phase (the same timer
    on the same inputs; `footprint`'s estimate, which errs high), on a CUDA device with its
    context, on the CPU with its interpreter in host memory. None where nothing bounds them
    (a reference the meta device cannot run, a memory that cannot be read). Five workers of
    23_Softmax (6 GiB inputs and output) overran the H200 with each capped at its equal
    share; two of a 16384x32768 softmax (2 GiB each) beside the session ran a 24 GiB machine
    out of memory."""
    from pytest_kernelpro.optimize.sandbox import footprint as footprints

    found = footprints.meta_footprint(reference, device)
    if found is None:
        return None
    worker = int(
        footprints.HEADROOM * footprints.WORKER_TIMING.bytes_for(found.inputs, found.outputs)
    )
    if device.startswith("cuda"):
        capacity = (memory_of or footprints.cuda_memory)(device)
        worker += footprints.CUDA_CONTEXT_BYTES
        where = "on the GPU"
    else:
        capacity = (memory_of or host_memory)(device)
        worker += footprints.INTERPRETER_BYTES + footprints.HEAP_SLACK_BYTES
        where = "in host memory"
    if capacity is None:
        return None
    free = capacity[0]
    return MemoryRoom(int(CONTENDERS_MEMORY_SHARE * free // worker), worker, free, where)


def cap_device_memory(torch: Any, fraction: float, device: str) -> None:
    """Cap this process's CUDA allocations at `fraction` of `device`'s memory. torch's cap
    takes a device index and refuses a device without one ("cuda", what `auto` resolves to:
    ValueError), so the current device's index stands in for a bare "cuda"."""
    index = torch.device(device).index
    torch.cuda.set_per_process_memory_fraction(
        fraction, torch.cuda.current_device() if index is None else index
    )


def _took_search_truth(rule: Any, truth: Any) -> bool:
    """Whether `rule` took the search's truth (`config["truth"]`: the numbers its first judge
    found, `measurement.worker_named`), so this worker makes no float64 re-run of its own:
    at 23_Softmax's size that re-run was this process's peak, 3.55x the problem's footprint
    on the GPU (bench/results/2026-12-06-device-calls7.md). False where none was given or
    it has another shape: the worker then finds its own."""
    if not isinstance(truth, dict):
        return False
    reduced = rule.reduced
    try:
        measurement.take_truth(rule, truth)
    except (KeyError, TypeError, ValueError):
        return False
    rule.reduced = reduced  # found on this process's own first call
    return True


def _combined(reference: str, code: str) -> str:
    return reference.rstrip() + "\n\n\n# ---- contender ----\n" + code.rstrip() + "\n"


class _Worker:
    def __init__(self, label: str, code: str) -> None:
        self.label = label
        self.code = code
        self.proc: subprocess.Popen[bytes] | None = None  # until started
        self.error: str | None = None
        self.scratch = Path()
        self._buffer = b""

    def send(self, line: str) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def read(self, deadline: float) -> str:
        """The next protocol line of the worker's stdout (other output is skipped), or ""
        at the deadline or when the worker exits. Reads the pipe unbuffered, so a line
        that arrived with another is never left waiting in a buffer."""
        assert self.proc is not None
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self._buffer:
                    raw, self._buffer = self._buffer.split(b"\n", 1)
                    line = raw.decode(errors="replace").strip()
                    if line.startswith((READY, DONE, ERROR)):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return ""
                chunk = os.read(fd, 65536)
                if not chunk:
                    return ""
                self._buffer += chunk

    def stop(self) -> None:
        """Ask the worker to quit (it may be gone), then kill what is left of it."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.error is None:
            try:
                self.send("quit")
            except OSError:
                pass
        self.kill()

    def kill(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def remeasure(
    reference: str,
    contenders: Sequence[tuple[str, str]],
    *,
    device: str = "cuda",
    rounds: int = 5,
    timing: Mapping[str, Any] | None = None,
    seed: int = 42,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    timeout_s: float = 300.0,
    atol: float | None = None,
    rtol: float | None = None,
    caches: CompileCaches | None = None,
    budget_s: float | None = None,
    cpu_threads: int | None = None,
    one_at_a_time: bool = False,
    truth: dict[str, Any] | None = None,
) -> RemeasureResult:
    """Time `contenders` ((label, ModelNew module code), ...) in interleaved rounds; each
    contender's worker starts from a copy of the compile caches its code's evaluation kept
    (`caches`, the sandbox evaluator's `compile_caches`). `budget_s`: the timing budget of
    all rounds together (module doc); None: every round times with `timing`. `cpu_threads`:
    torch's threads in every worker, as the search's (None: torch's default).
    `one_at_a_time`: where the device holds one worker only (`workers_that_fit`), each
    contender's worker is started for its turn in a round and stopped after it, so the
    rounds still alternate the contenders; every turn then warms up as a first round does
    (the device idled while the worker started), and starting and stopping the workers is
    not counted against the budget's sampling time. `truth`: the search's truth
    (`measurement.worker_named`), which every worker's check is calibrated by instead of a
    float64 re-run of its own; None: each finds its own."""
    if rounds < 1:
        raise KernelproError(f"remeasure rounds={rounds!r} must be at least 1")
    if budget_s is not None:
        plan_rounds(timing or {}, budget_s=budget_s, contenders=1, rounds=rounds)  # validates
    labels = [label for label, _ in contenders]
    if len(set(labels)) != len(labels):
        raise KernelproError(f"remeasure contender labels must be unique, got {labels}")
    if env is None:
        from pytest_kernelpro.optimize.sandbox.environment import PACKAGE_ROOT, scrub_environment

        env = scrub_environment(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
        )
    started = time.monotonic()
    deadline = started + timeout_s
    result = RemeasureResult(one_at_a_time=one_at_a_time)
    with tempfile.TemporaryDirectory(prefix="kernelpro-remeasure-") as tmp:
        work = Path(tmp)
        config = {
            "device": device,
            "timing": dict(timing or {}),
            "seed": seed,
            "atol": atol,
            "rtol": rtol,
            "cpu_threads": cpu_threads,
            # The session's TF32 flags, read here in the parent: the check below relaxes
            # the fp32 tolerance when the gate's would.
            measurement.PRECISION_KEY: measurement.session_fp32_precision(),
            "memory_fraction": _device_memory_share(
                device, 1 if one_at_a_time else len(contenders)
            ),
            "truth": truth,
        }
        workers = [_Worker(label, code) for label, code in contenders]
        # Contenders run candidate code: each in the candidate sandbox, with a scratch
        # directory of its own (its samples cannot be overwritten by another contender).
        isolation = Isolation.probe(cuda=device.startswith("cuda"), env=dict(env))
        starts = 0

        def start(w: _Worker) -> None:
            nonlocal starts
            starts += 1
            w.scratch = work / f"{starts}-{w.label}"
            w.scratch.mkdir()
            (w.scratch / "config.json").write_text(json.dumps(config), encoding="utf-8")
            source = _combined(reference, w.code)
            (w.scratch / f"{w.label}.py").write_text(source, encoding="utf-8")
            command = [python, "-m", "pytest_kernelpro.optimize.sandbox.remeasure"]
            command += [str(w.scratch), w.label]
            worker_env = dict(env)
            for name, sub in (("HOME", "home"), ("TMPDIR", "tmp")):  # the rest is read-only
                (w.scratch / sub).mkdir()
                worker_env[name] = str(w.scratch / sub)
            point_caches(worker_env, w.scratch / "home")
            if caches is not None and caches.seed(w.code, w.scratch / "home"):
                if w.label not in result.warm:
                    result.warm.append(w.label)
            with open(work / f"{w.label}.stderr", "wb") as err:
                w.proc = subprocess.Popen(
                    isolation.wrap(command, scratch=w.scratch, python=python, env=worker_env),
                    cwd=w.scratch,
                    env=worker_env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    start_new_session=True,
                )

        def ready(w: _Worker) -> None:
            line = w.read(deadline)
            if line != READY:
                w.error = _why(line, work, w.label, "while building and checking")

        try:
            if not one_at_a_time:
                for w in workers:
                    start(w)
                for w in workers:  # they build in parallel; the GPU work starts after
                    ready(w)
            alive = [w for w in workers if w.error is None]
            result.start_s = time.monotonic() - started
            if budget_s is not None and alive:
                result.plan = plan_rounds(
                    timing or {}, budget_s=budget_s, contenders=len(alive), rounds=rounds
                )
            rounds_started = time.monotonic()
            for r in range(rounds):
                spent = time.monotonic() - rounds_started - result.turn_start_s
                if result.plan is not None and r >= 1 and spent > OVERRUN * result.plan.budget_s:
                    result.stopped = (
                        f"stopped after {r} of {rounds} rounds: they took {spent:.1f} s, more "
                        f"than {OVERRUN:g}x the {result.plan.budget_s:g} s budget"
                    )
                    break
                if result.plan is not None and r == 1:  # the first round's cost is known
                    result.plan = result.plan.after_rounds(spent_s=spent, rounds_done=1)
                shift = r % max(1, len(alive))
                order = alive[shift:] + alive[:shift]
                result.order.append([w.label for w in order])
                command = f"time {r}"
                if result.plan is not None:
                    this_round = result.plan.timing(timing or {}, 0 if one_at_a_time else r)
                    command += " " + json.dumps(this_round, separators=(",", ":"))
                for w in order:
                    if w.error is not None:
                        continue
                    if one_at_a_time:
                        turn = time.monotonic()
                        start(w)
                        ready(w)
                        result.turn_start_s += time.monotonic() - turn
                        if w.error is not None:
                            continue
                    _time_round(w, command, r, deadline, work, result)
                    if one_at_a_time:
                        turn = time.monotonic()
                        w.stop()
                        result.turn_start_s += time.monotonic() - turn
                result.rounds = r + 1
            result.rounds_s = time.monotonic() - rounds_started
        finally:
            for w in workers:
                w.stop()
        for w in workers:
            if w.error is not None:
                result.errors[w.label] = w.error
                result.samples.pop(w.label, None)
                result.round_samples.pop(w.label, None)
    result.wall_s = time.monotonic() - started
    return result


def _time_round(
    w: _Worker, command: str, r: int, deadline: float, work: Path, result: RemeasureResult
) -> None:
    """One contender's turn in round `r`: its samples pooled into `result`, or its error."""
    w.send(command)
    line = w.read(deadline)
    if line != f"{DONE} {r}":
        w.error = _why(line, work, w.label, f"in round {r + 1}")
        return
    # In the worker's scratch: read without following its links.
    try:
        data = json.loads(read_text(w.scratch / f"{w.label}.{r}.json"))
    except (OSError, ValueError) as exc:
        w.error = f"unreadable result in round {r + 1}: {exc}"
        return
    result.samples.setdefault(w.label, []).extend(data["samples_s"])
    result.round_samples.setdefault(w.label, []).append(len(data["samples_s"]))
    result.device = data.get("device", result.device)


def _why(line: str, work: Path, label: str, when: str) -> str:
    if line.startswith(ERROR):
        return line[len(ERROR) :].strip() or f"failed {when}"
    tail = ""
    err = work / f"{label}.stderr"
    if err.exists():
        tail = " | ".join(err.read_text(errors="replace").strip().splitlines()[-3:])[:400]
    return f"no answer {when} (time limit or crash){': ' + tail if tail else ''}"


# ------------------------------------------------------------------------------ worker side


def _worker(work: Path, label: str) -> int:
    # The protocol gets its own copy of stdout; fd 1 itself goes to stderr, so whatever the
    # contender prints (Python or C) cannot be mistaken for an answer.
    protocol = os.dup(1)
    os.dup2(2, 1)

    def say(line: str) -> None:
        os.write(protocol, (line.replace("\n", " ") + "\n").encode())

    import torch

    from pytest_kernelpro.measure.correctness_check import clone_inputs
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
    from pytest_kernelpro.optimize.sandbox.built_models import build_models
    from pytest_kernelpro.problem.kernelbench import import_file

    config = json.loads((work / "config.json").read_text(encoding="utf-8"))
    device = config["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = int(config.get("seed", 42))
    if config.get("cpu_threads"):
        torch.set_num_threads(int(config["cpu_threads"]))
    if config.get("memory_fraction") and device.startswith("cuda"):
        # Before the contender's code runs: its allocations past its share fail in its own
        # process (`_device_memory_share`), not in another contender's.
        cap_device_memory(torch, float(config["memory_fraction"]), device)
    try:
        measurement.apply_session_precision(torch, config)
        module = import_file(work / f"{label}.py", f"kernelpro_remeasure_{label}")
        # Built as in the gate and the sandbox (`problem.build`): one seed, the reference's
        # weights handed to the contender.
        built = build_models(module, device, seed=seed)
        ref_model, new_model = built.reference, built.kernel.model
        args = measurement.make_inputs(module, seed + 1, device)

        def reference(model: Any = ref_model) -> Any:
            with torch.no_grad():
                return model(*clone_inputs(torch, args))

        # The gate's check, as in the sandbox: one rule calibrated on the reference's own
        # error against its higher-precision truth (an exact rewrite rounds differently from
        # the reference; the dtype's default tolerance alone refused one), TF32-aware.
        rule = measurement.new_rule(config)
        started = time.perf_counter()
        expected, reduced = measurement.run_reference(torch, reference, device, first=True)
        rule.reduced = reduced
        if not _took_search_truth(rule, config.get("truth")):
            measurement.find_truth(
                torch,
                rule,
                ref_model,
                clone_inputs(torch, args),
                expected,
                device,
                reference_s=time.perf_counter() - started,
            )
        with torch.no_grad():
            got = new_model(*clone_inputs(torch, args))
        decided = measurement.verdict(torch, got, expected, rule, reduced)
        if not decided.ok:
            say(f"{ERROR} wrong result when re-measured: {decided.failure}")
            return 1

        def check(got: Any, expected: Any) -> str | None:
            verdict = measurement.verdict(torch, got, expected, rule, reduced)
            return None if verdict.ok else str(verdict.failure)

        # Timed as in the search: new input content before every call, outputs of calls
        # chosen after they returned checked against the reference (`measure.timing`).
        with torch.no_grad():
            fresh = measurement.fresh_calls(
                torch,
                new_model,
                args,
                device,
                make_draw=lambda draw_seed: measurement.make_inputs(module, draw_seed, device),
                reference=ref_model,
                check=check,
            )
        del expected, got, ref_model, reference, built
    except Exception as exc:
        say(f"{ERROR} {type(exc).__name__}: {str(exc)[:300]}")
        return 1
    budget = TimingBudget(**config.get("timing") or {})

    def call() -> Any:
        with torch.no_grad():
            return new_model(*args)

    say(READY)
    for line in sys.stdin:
        command = line.strip().split(maxsplit=2)
        if not command or command[0] == "quit":
            break
        if command[0] != "time" or len(command) < 2:
            continue
        try:
            # A round's own budget (the parent's plan), else the one of the config.
            this_round = TimingBudget(**json.loads(command[2])) if len(command) > 2 else budget
            with torch.no_grad():
                timing = time_kernel(call, device=device, budget=this_round, fresh=fresh)
        except Exception as exc:
            say(f"{ERROR} {type(exc).__name__}: {str(exc)[:300]}")
            return 1
        # Written with the encoder and file functions kept before the contender's module ran.
        ResultChannel(str(work / f"{label}.{command[1]}.json")).write(
            {"samples_s": list(timing.samples_s), "device": timing.device}
        )
        say(f"{DONE} {command[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1]), sys.argv[2]))
