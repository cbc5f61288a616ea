"""The problem side of the search: candidates, evaluations, and the two interfaces.

The search algorithms (`mcts`, `greedy`) never look inside a candidate's code; they see a
`Candidate` produced by a `CandidateGenerator` (the Programmer Agent, a replay, or a synthetic
generator in tests and `bench/search_sim.py`) and an `Evaluation` produced by an `Evaluator`
(the sandboxed KernelBench evaluator, `optimize/sandbox/evaluator.py`, or a synthetic one). This mirrors
llm-reasoners' split between the world model / search config and the algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pytest_kernelpro.text_safety import safe_text, safe_tree

Mode = Literal["initial", "debug", "optimize"]
Status = Literal["build_error", "run_error", "timeout", "wrong", "correct", "cheat"]

MODES: tuple[str, ...] = ("initial", "debug", "optimize")
STATUSES: tuple[str, ...] = ("build_error", "run_error", "timeout", "wrong", "correct", "cheat")
# Statuses of a candidate that did not build or did not run to the end: the lowest reward tier.
FAILURE_STATUSES: frozenset[str] = frozenset({"build_error", "run_error", "timeout"})
# Statuses of a candidate that ran but whose result does not count: the middle tier. A rejected
# cheat ran and produced numbers, so it ranks with wrong results, not with crashes.
WRONG_STATUSES: frozenset[str] = frozenset({"wrong", "cheat"})


@dataclass(frozen=True)
class Candidate:
    """One proposed solution: source code plus what the generator says about it.

    `code` is what the evaluator runs (for KernelBench tasks: a module defining `ModelNew`).
    `tokens` and `cost_usd` are what producing this candidate cost; they count against the
    budget's API spend when the candidate is generated.
    """

    code: str
    strategy: str = ""  # one-line optimization strategy annotation
    prompt_id: str | None = None  # which prompt (template + version) produced it
    tokens: int = 0
    cost_usd: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The strategy is a model's words: shown in the terminal, the PR comment and the
        # next prompt, so never with escape sequences or a secret in it (text_safety).
        if self.strategy:
            object.__setattr__(self, "strategy", safe_text(self.strategy))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the trajectory's candidate fields)."""
        data = asdict(self)
        data["meta"] = dict(self.meta)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        """Rebuild a candidate from `to_dict()` output; unknown keys are ignored."""
        return cls(
            code=str(data.get("code", "")),
            strategy=str(data.get("strategy") or ""),
            prompt_id=data.get("prompt_id"),
            tokens=int(data.get("tokens") or 0),
            cost_usd=float(data.get("cost_usd") or 0.0),
            meta=dict(data.get("meta") or {}),
        )


@dataclass
class Evaluation:
    """What evaluating one candidate found.

    `status` is one of `STATUSES`; `reason` says in one line why a candidate failed or was
    rejected (None when correct). `speedup` is reference median / candidate median and is set
    only for correct candidates.
    """

    status: Status
    speedup: float | None = None
    reason: str | None = None
    timing: dict[str, Any] = field(default_factory=dict)
    correctness: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    build_log: str = ""
    logs: str = ""
    wall_s: float = 0.0
    build_s: float = 0.0  # building the candidate (compiles, cache lookups, module import)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Evaluation status {self.status!r} is not one of {STATUSES}")

    @property
    def ok(self) -> bool:
        """True when the candidate is correct (and therefore has a speedup)."""
        return self.status == "correct"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def made_safe(self) -> Evaluation:
        """This evaluation with every text a candidate could have written (reason, logs,
        build log, metrics, findings) passed through `text_safety.safe_text`: no secret
        and no escape sequence reaches a prompt, a trajectory, a report or the terminal."""
        self.reason = None if self.reason is None else safe_text(self.reason)
        self.build_log = safe_text(self.build_log)
        self.logs = safe_text(self.logs)
        self.timing = safe_tree(self.timing)
        self.correctness = safe_tree(self.correctness)
        self.metrics = safe_tree(self.metrics)
        self.findings = safe_tree(self.findings)
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evaluation:
        """Rebuild an evaluation from `to_dict()` output; unknown keys are ignored."""
        speedup = data.get("speedup")
        return cls(
            status=data["status"],
            speedup=None if speedup is None else float(speedup),
            reason=data.get("reason"),
            timing=dict(data.get("timing") or {}),
            correctness=dict(data.get("correctness") or {}),
            metrics=dict(data.get("metrics") or {}),
            findings=list(data.get("findings") or []),
            build_log=str(data.get("build_log") or ""),
            logs=str(data.get("logs") or ""),
            wall_s=float(data.get("wall_s") or 0.0),
            build_s=float(data.get("build_s") or 0.0),
        )


@runtime_checkable
class CandidateGenerator(Protocol):
    """Proposes candidates for one node of the search tree.

    `mode` follows the node: "initial" when the search expands the virtual ROOT (fresh seed
    solutions; `parent` and `evaluation` are None), "debug" for a failed node, "optimize" for
    a correct one. Return between 1 and `max_candidates` candidates (the number of children
    progressive widening allows now); extra ones are ignored, an empty sequence ends the
    search.
    """

    def generate(
        self,
        mode: Mode,
        parent: Candidate | None,
        evaluation: Evaluation | None,
        *,
        max_candidates: int = 1,
    ) -> Sequence[Candidate]:
        """Return new candidates for a node in `mode`."""
        ...


@runtime_checkable
class Evaluator(Protocol):
    """Builds, checks and times one candidate. Must not raise for a bad candidate: a crash,
    hang or wrong answer is an `Evaluation` with the matching status."""

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """Return the evaluation of `candidate`."""
        ...
