"""The final re-measurement: contenders timed again, interleaved, one process each.

`remeasure(reference, contenders, ...)` starts one worker process per contender (the user's
current kernel, the reference and the top candidates; each a module defining `ModelNew`
next to the reference's `class Model`), lets every worker build its model, copy the
reference's weights (by name, else by position and shape), check its output once against
the reference and warm up, and then runs `rounds` rounds: in each round the workers time
their kernel one after another (never two at once on one device), in an order rotated per
round, with the gate's timer (`measure.timing.time_kernel`: adaptive sampling, L2 flush).
The samples of all rounds are pooled per contender for `search.ranking.rank`.

One process per contender keeps a hostile candidate from touching another's timing (a
candidate that patches torch in its own process only fools its own numbers, as in the
sandbox), and a fresh CUDA context per contender keeps a crash local. Workers get the
sandbox's scrubbed environment and run inside the candidate sandbox (`isolation.py`: PID,
network and mount namespaces, a scratch directory per contender, no capabilities), and are
killed at the time limit (with their PID namespace, every process they started).

The worker protocol is line based: the parent writes `time <round>` or `quit` to the
worker's stdin; the worker answers `ready`, `done <round>` or `error <message>` on stdout
and writes each round's samples to `<label>.<round>.json` in the work directory.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.search import measurement
from pytest_kernelpro.search.compile_cache import CompileCaches, point_caches
from pytest_kernelpro.search.isolation import Isolation

READY, DONE, ERROR = "ready", "done", "error"


@dataclass
class RemeasureResult:
    """Pooled samples per contender label; `errors` for those that failed."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    order: list[list[str]] = field(default_factory=list)  # the order of each round
    wall_s: float = 0.0
    device: str = ""
    warm: list[str] = field(default_factory=list)  # contenders started from kept caches


def _combined(reference: str, code: str) -> str:
    return reference.rstrip() + "\n\n\n# ---- contender ----\n" + code.rstrip() + "\n"


class _Worker:
    def __init__(self, label: str, proc: subprocess.Popen[bytes]) -> None:
        self.label = label
        self.proc = proc
        self.error: str | None = None
        self._buffer = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def read(self, deadline: float) -> str:
        """The next protocol line of the worker's stdout (other output is skipped), or ""
        at the deadline or when the worker exits. Reads the pipe unbuffered, so a line
        that arrived with another is never left waiting in a buffer."""
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

    def kill(self) -> None:
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
) -> RemeasureResult:
    """Time `contenders` ((label, ModelNew module code), ...) in interleaved rounds; each
    contender's worker starts from a copy of the compile caches its code's evaluation kept
    (`caches`, the sandbox evaluator's `compile_caches`)."""
    if rounds < 1:
        raise KernelproError(f"remeasure rounds={rounds!r} must be at least 1")
    labels = [label for label, _ in contenders]
    if len(set(labels)) != len(labels):
        raise KernelproError(f"remeasure contender labels must be unique, got {labels}")
    if env is None:
        from pytest_kernelpro.search.environment import PACKAGE_ROOT, scrub_environment

        env = scrub_environment(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
        )
    started = time.monotonic()
    deadline = started + timeout_s
    result = RemeasureResult(rounds=rounds)
    with tempfile.TemporaryDirectory(prefix="kernelpro-remeasure-") as tmp:
        work = Path(tmp)
        config = {
            "device": device,
            "timing": dict(timing or {}),
            "seed": seed,
            "atol": atol,
            "rtol": rtol,
            # The session's TF32 flags, read here in the parent: the check below relaxes
            # the fp32 tolerance when the gate's would.
            measurement.PRECISION_KEY: measurement.session_fp32_precision(),
        }
        workers: list[_Worker] = []
        # Contenders run candidate code: each in the candidate sandbox, with a scratch
        # directory of its own (its samples cannot be overwritten by another contender).
        isolation = Isolation.probe(cuda=device.startswith("cuda"), env=dict(env))
        try:
            for label, code in contenders:
                scratch = work / label
                scratch.mkdir()
                (scratch / "config.json").write_text(json.dumps(config), encoding="utf-8")
                (scratch / f"{label}.py").write_text(_combined(reference, code), encoding="utf-8")
                command = [python, "-m", "pytest_kernelpro.search.remeasure", str(scratch), label]
                worker_env = dict(env)
                for name, sub in (("HOME", "home"), ("TMPDIR", "tmp")):  # the rest is read-only
                    (scratch / sub).mkdir()
                    worker_env[name] = str(scratch / sub)
                point_caches(worker_env, scratch / "home")
                if caches is not None and caches.seed(code, scratch / "home"):
                    result.warm.append(label)
                with open(work / f"{label}.stderr", "wb") as err:
                    proc = subprocess.Popen(
                        isolation.wrap(command, scratch=scratch, python=python),
                        cwd=scratch,
                        env=worker_env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        start_new_session=True,
                    )
                workers.append(_Worker(label, proc))
            for w in workers:  # they build in parallel; the GPU work starts after
                line = w.read(deadline)
                if line != READY:
                    w.error = _why(line, work, w.label, "while building and checking")
            alive = [w for w in workers if w.error is None]
            for r in range(rounds):
                shift = r % max(1, len(alive))
                order = alive[shift:] + alive[:shift]
                result.order.append([w.label for w in order])
                for w in order:
                    if w.error is not None:
                        continue
                    w.send(f"time {r}")
                    line = w.read(deadline)
                    if line != f"{DONE} {r}":
                        w.error = _why(line, work, w.label, f"in round {r + 1}")
                        continue
                    data = json.loads(
                        (work / w.label / f"{w.label}.{r}.json").read_text(encoding="utf-8")
                    )
                    result.samples.setdefault(w.label, []).extend(data["samples_s"])
                    result.device = data.get("device", result.device)
        finally:
            for w in workers:
                if w.proc.poll() is None and w.error is None:
                    try:
                        w.send("quit")
                    except OSError:
                        pass
                w.kill()
        for w in workers:
            if w.error is not None:
                result.errors[w.label] = w.error
                result.samples.pop(w.label, None)
    result.wall_s = time.monotonic() - started
    return result


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

    from pytest_kernelpro.measure.correctness import clone_inputs
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
    from pytest_kernelpro.problem import import_file
    from pytest_kernelpro.problem.build import build_models

    config = json.loads((work / "config.json").read_text(encoding="utf-8"))
    device = config["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = int(config.get("seed", 42))
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

        # The gate's check, as in the sandbox: its tolerances (TF32-aware) and comparison.
        expected, reduced = measurement.run_reference(torch, reference, device, first=True)
        with torch.no_grad():
            got = new_model(*clone_inputs(torch, args))
        decided = measurement.verdict(torch, got, expected, config, reduced)
        if not decided.ok:
            say(f"{ERROR} wrong result when re-measured: {decided.failure}")
            return 1
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
        command = line.strip().split()
        if not command or command[0] == "quit":
            break
        if command[0] != "time":
            continue
        try:
            timing = time_kernel(call, device=device, budget=budget)
        except Exception as exc:
            say(f"{ERROR} {type(exc).__name__}: {str(exc)[:300]}")
            return 1
        out = work / f"{label}.{command[1]}.json"
        out.write_text(
            json.dumps({"samples_s": list(timing.samples_s), "device": timing.device}),
            encoding="utf-8",
        )
        say(f"{DONE} {command[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1]), sys.argv[2]))
