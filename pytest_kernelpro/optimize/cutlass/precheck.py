"""An `Evaluator` wrapper that applies the constraint checker before anything is compiled.

A candidate whose source breaks a hard constraint (error severity) is a `build_error` at
once, with the violations as its build log, so the Programmer's debug prompt shows them;
warnings are kept in the evaluation's findings and the candidate is evaluated as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_kernelpro.optimize.cutlass.constraints import check_source
from pytest_kernelpro.optimize.search.interfaces import Evaluation

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluator


class PrecheckEvaluator:
    """Checks `check_source(code, arch)` and delegates to `inner` unless an error is found."""

    def __init__(self, inner: Evaluator, *, arch: str) -> None:
        self.inner = inner
        self.arch = arch

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Let the inner evaluator build ahead (see `SandboxEvaluator.prepare`)."""
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            prepare(candidates)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """A build error for constraint violations, else the inner evaluation."""
        violations = check_source(candidate.code, arch=self.arch)
        errors = [v for v in violations if v.severity == "error"]
        if errors:
            return Evaluation(
                status="build_error",
                reason=f"{len(errors)} hard-constraint violation(s) found before compiling: "
                + "; ".join(f"[{v.constraint}] {v.message}" for v in errors[:3]),
                build_log="\n".join(v.render() for v in violations),
            )
        evaluation = self.inner.evaluate(candidate)
        for v in violations:
            evaluation.findings.append(
                {
                    "tool": "constraint-check",
                    "severity": "low",
                    "title": f"constraint warning [{v.constraint}]",
                    "message": v.render(),
                }
            )
        return evaluation
