"""Parse the Programmer's reply into candidates (the MultipleCompletions contract).

The contract (`parts/output_format.md`): N sections, each a `### Strategy: ...` line and one
fenced python block. Models drift from it, so the parser accepts, in this order:

1. JSON: an object `{"candidates": [{"strategy": ..., "code": ...}, ...]}` or a list of such
   objects (fenced as ```json or bare);
2. strategy headings (`### Strategy: x`, `## Strategy 2: x`, `**Strategy:** x`,
   `Strategy: x`), each followed by its first fenced block, or by bare code when the fence is
   missing;
3. fenced code blocks without headings (the line before a block, when it is prose, becomes
   the strategy);
4. a bare module (no fences at all) that defines `class ModelNew`.

A fence left open at the end (a reply cut off mid-block) still yields its code, flagged in
`warnings`. Nothing usable raises `CompletionParseError` with an excerpt of the reply.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from pytest_kernelpro.errors import KernelproError

_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$", re.MULTILINE)
_STRATEGY = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*)?[ \t]*(?:(?:Candidate|Solution)[ \t]*\d+[ \t]*[-:.)][ \t]*)?"
    r"Strategy(?:[ \t]*\d+)?[ \t]*(?:\*\*)?[ \t]*[:.-][ \t]*(?P<text>[^\n]*)$",
    re.MULTILINE | re.IGNORECASE,
)
_CODE_LANGS = {"", "python", "py", "python3"}
_CODE_HINT = re.compile(r"^\s*(?:import |from |class |def |@)", re.MULTILINE)


class CompletionParseError(KernelproError):
    """The reply holds no candidate code in any accepted form."""


@dataclass(frozen=True)
class ParsedCandidate:
    """One candidate found in a reply."""

    code: str
    strategy: str
    index: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Block:
    start: int  # offset of the opening fence line
    body_start: int
    end: int  # offset just past the closing fence (or end of text)
    lang: str
    code: str
    closed: bool


def _blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    pos = 0
    while True:
        match = _FENCE_OPEN.search(text, pos)
        if match is None:
            return blocks
        fence, lang = match.group(1), match.group(2).lower()
        body_start = match.end() + 1
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end_match = close.search(text, body_start)
        if end_match is None:
            blocks.append(_Block(match.start(), body_start, len(text), lang,
                                 text[body_start:], False))  # fmt: skip
            return blocks
        blocks.append(_Block(match.start(), body_start, end_match.end(), lang,
                             text[body_start:end_match.start()], True))  # fmt: skip
        pos = end_match.end()


def _check_code(code: str) -> list[str]:
    notes = []
    if "ModelNew" not in code:
        notes.append("no `ModelNew` in the code")
    try:
        ast.parse(code)
    except SyntaxError as exc:
        notes.append(f"Python syntax error at line {exc.lineno}: {exc.msg}")
    return notes


def _from_json(text: str) -> list[ParsedCandidate] | None:
    stripped = text.strip()
    for block in _blocks(text):
        if block.lang == "json":
            stripped = block.code.strip()
            break
    if not stripped.startswith(("{", "[")):
        return None
    try:
        data = json.loads(stripped)
    except ValueError:
        return None
    items = data.get("candidates") if isinstance(data, dict) else data
    if isinstance(data, dict) and items is None and "code" in data:
        items = [data]
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("code"), str) and item["code"].strip():
            code = item["code"].strip("\n") + "\n"
            out.append(ParsedCandidate(code, str(item.get("strategy") or "").strip(), len(out),
                                       tuple(_check_code(code))))  # fmt: skip
    return out or None


def _code_of(section: str) -> tuple[str, list[str]] | None:
    """The code of one strategy section: its first python-ish fenced block, else bare code."""
    notes: list[str] = []
    for block in _blocks(section):
        if block.lang in _CODE_LANGS or block.lang in ("cpp", "cuda", "c++"):
            if block.lang in ("cpp", "cuda", "c++") and "ModelNew" not in block.code:
                continue  # a kernel excerpt, not the module
            if not block.closed:
                notes.append("code fence not closed (reply cut off?)")
            return block.code, notes
    hint = _CODE_HINT.search(section)
    if hint is not None and "ModelNew" in section:
        notes.append("code was not fenced")
        return section[hint.start() :], notes
    return None


def parse_multiple_completions(text: str) -> list[ParsedCandidate]:
    """The candidates in a Programmer reply (see the module doc for accepted forms)."""
    if not text or not text.strip():
        raise CompletionParseError("the reply is empty: no candidate code")
    parsed = _from_json(text)
    if parsed:
        return parsed
    candidates: list[ParsedCandidate] = []
    # A "# Strategy: ..." comment inside a code block is not a heading.
    spans = [(b.start, b.end) for b in _blocks(text)]
    headings = [h for h in _STRATEGY.finditer(text) if not any(a < h.start() < b for a, b in spans)]
    if headings:
        for i, heading in enumerate(headings):
            end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
            found = _code_of(text[heading.end() : end])
            if found is None:
                continue
            code, notes = found
            code = code.strip("\n") + "\n"
            candidates.append(ParsedCandidate(code, heading.group("text").strip(" *`_"),
                                              len(candidates), tuple(notes + _check_code(code))))  # fmt: skip
        if candidates:
            return candidates
    for block in _blocks(text):
        if block.lang not in _CODE_LANGS or not block.code.strip():
            continue
        before = text[: block.start].rstrip().rsplit("\n", 1)[-1].strip(" #*:`")
        notes = [] if block.closed else ["code fence not closed (reply cut off?)"]
        code = block.code.strip("\n") + "\n"
        candidates.append(ParsedCandidate(code, before[:200], len(candidates),
                                          tuple(notes + _check_code(code))))  # fmt: skip
    candidates = [c for c in candidates if "ModelNew" in c.code] or candidates
    if candidates:
        return candidates
    if "class ModelNew" in text:
        hint = _CODE_HINT.search(text)
        code = text[hint.start() if hint else 0 :].strip("\n") + "\n"
        return [ParsedCandidate(code, "", 0, ("code was not fenced", *_check_code(code)))]
    excerpt = " ".join(text.split())[:200]
    raise CompletionParseError(
        "no candidate code in the reply: expected '### Strategy: ...' headings each followed "
        f"by a ```python block defining ModelNew (or JSON candidates). Reply began: {excerpt!r}"
    )
