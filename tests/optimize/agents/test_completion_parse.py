"""parse_multiple_completions on well-formed, drifting, cut-off and garbage replies."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.optimize.agents.prompts import (
    CompletionParseError,
    parse_multiple_completions,
)

REPLY = (Path(__file__).parents[2] / "data" / "agents" / "reply_two_candidates.md").read_text()
MODULE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_well_formed_reply() -> None:
    parsed = parse_multiple_completions(REPLY)
    assert [c.strategy for c in parsed] == [
        "fused addmm + relu in one expression",
        "in-place clamp after the linear layer",
    ]
    assert [c.index for c in parsed] == [0, 1]
    assert "torch.addmm(self.lin.bias" in parsed[0].code
    assert "clamp_" in parsed[1].code
    assert all(c.warnings == () for c in parsed)
    assert all(c.code.startswith("import torch") and c.code.endswith(")\n") for c in parsed)


def test_heading_variants_and_inner_comments() -> None:
    text = (
        "## Strategy 1: **tiled**\n```py\n# Strategy: not a heading, a comment\n" + MODULE + "```\n"
        "**Strategy:** vectorized\n~~~python\n" + MODULE + "~~~\n"
        "Candidate 3 - Strategy: plain\n```\n" + MODULE + "```\n"
    )
    parsed = parse_multiple_completions(text)
    assert [c.strategy for c in parsed] == ["tiled", "vectorized", "plain"]
    assert "# Strategy: not a heading" in parsed[0].code


def test_missing_fences() -> None:
    parsed = parse_multiple_completions("### Strategy: no fence at all\n" + MODULE)
    assert len(parsed) == 1
    assert parsed[0].strategy == "no fence at all"
    assert parsed[0].code == MODULE
    assert "code was not fenced" in parsed[0].warnings
    bare = parse_multiple_completions("Here is the code:\n" + MODULE)
    assert bare[0].code == MODULE
    assert bare[0].strategy == ""


def test_blocks_without_headings_take_the_line_before() -> None:
    text = (
        "First, a fused version:\n```python\n" + MODULE + "```\nThen:\n```python\n" + MODULE + "```"
    )
    parsed = parse_multiple_completions(text)
    assert [c.strategy for c in parsed] == ["First, a fused version", "Then"]


def test_cut_off_fence_and_code_problems() -> None:
    parsed = parse_multiple_completions(
        "### Strategy: cut\n```python\nimport torch\nclass ModelNew("
    )
    assert parsed[0].strategy == "cut"
    assert "code fence not closed (reply cut off?)" in parsed[0].warnings
    assert any(w.startswith("Python syntax error") for w in parsed[0].warnings)
    no_model = parse_multiple_completions("### Strategy: x\n```python\nprint(1)\n```")
    assert "no `ModelNew` in the code" in no_model[0].warnings


def test_a_cuda_excerpt_is_not_the_module() -> None:
    text = (
        "### Strategy: explained\n```cuda\n__global__ void k() {}\n```\nFull module:\n"
        "```python\n" + MODULE + "```\n"
    )
    parsed = parse_multiple_completions(text)
    assert len(parsed) == 1
    assert parsed[0].code == MODULE


def test_json_forms() -> None:
    obj = '{"candidates": [{"strategy": "a", "code": "class ModelNew: pass"}, {"code": ""}]}'
    parsed = parse_multiple_completions(obj)
    assert [(c.strategy, c.code) for c in parsed] == [("a", "class ModelNew: pass\n")]
    fenced = '```json\n[{"strategy": "b", "code": "class ModelNew: pass"}]\n```'
    assert parse_multiple_completions(fenced)[0].strategy == "b"


@pytest.mark.parametrize(
    "garbage",
    ["", "   \n", "I cannot help with that request.", "```text\nno code here\n```", '{"x": 1}'],
)
def test_garbage_is_reported(garbage: str) -> None:
    with pytest.raises(CompletionParseError, match="candidate code|reply is empty"):
        parse_multiple_completions(garbage)
