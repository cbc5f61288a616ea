"""A scripted LLM backend for agent tests: serves given replies in order, keeps requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pytest_kernelpro.optimize.agents.llm import LLMRequest, LLMResponse, compute_cost


@dataclass
class ScriptedBackend:
    # A list served in order, or a function of the request (for searches of unknown length).
    replies: list[tuple[str, str] | str] | Callable[[LLMRequest], tuple[str, str] | str]
    model: str = "claude-sonnet-5-5"
    requests: list[LLMRequest] = field(default_factory=list)
    name: str = "scripted"

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        if callable(self.replies):
            reply = self.replies(request)
        elif self.replies:
            reply = self.replies.pop(0)
        else:
            raise AssertionError("ScriptedBackend: no reply left for this request")
        text, stop = (reply, "end_turn") if isinstance(reply, str) else reply
        input_tokens = len(request.system + "".join(m.content for m in request.messages)) // 4
        output_tokens = max(1, len(text) // 4)
        return LLMResponse(
            text=text,
            stop_reason=stop,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=compute_cost(self.model, input_tokens, output_tokens),
            model=self.model,
            request_hash=request.request_hash(),
        )


def strategy_reply(*markers: str) -> str:
    """A Programmer reply with one `### Strategy:` block per marker, each a do-nothing
    ModelNew that carries its marker as a comment (the search's fake evaluators read it)."""
    return "\n".join(
        f"### Strategy: {m}\n```python\nimport torch\n# {m}\nclass ModelNew(torch.nn.Module):\n"
        "    pass\n```\n"
        for m in markers
    )


def search_rules(analysis: str, faster: Sequence[str]) -> Callable[[LLMRequest], str]:
    """Replies by the prompt's task, for a whole search: `analysis` to the Profiling Agent,
    one fix to a debug prompt, the `faster` strategies to an optimize prompt, and two seeds
    (one wrong) to the first one."""

    def rules(request: LLMRequest) -> str:
        if request.meta.get("purpose") == "profiling":
            return analysis
        prompt = request.messages[-1].content
        if "## Task: fix this solution" in prompt:
            return strategy_reply("fixed speedup=1.2")
        if "## Task: make this correct solution faster" in prompt:
            return strategy_reply(*faster)
        return strategy_reply("seed wrong", "seed speedup=1.1")

    return rules
