"""Hostile candidates against the sandbox (tests/data/search/attacks/): each attack is blocked,
and the evaluation says why (the attacks and their checks: sandbox_attack_cases.py, shared with
test_dask_sandbox.py). Workers import torch (seconds each): one module-scoped run.

The isolation tests need Linux namespaces (`isolation.Isolation.probe()`); where the machine
has none they are skipped with the probe's reason, and the fallback is tested for what it
promises (a scrubbed environment), not for what it cannot do.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_attack_cases import (
    CHECKS,
    DATA,
    SCRATCH_LIMIT_MB,
    Listener,
    Outcome,
    allow_list_world,
    attack,
    check_build_flags,
    check_double_fork,
    check_exfil_output,
    check_fill_disk,
    check_flood_output,
    check_poison_cache,
    check_read_secrets,
    programs,
)

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox import isolation
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import CUDA_LADDER, RELAXATIONS, Isolation
from pytest_kernelpro.optimize.sandbox.worker import RETIME_MAX_SAMPLES
from pytest_kernelpro.optimize.search.interfaces import Candidate

pytestmark = pytest.mark.slow

CANARY = "kp-canary-7f3a9c1e5b2d4a60"
FAST_TIMING = {
    "timing": {
        "warmup_ms": 1.0,
        "max_time_s": 0.02,
        "min_samples": 5,
        "max_samples": 10,
        "flush_l2": False,
    },
    "cpu_threads": 1,
}
LIMITS = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)
ISOLATION = Isolation.probe()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)


def task(**options: object) -> KernelBenchTask:
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    return KernelBenchTask(
        reference, name="softmax_linear", device="cpu", **{**FAST_TIMING, **options}
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("attacks")
    listener = Listener()
    names = programs(root, listener)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELPRO_CANARY_TOKEN", CANARY)
        mp.setenv("GITHUB_TOKEN", CANARY)
        # The project view shows kernels.py (the entry), read-only; nothing else of the repo.
        shown = (str(root / "repo" / "kernels.py"),)
        evaluator = SandboxEvaluator(
            task(sys_path=(str(root / "repo"),), view_entries=shown), LIMITS
        )
        evaluations = evaluator.evaluate_many([Candidate(code) for code in names.values()], jobs=2)
    time.sleep(1.0)  # a surviving grandchild would write its marker within 0.1 s
    listener.close()
    return {
        name: Outcome(ev, root, listener, ISOLATION, secrets=(CANARY,))
        for name, ev in zip(names, evaluations, strict=True)
    }


@pytest.fixture(scope="module")
def allow_list(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """The second group: a home of credentials (the session's HOME), a repository with
    secret files (the task's sys.path), builds ahead on (KERNELPRO_CUDA_ARCH), a small
    scratch limit."""
    root = tmp_path_factory.mktemp("allow-list")
    extensions = root / "shared-extensions"
    names, home, repo = allow_list_world(root, extensions)
    listener = Listener()
    limits = dataclasses.replace(
        LIMITS, scratch_limit_mb=SCRATCH_LIMIT_MB, extensions_dir=str(extensions)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("KERNELPRO_CANARY_TOKEN", CANARY)
        mp.setenv("KERNELPRO_CUDA_ARCH", "sm_90a")  # the search builds load_inline ahead
        mp.setenv("KERNELPRO_BUILD_CACHE", str(root / "build-cache"))
        mp.chdir(repo)  # the session runs in the project
        evaluator = SandboxEvaluator(task(sys_path=(str(repo),)), limits)
        candidates = [Candidate(code) for code in names.values()]
        evaluator.prepare(candidates)
        try:
            evaluations = evaluator.evaluate_many(candidates, jobs=2)
        finally:
            evaluator.close()
    listener.close()
    outcomes = {
        name: Outcome(ev, root, listener, ISOLATION, secrets=(CANARY,))
        for name, ev in zip(names, evaluations, strict=True)
    }
    outcomes["_paths"] = (extensions, root / "build-cache")  # type: ignore[assignment]
    return outcomes


def test_a_build_flag_with_a_shell_command_is_refused_by_name(allow_list) -> None:
    check_build_flags(allow_list["build_flags"])


def test_home_and_the_repositorys_secret_files_and_environments_are_unreadable(
    allow_list,
) -> None:
    check_read_secrets(allow_list["read_secrets"])


def test_secrets_and_escapes_in_stdout_and_error_text_are_redacted(allow_list) -> None:
    check_exfil_output(allow_list["exfil_output"])


def test_a_double_forked_daemon_dies_with_the_candidate(allow_list) -> None:
    check_double_fork(allow_list["double_fork"])


def test_filling_the_scratch_disk_is_stopped(allow_list) -> None:
    check_fill_disk(allow_list["fill_disk"])


def test_megabytes_of_output_keep_a_bounded_tail(allow_list) -> None:
    check_flood_output(allow_list["flood_output"], LIMITS.log_chars)


def test_no_candidate_can_plant_a_build_another_will_load(allow_list) -> None:
    extensions, cache = allow_list["_paths"]
    check_poison_cache(allow_list["poison_cache"], extensions, cache)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_attack_is_blocked_and_says_why(world: dict[str, Outcome], name: str) -> None:
    assert sorted(world) == sorted(CHECKS)  # every attack evaluated has its check
    CHECKS[name](world[name])


def test_the_evaluation_says_how_it_was_isolated(world: dict[str, Outcome]) -> None:
    assert world["connect_out"].evaluation.metrics["sandbox"] == ISOLATION.describe()


def test_a_patched_clock_is_caught_when_the_candidate_is_evaluated() -> None:
    """Caught at every candidate's evaluation, not only at the winner's confirmation: the
    timer's clock is kept before the candidate runs and a rebound one is refused."""
    evaluator = SandboxEvaluator(task(), LIMITS)
    forged = Candidate(attack("slow_timed"))
    ev = evaluator.evaluate(forged)
    assert ev.status == "cheat", ev.reason  # its outputs are right; only its time is forged
    # The candidate's module made the patch: it is named, whenever the patch was seen.
    assert (ev.reason or "").startswith(
        (
            "refused while timed: time.perf_counter (now kernelpro_candidate.fake_clock, made "
            "by kernelpro_candidate",  # seen while it was timed
            "refused while timed: its module (<kernelpro_candidate>) rebound time.perf_counter "
            "(to kernelpro_candidate.fake_clock), found and put back before this timing",
        )
    ), ev.reason
    assert ev.speedup is None


@pytest.mark.parametrize(
    "standby",
    [
        0,
        1,
    ],
    ids=["fresh-processes", "standby-pool"],
)
def test_an_honest_winner_is_confirmed(standby: int) -> None:
    """With standbys, the judge was started ahead with a view of the pool's area only: the
    re-timing's outputs must be written there, or the judge cannot read them and an honest
    winner is disqualified ("no output file retimed.pt", seen on the H200)."""
    limits = SandboxLimits(
        build_timeout_s=120.0,
        run_timeout_s=90.0,
        memory_limit_mb=1024,
        confirm_tolerance=50.0,
        standby=standby,
    )
    evaluator = SandboxEvaluator(task(), limits)
    honest = Candidate((DATA / "cpu" / "correct.py").read_text(encoding="utf-8"))
    ev = evaluator.evaluate(honest)
    assert ev.status == "correct", ev.reason
    assert ev.correctness["verified_by"].startswith("judge: outputs of trial-1, trial-2, trial-3")
    confirmed = evaluator.confirm(honest, ev)
    assert confirmed.status == "correct", confirmed.reason
    record = confirmed.timing["confirmed"]
    assert record["median_s"] > 0
    # Bounded by what the decision needs: the task's min_samples at least, the cap at most,
    # and no reference time (the judge only checks the re-timed output).
    assert 5 <= record["samples"] <= RETIME_MAX_SAMPLES
    assert "speedup" not in record
    assert "reference_median_s" not in record
    # The search's timed call on the gate's timer: fresh content every call, outputs checked.
    assert record["method"].startswith("the gate's timer (cpu-perf-counter), fresh inputs")
    assert record["honesty"]["mode"] in ("mix", "maker")
    assert record["honesty"]["checked_calls"] >= 1
    assert record["claimed_median_s"] == ev.timing["candidate"]["median_s"]
    assert record["ratio"] == pytest.approx(record["median_s"] / record["claimed_median_s"])
    assert record["tolerance"] == 50.0
    assert record["ncu_gpu_time_s"] is None  # not profiled on the CPU


def test_a_time_below_ncus_kernel_duration_is_disqualified_at_confirmation() -> None:
    """The cross-check with the profile: the same honest candidate, with a profile saying
    its kernels take a second of GPU time per call (as ncu would for a forged 1000x time)."""
    limits = dataclasses.replace(LIMITS, confirm_tolerance=50.0)
    evaluator = SandboxEvaluator(task(), limits)
    honest = Candidate((DATA / "cpu" / "correct.py").read_text(encoding="utf-8"))
    ev = evaluator.evaluate(honest)
    assert ev.status == "correct", ev.reason
    ev.metrics["profile"] = {"ncu_gpu_time_s": 1.0}
    confirmed = evaluator.confirm(honest, ev)
    assert confirmed.status == "cheat"
    assert (confirmed.reason or "").startswith(
        "timing not confirmed: ncu measured the candidate's kernels at 1e+06 µs of GPU time"
    )
    assert confirmed.timing["confirmation"]["ncu_gpu_time_s"] == 1.0


def test_namespaces_mode_refuses_the_fallback() -> None:
    if ISOLATION.isolated:
        assert Isolation.probe("namespaces") == ISOLATION
    else:
        with pytest.raises(KernelproError, match="needs Linux namespaces"):
            Isolation.probe("namespaces")
    with pytest.raises(KernelproError, match="Invalid sandbox isolation mode 'none'"):
        Isolation.probe("none")


def test_the_environment_of_this_test_is_restored() -> None:
    assert os.environ.get("KERNELPRO_CANARY_TOKEN") is None


RUNG_CHECK = (
    "import os, stat\n"
    "print('repo', os.access({repo!r}, os.W_OK))\n"
    "print('sysctl', os.access('/proc/sys/kernel/core_pattern', os.W_OK))\n"
    "print('blockdev', any(stat.S_ISBLK(os.stat('/dev/' + n).st_mode) for n in os.listdir('/dev')))\n"
    "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
)


@needs_namespaces
@pytest.mark.parametrize("relax", CUDA_LADDER, ids=lambda r: "+".join(r) or "full")
def test_every_cuda_relaxation_keeps_the_core_promises(
    relax: tuple[str, ...], tmp_path: Path
) -> None:
    # Run here on the CPU: the relaxed setups must still start, and still keep the
    # repository read-only, sysctls read-only, block devices out and other processes hidden.
    repo_file = Path(__file__).resolve()
    iso = dataclasses.replace(ISOLATION, relax=relax)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code = RUNG_CHECK.format(repo=str(repo_file))
    out = subprocess.run(
        iso.wrap([sys.executable, "-c", code], scratch=scratch),
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["repo False", "sysctl False", "blockdev False", "pids [1]"]
    for name in relax:
        assert RELAXATIONS[name] in iso.describe()


@needs_namespaces
def test_without_a_gpu_the_cuda_probe_falls_back_and_says_why() -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("this machine has a CUDA GPU")
    found = isolation._probe_cuda(ISOLATION, None)
    assert found.level == "fallback"
    assert found.why.startswith("CUDA does not initialise inside the namespaces (tried full: ")
    assert "host_dev+writable_proc: " in found.why
