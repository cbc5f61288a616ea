"""The search hands each expansion to the evaluator chain before evaluating its candidates,
so the sandbox evaluator can compile all of them at once (`SandboxEvaluator.prepare`)."""

from __future__ import annotations

from pytest_kernelpro.optimize.candidate_profile.evaluator import ProfilingEvaluator
from pytest_kernelpro.optimize.cutlass.precheck import PrecheckEvaluator
from pytest_kernelpro.optimize.loop.clock import TimedEvaluator, WallClock
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig


class Recording:
    """The innermost evaluator: records prepare and evaluate calls in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[str, ...]]] = []

    def prepare(self, candidates) -> None:  # noqa: ANN001
        self.events.append(("prepare", tuple(c.code for c in candidates)))

    def evaluate(self, candidate: Candidate) -> Evaluation:
        self.events.append(("evaluate", (candidate.code,)))
        return Evaluation(status="build_error", reason="not built", build_s=0.5)


class Three:
    def __init__(self) -> None:
        self.count = 0

    def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
        out = []
        for _ in range(min(3, max_candidates)):
            self.count += 1
            out.append(Candidate(code=f"# candidate {self.count}\nclass ModelNew: pass\n"))
        return out


def test_each_expansion_is_prepared_through_the_wrappers_before_its_evaluations() -> None:
    inner = Recording()
    chain = TimedEvaluator(
        ProfilingEvaluator(PrecheckEvaluator(inner, arch="sm_90a"), profiler=None),  # type: ignore[arg-type]
        WallClock(),
    )
    MCTS(MCTSConfig(candidates_per_expansion=3)).run(Three(), chain, "6")
    kinds = [kind for kind, _ in inner.events]
    assert kinds[0] == "prepare"
    first_batch = inner.events[0][1]
    assert len(first_batch) >= 2  # the siblings of one expansion, together
    evaluated = [codes[0] for kind, codes in inner.events if kind == "evaluate"]
    assert evaluated[: len(first_batch)] == list(first_batch)
    # every evaluated candidate was prepared before its evaluation
    prepared: set[str] = set()
    for kind, codes in inner.events:
        if kind == "prepare":
            prepared.update(codes)
        else:
            assert codes[0] in prepared
    # every evaluation went through the wall split (its parts capped at the time it took:
    # a claimed 0.5 s build of an instant evaluation is not 0.5 s of the search)
    assert [p["status"] for p in chain.clock.per_candidate] == ["build_error"] * len(evaluated)
    assert chain.clock.build <= sum(p["elapsed_s"] for p in chain.clock.per_candidate)
