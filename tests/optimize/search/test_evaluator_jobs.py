"""`SandboxEvaluator` is put together from one class per job (`supervise.WorkerSupervision`,
`worker_claims.WorkerClaims`, `confirm_winner.WinnerConfirmation`); each declares, as bare
annotations, what it uses of the evaluator. A declaration nobody provides (a method renamed in
one module, still named in another) would fail only when that path runs, mid-search; a job
that defines a declared name itself would shadow the provider. Both are caught here."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import pytest

from pytest_kernelpro.optimize.sandbox.confirm_winner import WinnerConfirmation
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.supervise import WorkerSupervision
from pytest_kernelpro.optimize.sandbox.worker_claims import WorkerClaims

JOBS = (WorkerSupervision, WorkerClaims, WinnerConfirmation)
REFERENCE = (
    "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return x + x\n\n\n"
    "def get_inputs():\n    return [torch.randn(8)]\n\n\n"
    "def get_init_inputs():\n    return []\n"
)


def unmet_needs(evaluator: object, job: type) -> list[str]:
    """The names `job` declares that `evaluator` lacks, or that `job` itself defines (a
    definition in the job would shadow what the evaluator provides). Read statically: a
    property (the isolation, probed on first use) is not run."""
    unmet = []
    for name in inspect.get_annotations(job):
        if name in vars(job):
            unmet.append(f"{name} (defined in {job.__name__}, shadowing the evaluator's)")
            continue
        try:
            inspect.getattr_static(evaluator, name)
        except AttributeError:
            unmet.append(name)
    return unmet


@pytest.fixture
def evaluator() -> Iterator[SandboxEvaluator]:
    ev = SandboxEvaluator(KernelBenchTask(reference=REFERENCE, device="cpu"), SandboxLimits())
    try:
        yield ev
    finally:
        ev.close()


def test_the_evaluator_is_made_of_its_jobs() -> None:
    assert all(issubclass(SandboxEvaluator, job) for job in JOBS)


@pytest.mark.parametrize("job", JOBS, ids=lambda job: job.__name__)
def test_every_need_a_job_declares_is_provided_by_the_evaluator(
    evaluator: SandboxEvaluator, job: type
) -> None:
    assert inspect.get_annotations(job), f"{job.__name__} declares nothing it uses"
    assert unmet_needs(evaluator, job) == []


def test_a_need_renamed_away_is_caught(evaluator: SandboxEvaluator) -> None:
    class StaleJob:
        _run_judge_renamed: Callable[[], None]  # the old name of a method since renamed
        limits: SandboxLimits

    assert unmet_needs(evaluator, StaleJob) == ["_run_judge_renamed"]


def test_a_job_that_shadows_a_need_is_caught(evaluator: SandboxEvaluator) -> None:
    class ShadowingJob:
        _launch: Callable[..., object]

        def _launch(self, *args: object) -> None:  # type: ignore[no-redef]  # noqa: F811
            return None

    assert unmet_needs(evaluator, ShadowingJob) == [
        "_launch (defined in ShadowingJob, shadowing the evaluator's)"
    ]


def test_the_evaluator_module_reexports_only_the_task_and_the_limits() -> None:
    from pytest_kernelpro.optimize.sandbox import evaluator as module

    assert sorted(module.__all__) == ["KernelBenchTask", "SandboxEvaluator", "SandboxLimits"]
