"""A one-tool toolbox for the backends' tool-use tests: `lookup` answers "lookup says Q" and
keeps the queries it ran, so a test sees which calls reached it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# What a backend answers a tool call past the request's `max_tool_rounds` with.
BUDGET_SPENT = "error: the tool budget of this reply is spent; answer now."


class LookupBox:
    def __init__(self) -> None:
        self.ran: list[str] = []

    def specs(self) -> list[dict[str, Any]]:
        return [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}]

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        self.ran.append(str(arguments["q"]))
        return f"{name} says {arguments['q']}"


def budget_request(box: LookupBox, rounds: int) -> Any:
    """A request that offers the box's tool and allows `rounds` calls."""
    from pytest_kernelpro.optimize.agents.llm import LLMRequest

    return LLMRequest(
        "sys", ({"role": "user", "content": "go"},), 100,
        meta={"toolbox": box, "max_tool_rounds": rounds}, tools=tuple(box.specs()),
    )  # fmt: skip
