"""Checked outputs by handle through the real evaluation path (`SandboxEvaluator`: the
sandboxed worker, the session's channels, the judge): nothing outlives an evaluation, a
killed worker leaves nothing held, a candidate cannot forge, pre-empt or reach handles, and a
problem too large for the machine is refused before any worker starts, with the numbers.

Workers import torch (seconds each): one module-scoped run of every candidate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_handles import memfds, shm_entries

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox import footprint
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

torch = pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[2] / "data" / "search" / "cpu"
REFERENCE = (DATA / "reference.py").read_text(encoding="utf-8")
CORRECT = (DATA / "correct.py").read_text(encoding="utf-8")
FAST = {
    "timing": {"warmup_ms": 1.0, "max_time_s": 0.02, "min_samples": 5, "max_samples": 10},
    "cpu_threads": 1,
}
ISOLATION = Isolation.probe()

# The honest candidate, preceded by code that runs when its module loads (in the worker).
CHANNEL = "import os, socket, json, fcntl\nEND = socket.socket(fileno=int(os.environ['KERNELPRO_HANDLE_FD']))\n"
LINE = "{'output': 'trial-1', 'leaf': 0, 'kind': 'tensor', 'dtype': 'float32', 'shape': [16, 64]}"
ATTACKS = {
    # An unsealed memfd, to rewrite after the session validated it.
    "unsealed": CHANNEL
    + "fd = os.memfd_create('x', os.MFD_ALLOW_SEALING)\nos.ftruncate(fd, 16 * 64 * 4)\n"
    f"socket.send_fds(END, [json.dumps({LINE}).encode()], [fd])\n",
    # A sealed output of its own choosing, sent before the harness sends the real trial-1.
    "pre-empted": CHANNEL + "import torch\nfrom pytest_kernelpro.optimize.sandbox import handles\n"
    "handles.send_output(torch, 'trial-1', [torch.full((16, 64), 1 / 64)], channel=END)\n",
    # A descriptor of a file it can open, to make the judge read something else.
    "a file": CHANNEL + "import sys\nfd = os.open(sys.executable, os.O_RDONLY)\n"
    f"socket.send_fds(END, [json.dumps({LINE}).encode()], [fd])\n",
    # Another evaluation's outputs: any memfd of another process it can see.
    "others' memory": "import os\nfound = []\n"
    "for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
    "    try:\n"
    "        for fd in os.listdir(f'/proc/{pid}/fd'):\n"
    "            if os.readlink(f'/proc/{pid}/fd/{fd}').startswith('/memfd:'):\n"
    "                found.append((pid, fd))\n"
    "    except OSError:\n"
    "        pass\n"
    "if found:\n"
    "    raise RuntimeError(f'REACHED {found}')\n",
}
# Hand-overs the judge beside the worker must catch as each output comes: the candidate
# rewrites what the harness hands over (its own check in the worker passed on the real output).
HAND = "from pytest_kernelpro.optimize.sandbox import handles as _handles, judge as _judge\n_hand = _judge.save_output\n"
# The judge's refusal, which comes with its acknowledgment, never heard: the worker goes on and
# claims correct.
DEAF = "_handles.await_checked = lambda name, channel=None: None\n"
BAD_LATER = (
    HAND + "def _save(name, holder):\n"
    "    if name == 'trial-2':\n"
    "        holder = [holder.pop() + 1]\n"
    "    return _hand(name, holder)\n"
    "_judge.save_output = _save\n"
)
JUDGED_ATTACKS = {
    # A good trial-1, then a bad trial-2: the judge refuses it, and the worker stops there.
    "bad later output": BAD_LATER,
    # The same, the judge's refusal not heard: the worker claims correct.
    "bad later output, refusal ignored": BAD_LATER + DEAF,
    # A good trial-1 handed over, then a bad one under the same name.
    "good then bad": HAND + "def _save(name, holder):\n"
    "    output = holder[0]\n"
    "    kept = _hand(name, holder)\n"
    "    if name == 'trial-1':\n"
    "        _hand(name, [output + 1])\n"
    "    return kept\n"
    "_judge.save_output = _save\n",
    # Outputs handed over under each other's names, without waiting for the judge.
    "out of order": HAND + "_swap = {'trial-2': 'trial-3', 'trial-3': 'trial-2'}\n"
    "_judge.save_output = lambda name, holder: _hand(_swap.get(name, name), holder)\n" + DEAF,
    # Never waits for the judge: every output must still be checked.
    "impatient": HAND + DEAF,
}
# Off by a relative 1e-3: far outside the truth's tolerance of a float32 softmax, inside one
# that a forged truth (the reference's own error said to be 1) would calibrate.
OFF = CORRECT.replace(
    "return e / e.sum(dim=-1, keepdim=True)", "return e / e.sum(dim=-1, keepdim=True) * 1.001"
)
LOOSE = {
    "reduced": None,
    "truth": {
        "precision": "float64", "skipped": None, "seconds": 0.0,
        "leaves": {"output": {
            "numel": 1024, "reference_error_norm": 1.0, "truth_norm": 1.0,
            "reference_error_max": 1.0, "truth_abs_max": 1.0, "unit_roundoff": 6e-08,
        }},
    },
}  # fmt: skip
# The first judge's truth decides every later judge of the search (`WorkerClaims._run_judge`):
# a forged verdict carrying a loose truth, written wherever a judge's directory can be found.
PLANT = (
    "import glob, json, os, tempfile\n"
    f"_forged = json.dumps({{'ok': True, 'checked': [], 'known_truth': {{'payload': {LOOSE!r}, "
    "'paths': {'output': 'output'}}})\n"
    "for _dir in {tempfile.gettempdir(), '/tmp', '/dev/shm', os.path.dirname(os.getcwd())}:\n"
    "    for _judge in glob.glob(os.path.join(_dir, 'kernelpro-judge-*')):\n"
    "        try:\n"
    "            with open(os.path.join(_judge, 'judge.json'), 'w') as _f:\n"
    "                _f.write(_forged)\n"
    "        except OSError:\n"
    "            pass\n"
)
TRUTH_ATTACKS = {
    # The candidate says the truth on the worker's channel: only the judge's is handed on.
    "truth sent": CHANNEL + f"END.send(json.dumps({{'truth': {LOOSE!r}}}).encode())\n",
    # The candidate gives its own worker a loose truth: the judge compares with its own.
    "truth patched": "from pytest_kernelpro.optimize.sandbox import handles as _handles\n"
    f"_handles.await_truth = lambda channel=None: {LOOSE!r}\n",
    # The same, and the judge's refusal not heard: the loosened worker claims correct.
    "truth patched, refusal ignored": "from pytest_kernelpro.optimize.sandbox import handles "
    f"as _handles\n_handles.await_truth = lambda channel=None: {LOOSE!r}\n" + DEAF,
    # A loose truth planted for the judges after it, and the same off output.
    "truth planted": PLANT,
}
# A forged trial-1 sent in the candidate's first call, after the worker has the judge's truth:
# the judge refuses it and says so, and that word reaches the worker before its own trial-1 is
# acknowledged (the call waits for it), so the worker says "wrong". The session refused the
# worker's own trial-1 (sent after its end): a forged hand-over, a cheat, whatever the
# worker says.
PRE_EMPTED_IN_CALL = (
    CHANNEL
    + "import time as _time, torch as _torch\n"
    + "from pytest_kernelpro.optimize.sandbox import handles as _handles\n"
    + CORRECT.replace(
        "    def forward(self, x):\n",
        "    calls = 0\n\n    def forward(self, x):\n"
        "        type(self).calls += 1\n"
        "        if type(self).calls == 1:\n"
        "            _handles.send_output(_torch, 'trial-1', [_torch.full((16, 64), 1 / 64)], "
        "channel=END)\n"
        "            _time.sleep(5)\n",
    )
)
# Hands over trial 1's output, then hangs in trial 2 until the run timeout kills it.
HANGS = CORRECT.replace(
    "    def forward(self, x):\n",
    "    calls = 0\n\n    def forward(self, x):\n"
    "        type(self).calls += 1\n"
    "        if type(self).calls > 1:\n"
    "            import time\n            time.sleep(3600)\n",
)


@pytest.fixture(scope="module")
def world() -> dict[str, object]:
    before = {"memfds": memfds(), "shm": shm_entries()}
    task = KernelBenchTask(REFERENCE, name="softmax_linear", device="cpu", **FAST)
    # The run timeout is what the hang waits for (the others' runs take well under a second of
    # it: a 16x64 problem on a 0.02 s timing budget), so it is short but far above their need.
    limits = SandboxLimits(build_timeout_s=120.0, run_timeout_s=15.0, memory_limit_mb=2048)
    evaluator = SandboxEvaluator(task, limits)
    # Two at a time, in this order: the hang holds its trial-1 output in one slot for the whole
    # run timeout while the other slot evaluates the honest candidate, then the memory scan
    # (which so runs while the session holds another evaluation's outputs), then the rest.
    attacks = {"others' memory": ATTACKS["others' memory"], **ATTACKS, **JUDGED_ATTACKS}
    names = ["hangs", "honest", *attacks, *TRUTH_ATTACKS, "pre-empted in its first call"]
    codes = [
        HANGS,
        CORRECT,
        *(attack + "\n" + CORRECT for attack in attacks.values()),
        *(attack + "\n" + OFF for attack in TRUTH_ATTACKS.values()),
        PRE_EMPTED_IN_CALL,
    ]
    try:
        evaluations = evaluator.evaluate_many([Candidate(code) for code in codes], jobs=2)
        held = {
            "memfds": memfds(),
            "channels": len(evaluator.handles._ends),
            "shm": shm_entries(),
        }
    finally:
        evaluator.close()
    return {
        "before": before,
        "after": held,
        "known truth": evaluator._known_truth,
        **dict(zip(names, evaluations, strict=True)),
    }


def _ev(world: dict[str, object], name: str) -> Evaluation:
    ev = world[name]
    assert isinstance(ev, Evaluation)
    return ev


@pytest.mark.slow
def test_an_honest_candidate_is_judged_on_its_handed_over_outputs(world) -> None:
    ev = _ev(world, "honest")
    assert ev.status == "correct", (ev.reason, ev.logs[-2000:])
    verified = ev.correctness["verified_by"]
    assert verified.startswith("judge: outputs of trial-1, trial-2, trial-3, inplace, after-timing")
    assert ev.metrics["footprint"]["footprint_bytes"] == 2 * 16 * 64 * 4
    # The worker found no truth of its own: the judge's came by the session.
    assert ev.correctness["truth"] == "the judge's, calibrating every check here"
    # The errors recorded are the judge's, which decided every judged call (the worker
    # compared only the second shape).
    assert 0.0 <= ev.correctness["max_abs_err"] < 1e-6, ev.correctness
    assert ev.correctness["accuracy"]["factor"] is not None, ev.correctness["accuracy"]
    assert ev.metrics["both_peak_at"]["worker_phase"]  # where the evaluation's peak was


@pytest.mark.slow
def test_nothing_outlives_the_evaluations_not_even_a_killed_workers(world) -> None:
    hangs = _ev(world, "hangs")
    assert hangs.status == "timeout", hangs.reason  # killed after it handed over trial-1
    after, before = world["after"], world["before"]
    assert after["memfds"] == before["memfds"]  # type: ignore[index]
    assert after["channels"] == 0  # type: ignore[index]
    assert after["shm"] == before["shm"]  # type: ignore[index]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("unsealed", "the memfd is not sealed against writes"),
        ("pre-empted", "output trial-1 leaf 0 sent after its end"),
        ("a file", "not a sealed memfd"),
    ],
)
def test_a_forged_handle_is_refused_and_the_candidate_not_believed(world, name, says) -> None:
    ev = _ev(world, name)
    assert ev.status == "cheat", (ev.reason, ev.logs[-2000:])
    assert ev.reason.startswith("result not confirmed: the outputs it handed over were refused")
    assert says in ev.reason
    assert ev.speedup is None


@pytest.mark.slow
def test_an_output_the_judge_refuses_stops_the_worker_with_the_judges_reason(world) -> None:
    """The worker makes no comparison of its own for a call the judge decides: a bad trial-2
    output (handed over in place of the one the kernel returned) is refused by the judge as
    it comes, and the worker, told why with the acknowledgment, stops there, wrong, with the
    judge's reason (its own check never saw that output)."""
    ev = _ev(world, "bad later output")
    assert ev.status == "wrong", (ev.reason, ev.logs[-2000:])
    assert ev.reason.startswith("wrong result (trial 2/3): "), ev.reason
    assert "outside rtol=" in ev.reason
    assert ev.correctness["passed"] == 1
    assert ev.speedup is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("bad later output, refusal ignored", "(trial-2: "),
        ("out of order", "(trial-3: handed over where trial-2 was due"),
    ],
)
def test_an_output_checked_as_it_comes_is_checked_against_the_judges_reference(
    world, name, says
) -> None:
    """The judge beside the worker compares each handed-over output, in order, with the
    reference it computes itself: a good first output does not carry a bad later one, and a
    worker that does not hear the judge's refusal and claims correct is a broken claim."""
    ev = _ev(world, name)
    assert ev.status == "cheat", (ev.reason, ev.logs[-2000:])
    assert "differ from the reference computed in a trusted process" in ev.reason
    assert says in ev.reason
    assert ev.speedup is None


@pytest.mark.slow
def test_a_forged_output_the_judge_refused_is_a_cheat_though_the_worker_says_wrong(world) -> None:
    """The judge's refusal of a forged trial-1 made the worker stop, wrong; the session had
    refused the worker's own trial-1 as sent after the forged one's end. A refused hand-over
    is no honest worker's: the evaluation is a cheat, with the refusal as its reason (it was
    "wrong" before the evaluator looked at refused hand-overs of a worker saying "wrong")."""
    ev = _ev(world, "pre-empted in its first call")
    assert ev.status == "cheat", (ev.reason, ev.logs[-2000:])
    assert ev.reason.startswith("result not confirmed: the outputs it handed over were refused")
    assert "trial-1" in ev.reason
    assert ev.speedup is None


@pytest.mark.slow
def test_a_good_output_then_a_bad_one_under_its_name_is_refused(world) -> None:
    ev = _ev(world, "good then bad")
    assert ev.status == "cheat", (ev.reason, ev.logs[-2000:])
    assert "refused (output trial-1 leaf 0 sent after its end)" in ev.reason


@pytest.mark.slow
def test_a_worker_that_does_not_wait_for_the_judge_is_still_judged_on_every_output(world) -> None:
    ev = _ev(world, "impatient")
    assert ev.status == "correct", (ev.reason, ev.logs[-2000:])
    verified = ev.correctness["verified_by"]
    assert verified.startswith("judge: outputs of trial-1, trial-2, trial-3, inplace, after-timing")


@pytest.mark.slow
def test_the_session_holds_one_checked_output_at_a_time(world) -> None:
    ev = _ev(world, "honest")
    assert ev.metrics["held_outputs_peak_bytes"] == 16 * 64 * 4  # one output's bytes


@pytest.mark.slow
@pytest.mark.skipif(not ISOLATION.isolated, reason=f"no Linux namespaces: {ISOLATION.why}")
def test_a_candidate_reaches_no_other_processs_shared_memory(world) -> None:
    """Two evaluations ran at once and the session held the other's outputs: the
    candidate's PID namespace shows it no process holding them."""
    ev = _ev(world, "others' memory")
    assert ev.status == "correct", (ev.reason, ev.logs[-2000:])


def test_a_problem_too_large_is_refused_before_any_worker_with_the_numbers() -> None:
    big = REFERENCE.replace("batch, n = 16, 64", "batch, n = 8192, 4096")
    task = KernelBenchTask(big, name="big_softmax", device="cpu")
    evaluator = SandboxEvaluator(task, SandboxLimits(memory_limit_mb=512))
    try:
        with pytest.raises(KernelproError) as caught:
            evaluator.evaluate(Candidate(CORRECT))
        assert evaluator.standbys.started == 0
        assert evaluator.handles._ends == {}
    finally:
        evaluator.close()
    text = str(caught.value)
    # Input 8192x4096 and output 8192x4096, fp32: 128 MiB each; the peak is the worker's
    # timing (4 inputs, 2.25 outputs, two fifths more) and the fixed 928 MiB (the worker's
    # and the judge's interpreters): 1.09 + 0.91 GiB.
    assert "'big_softmax' is too large" in text
    assert "one call's inputs take 0.12 GiB and its output 0.12 GiB (in host memory)" in text
    assert (
        "holds up to 2.00 GiB of host memory at its peak (the worker's timing phase: 4 copies "
        "of the inputs" in text
    )
    assert "2.25 of the output, two fifths more for what the table misses, and 0.91 GiB" in text
    assert "memory limit is 0.50 GiB" in text


def test_the_footprint_takes_no_memory_and_unknown_problems_are_not_refused() -> None:
    huge = REFERENCE.replace("batch, n = 16, 64", "batch, n = 2**20, 2**16")  # 2 TiB: meta only
    assert footprint.meta_footprint(huge) == footprint.Footprint(2**36 * 4, 2**36 * 4)
    numpy_inputs = REFERENCE.replace(
        "return [torch.randn(batch, n)]", "import numpy\n    return [numpy.zeros(3)]"
    )
    assert footprint.meta_footprint(numpy_inputs) is None  # no estimate: not refused
    huge_call = footprint.Footprint(10**12, 10**12)
    assert footprint.refusal("p", huge_call, None) is None  # no memory limit: not refused


def test_the_memory_scan_finds_a_memfd_where_it_can_see_one() -> None:
    """The control of the attack above: outside a PID namespace the same scan reaches this
    process's memfd (so the attack's "correct" means the namespace hid it)."""
    import subprocess
    import sys

    fd = os.memfd_create("kernelpro-control")
    try:
        run = subprocess.run(
            [sys.executable, "-c", ATTACKS["others' memory"]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(fd)
    assert run.returncode != 0
    assert f"('{os.getpid()}', '{fd}')" in run.stderr


@pytest.mark.slow
def test_a_truth_the_candidate_sends_on_its_channel_is_not_its_workers(world) -> None:
    """The worker got the judge's truth, not the loose one the candidate sent: its own check
    found the output wrong on the first trial."""
    ev = _ev(world, "truth sent")
    assert ev.status == "wrong", (ev.reason, ev.logs[-2000:])
    assert ev.reason.startswith("wrong result (trial 1/3)"), ev.reason


@pytest.mark.slow
def test_a_truth_the_candidate_gives_its_own_worker_does_not_pass_the_judge(world) -> None:
    """A worker loosened by the candidate would pass the off output; it compares none of the
    calls the judge decides, and the judge, by its own truth, refuses the first output and
    says why: the worker stops at trial 1, wrong. Not hearing that refusal, the loosened
    worker claims correct: the tolerance the judge told fails the first output too, a
    broken claim."""
    ev = _ev(world, "truth patched")
    assert ev.status == "wrong", (ev.reason, ev.logs[-2000:])
    assert ev.reason.startswith("wrong result (trial 1/3)"), ev.reason
    ev = _ev(world, "truth patched, refusal ignored")
    assert ev.status == "cheat", (ev.reason, ev.logs[-2000:])
    assert "differ from the reference computed in a trusted process (trial-1: " in ev.reason
    assert ev.speedup is None


@pytest.mark.slow
def test_a_truth_planted_for_later_judges_is_not_the_one_they_take(world) -> None:
    """Every judge after the first takes the first one's truth, kept by the session; a
    candidate that writes a forged verdict with a loose truth wherever it finds a judge's
    directory changes neither: its own off output is wrong at its first trial, the truth the
    session kept is the reference's own error (a float32 softmax's, not the planted 1.0),
    and the evaluations judged by it after the first said so."""
    ev = _ev(world, "truth planted")
    assert ev.status == "wrong", (ev.reason, ev.logs[-2000:])
    assert ev.reason.startswith("wrong result (trial 1/3)"), ev.reason
    known = world["known truth"]
    assert isinstance(known, dict)
    (leaf,) = known["payload"]["truth"]["leaves"].values()
    assert 0 < leaf["reference_error_norm"] < 1e-5, leaf
    by = [
        world[name].metrics.get("truth_by", "")
        for name in world
        if isinstance(world[name], Evaluation)
    ]
    assert "this evaluation's judge" in by
    assert any(b.startswith("an earlier evaluation's judge") for b in by), by


# Its first call outlasts the build limit below (the worker is then in its run phase, under
# the run limit); the judge beside it, started with it, waits for that call's output.
OUTLASTS_THE_BUILD_LIMIT = CORRECT.replace(
    "    def forward(self, x):\n",
    "    calls = 0\n\n    def forward(self, x):\n"
    "        type(self).calls += 1\n"
    "        if type(self).calls == 1:\n"
    "            import time\n            time.sleep(50)\n",
)


@pytest.mark.slow
def test_a_judge_lives_as_long_as_the_worker_beside_it_not_its_build_limit() -> None:
    """The judge reports no phase, so the watch gave it the build limit from its start; a
    worker under its run limit can take longer than that (a large problem's checks and
    timing), and its judge was killed while waiting for an output ("the judge process ended
    without a result (signal SIGKILL, timeout)"). The judge beside a live worker is held by
    the worker's limits, then has its run limit for the verdict and the reference's time."""
    task = KernelBenchTask(REFERENCE, name="softmax_linear", device="cpu", **FAST)
    limits = SandboxLimits(build_timeout_s=40.0, run_timeout_s=300.0, memory_limit_mb=2048)
    evaluator = SandboxEvaluator(task, limits)
    try:
        ev = evaluator.evaluate(Candidate(OUTLASTS_THE_BUILD_LIMIT))
    finally:
        evaluator.close()
    assert ev.status == "correct", (ev.reason, ev.logs[-2000:])
    assert ev.correctness["verified_by"].startswith("judge: outputs of trial-1")
    assert ev.wall_s > limits.build_timeout_s  # the judge outlived its build limit
