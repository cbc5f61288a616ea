"""The Programmer Agent: the search's `CandidateGenerator` backed by a language model.

One `generate()` call = one prompt (PromptBuilder, in the node's mode) asking for N
candidates, parsed from the reply (`parse_multiple_completions`). In optimize mode the
parent's profiler feedback is rendered per the feedback mode ("tools" / "raw" / "none"); with
"tools" and a Profiling Agent, its ProfileAnalysis comes first.

Truncation recovery (stop reason "max_tokens"): Phase A retries with doubled max_tokens;
Phase B retries at that doubled budget with the directive to restart concisely; if that is
cut off too, the call yields no candidates and the reason is recorded in `failures` (and
warned). An unparseable reply gets `parse_retries` follow-ups that quote the parse error.

Accounting: every candidate carries its share of the tokens and dollars of the calls that
produced it (split evenly across the N candidates of one reply). Calls that produced nothing
are carried over to the next candidates, so an API-spend budget sees every call. The first
candidate's `meta["llm_calls"]` records the calls (hash + response, no prompt text), which
lets `replay:TRAJECTORY` reproduce the run.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.optimize.agents.feedback import (
    check_feedback_mode,
    render_failure,
    render_guidance,
    speedup_line,
)
from pytest_kernelpro.optimize.agents.llm.model_api import LLMRequest, LLMResponse, Message
from pytest_kernelpro.optimize.agents.llm.replay import call_record, code_hash, replay_key
from pytest_kernelpro.optimize.agents.profiling import ProfileAnalysisError
from pytest_kernelpro.optimize.agents.prompts.builder import PromptBuilder, check_language
from pytest_kernelpro.optimize.agents.prompts.parse import (
    CompletionParseError,
    parse_multiple_completions,
)
from pytest_kernelpro.optimize.search.interfaces import MODES, Candidate

ORCHESTRATIONS = ("proactive", "reactive")

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMBackend
    from pytest_kernelpro.optimize.agents.profiling import ProfilingAgent
    from pytest_kernelpro.optimize.agents.prompts.builder import Prompt
    from pytest_kernelpro.optimize.search.interfaces import Evaluation, Mode


@dataclass
class GenerationFailure:
    """A `generate()` call that produced no candidates, and why."""

    mode: str
    reason: str
    calls: int
    tokens: int
    cost_usd: float


@dataclass
class _Calls:
    """The model calls behind one batch of candidates (carried over when it yields none)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    cost_usd: float = 0.0

    def add(self, request: LLMRequest, response: LLMResponse) -> None:
        self.records.append(call_record(request, response, full=False))
        self.tokens += response.tokens
        self.cost_usd += response.cost_usd


class ProgrammerAgent:
    """`CandidateGenerator` that asks a model for N candidates per node (module doc)."""

    def __init__(
        self,
        backend: LLMBackend,
        builder: PromptBuilder | None = None,
        *,
        problem_source: str,
        language: str,
        device_name: str | None,
        n_candidates: int = 2,
        max_tokens: int = 8192,
        feedback: str = "tools",
        temperature: float | None = None,
        profiling_agent: ProfilingAgent | None = None,
        reference_analysis: str | None = None,
        cutlass: str = "auto",
        parse_retries: int = 1,
        problem_md: str | None = None,
        orchestration: str = "proactive",
        cutlass_tools: Any = "auto",
    ) -> None:
        if n_candidates < 1:
            raise KernelproError(f"n_candidates={n_candidates} must be at least 1")
        if max_tokens < 1:
            raise KernelproError(f"max_tokens={max_tokens} must be at least 1")
        self.backend = backend
        self.builder = builder or PromptBuilder()
        self.problem_source = problem_source
        self.problem_md = problem_md
        self.language = check_language(language)
        self.device_name = device_name
        self.n_candidates = n_candidates
        self.max_tokens = max_tokens
        self.feedback = check_feedback_mode(feedback)
        self.temperature = temperature
        self.profiling_agent = profiling_agent
        self.reference_analysis = reference_analysis
        self.parse_retries = parse_retries
        # GPU-aware injection happens once, at agent creation (architecture, MMA shapes,
        # CUTLASS paths, flags and constraints).
        self.gpu = self.builder.gpu_context(device_name, cutlass=cutlass)
        if orchestration not in ORCHESTRATIONS:
            raise KernelproError(
                f"Unknown orchestration {orchestration!r}; use one of {', '.join(ORCHESTRATIONS)}"
            )
        self.orchestration = orchestration
        # The seed's CUTLASS tools are offered while the model writes CUDA for a GPU whose
        # CUTLASS headers were found.
        if cutlass_tools == "auto":
            cutlass_tools = None
            if self.gpu.cutlass is not None and self.gpu.target:
                from pytest_kernelpro.optimize.agents.toolbox import CutlassToolbox

                cutlass_tools = CutlassToolbox.find(self.gpu.target)
        self.cutlass_tools = cutlass_tools
        self.failures: list[GenerationFailure] = []
        self._carry = _Calls()
        self._analyses: dict[str, Any] = {}
        self._node: int | None = None

    def __repr__(self) -> str:
        return (
            f"ProgrammerAgent(backend={self.backend!r}, language={self.language!r}, "
            f"device={self.device_name!r}, n={self.n_candidates}, feedback={self.feedback!r})"
        )

    # ------------------------------------------------------------------ prompt inputs

    def _analysis(self, guidance: str, code: str, calls: _Calls) -> str:
        """The Profiling Agent's analysis of `guidance` (cached per guidance text)."""
        if self.profiling_agent is None or not guidance.strip():
            return ""
        key = hashlib.sha256(guidance.encode("utf-8")).hexdigest()
        if key not in self._analyses:
            try:
                result = self.profiling_agent.analyze(
                    guidance, reference_analysis=self.reference_analysis, code=code
                )
            except ProfileAnalysisError as exc:
                warnings.warn(
                    f"kernelpro Profiling Agent: {exc}; the Programmer gets the tools' guidance "
                    "without an analysis.",
                    KernelproWarning,
                    stacklevel=4,
                )
                self._analyses[key] = None
                return ""
            calls.add(result.request, result.response)
            self._analyses[key] = result.analysis
        analysis = self._analyses[key]
        return analysis.render() if analysis is not None else ""

    def build_prompt(
        self,
        mode: Mode,
        parent: Candidate | None,
        evaluation: Evaluation | None,
        n: int,
        *,
        concise: bool = False,
        calls: _Calls | None = None,
    ) -> Prompt:
        """The prompt for a node in `mode` (without calling the model, unless a Profiling
        Agent must analyze the parent's guidance first; its call goes to `calls`)."""
        failure = feedback = None
        speed = ""
        if mode == "debug":
            failure = render_failure(evaluation)
        elif mode == "optimize":
            speed = speedup_line(evaluation)
            guidance = render_guidance(evaluation, self.feedback)
            analysis = ""
            if self.feedback == "tools" and self.orchestration == "reactive":
                # Reactive: the model asks for the tools it wants (`_toolbox`).
                guidance = self._profiling_toolbox(evaluation).prompt_note() if guidance else ""
            elif self.feedback == "tools" and parent is not None:
                analysis = self._analysis(guidance, parent.code, calls or _Calls())
            # The seed's order: the profile (SASS, timeline, findings, ncu by category), then
            # the Profiling Agent's synthesis of it.
            feedback = "\n\n".join(t.rstrip() for t in (guidance, analysis) if t.strip())
        return self.builder.build(
            mode,
            language=self.language,
            problem_source=self.problem_source,
            n_candidates=n,
            gpu=self.gpu,
            parent_code=None if parent is None else parent.code,
            failure=failure,
            feedback=feedback,
            speedup=speed,
            reference_analysis=self.reference_analysis,
            concise=concise,
            problem_md=self.problem_md,
        )

    # ------------------------------------------------------------------ the model calls

    def _profiling_toolbox(self, evaluation: Evaluation | None) -> Any:
        from pytest_kernelpro.optimize.agents.toolbox import ProfilingToolbox

        guidance = render_guidance(evaluation, "tools") if evaluation is not None else ""
        return ProfilingToolbox(guidance)

    def _toolbox(self, mode: str, evaluation: Evaluation | None) -> Any:
        """The tools offered with this node's prompt (None: no tool use)."""
        from pytest_kernelpro.optimize.agents.toolbox import Toolboxes

        boxes: list[Any] = []
        if (
            mode == "optimize"
            and self.feedback == "tools"
            and self.orchestration == "reactive"
            and render_guidance(evaluation, "tools")
        ):
            boxes.append(self._profiling_toolbox(evaluation))
        if self.cutlass_tools is not None and self.gpu.target:
            self.cutlass_tools.new_iteration()
            boxes.append(self.cutlass_tools)
        box = Toolboxes(*boxes)
        return box if box else None

    def at_node(self, node_id: int) -> None:
        """The search node the next `generate()` works for (named in replay errors)."""
        self._node = node_id

    def _request(
        self, prompt: Prompt, max_tokens: int, phase: str, mode: str, parent: Candidate | None,
        n: int, toolbox: Any = None,
    ) -> LLMRequest:  # fmt: skip
        # The replay key leaves out everything measured (speedups, profiles): a recorded
        # search replays on another run of the same GPU (agents/llm/replay.py).
        key = replay_key(
            "programmer", prompt.prompt_id, mode, code_hash(parent.code if parent else None),
            phase, n, max_tokens,
        )  # fmt: skip
        meta: dict[str, Any] = {
            "purpose": "programmer",
            "prompt_id": prompt.prompt_id,
            "phase": phase,
            "mode": mode,
            "node": self._node,
            "replay_key": key,
            "cache_prefix_chars": prompt.stable_chars,
        }
        if toolbox is not None:
            meta["toolbox"] = toolbox
        request = LLMRequest.single(
            prompt.system, prompt.user, max_tokens, self.temperature, meta=meta
        )
        if toolbox is not None:
            request = replace(request, tools=tuple(toolbox.specs()))
        return request

    def _complete(
        self, mode: Mode, parent: Candidate | None, evaluation: Evaluation | None, n: int,
        calls: _Calls,
    ) -> tuple[LLMRequest, LLMResponse, Prompt, str] | str:  # fmt: skip
        """Run the call with truncation recovery; a string is the failure reason."""
        prompt = self.build_prompt(mode, parent, evaluation, n, calls=calls)
        toolbox = self._toolbox(mode, evaluation)
        request = self._request(prompt, self.max_tokens, "initial", mode, parent, n, toolbox)
        response = self.backend.complete(request)
        calls.add(request, response)
        if not response.truncated:
            return request, response, prompt, "initial"
        # Phase A: the same prompt with twice the output budget.
        doubled = self.max_tokens * 2
        request = self._request(prompt, doubled, "A", mode, parent, n, toolbox)
        response = self.backend.complete(request)
        calls.add(request, response)
        if not response.truncated:
            return request, response, prompt, "A"
        # Phase B: same doubled budget, plus the directive to restart concisely.
        prompt = self.build_prompt(mode, parent, evaluation, n, concise=True, calls=calls)
        request = self._request(prompt, doubled, "B", mode, parent, n, toolbox)
        response = self.backend.complete(request)
        calls.add(request, response)
        if not response.truncated:
            return request, response, prompt, "B"
        return (
            f"reply truncated at the output limit three times (max_tokens {self.max_tokens}, "
            f"then {doubled}, then {doubled} with the concise directive); raise the Programmer's "
            "max_tokens or ask for fewer candidates per call"
        )

    def _parse(
        self, request: LLMRequest, response: LLMResponse, calls: _Calls
    ) -> tuple[list[Any], LLMResponse] | str:
        text_response = response
        for attempt in range(self.parse_retries + 1):
            try:
                return parse_multiple_completions(text_response.text), text_response
            except CompletionParseError as exc:
                if attempt == self.parse_retries:
                    return f"unparseable reply: {exc}"
                retry = replace(
                    request,
                    messages=(
                        *request.messages,
                        Message("assistant", text_response.text or "(empty)"),
                        Message("user", f"Your reply could not be used: {exc} Reply again with "
                                        "the complete solutions in the required format."),
                    ),
                    meta={
                        **request.meta,
                        "phase": "format-retry",
                        "replay_key": replay_key(request.meta.get("replay_key"), "format-retry"),
                    },
                )  # fmt: skip
                text_response = self.backend.complete(retry)
                calls.add(retry, text_response)
                if text_response.truncated:
                    return "the format retry was cut off at the output limit"
        return "unparseable reply"  # pragma: no cover - the loop always returns

    # ------------------------------------------------------------------ CandidateGenerator

    def generate(
        self,
        mode: Mode,
        parent: Candidate | None,
        evaluation: Evaluation | None,
        *,
        max_candidates: int = 1,
    ) -> list[Candidate]:
        """Up to min(n_candidates, max_candidates) candidates for a node in `mode`."""
        if mode not in MODES:
            raise KernelproError(f"Unknown mode {mode!r}; use one of {MODES}")
        n = max(1, min(self.n_candidates, max_candidates))
        calls = _Calls()
        outcome = self._complete(mode, parent, evaluation, n, calls)
        if not isinstance(outcome, str):
            request, response, prompt, phase = outcome
            parsed = self._parse(request, response, calls)
            if not isinstance(parsed, str):
                return self._candidates(mode, parsed[0][:n], parsed[1], prompt, phase, calls)
            outcome = parsed
        self._fail(mode, outcome, calls)
        return []

    def _fail(self, mode: str, reason: str, calls: _Calls) -> None:
        self.failures.append(
            GenerationFailure(mode, reason, len(calls.records), calls.tokens, calls.cost_usd)
        )
        # Paid for but produced nothing: charge it to the next candidates.
        self._carry.records += calls.records
        self._carry.tokens += calls.tokens
        self._carry.cost_usd += calls.cost_usd
        warnings.warn(
            f"kernelpro Programmer Agent ({mode} mode) produced no candidates: {reason}.",
            KernelproWarning,
            stacklevel=3,
        )

    def _candidates(
        self, mode: str, parsed: list[Any], response: LLMResponse, prompt: Prompt, phase: str,
        calls: _Calls,
    ) -> list[Candidate]:  # fmt: skip
        carry, self._carry = self._carry, _Calls()
        records = carry.records + calls.records
        tokens = carry.tokens + calls.tokens
        cost = carry.cost_usd + calls.cost_usd
        n = len(parsed)
        out = []
        for i, item in enumerate(parsed):
            meta: dict[str, Any] = {
                "agent": "programmer",
                "mode": mode,
                "language": self.language,
                "device": self.device_name,
                "feedback": self.feedback,
                "index": i,
                "of": n,
                "phase": phase,
                "stop_reason": response.stop_reason,
                "model": response.model,
                "request_hash": response.request_hash,
            }
            if item.warnings:
                meta["parse_warnings"] = list(item.warnings)
            if self.gpu.constraints and self.gpu.target:
                from pytest_kernelpro.optimize.cutlass.constraints import check_source

                violations = check_source(item.code, arch=self.gpu.target)
                if violations:
                    meta["constraint_violations"] = [v.render() for v in violations]
            if i == 0:
                meta["llm_calls"] = records
            out.append(
                Candidate(
                    code=item.code,
                    strategy=item.strategy,
                    prompt_id=prompt.prompt_id,
                    tokens=tokens // n + (1 if i < tokens % n else 0),
                    cost_usd=cost / n,
                    meta=meta,
                )
            )
        return out
