"""Strings from the report as literal text in the pull-request comment.

The comment is rendered from an artifact of a job that ran the pull request's code, so every
string from a record goes through `literal_text` (an inline code span), `literal_block` (a
fenced text block) or `html_text` (escaped, inside our own HTML): nothing in a record is ever
rendered as Markdown or HTML.
"""

from __future__ import annotations

import re
from typing import Any


def literal_text(value: Any, *, limit: int = 300, table: bool = True) -> str:
    """Any string from the report, shown as literal text: an inline code span.

    The report is an artifact of a job that ran the pull request's code, so every string in it
    may be hostile. Inside a code span GitHub renders no Markdown, HTML, link, image, mention
    or issue reference, and a `</details>` is text. The fence is one backtick longer than the
    longest run inside; line breaks and control characters become spaces (a code span is
    one line); in a table a pipe is escaped (GFM splits cells before it parses code spans).
    """
    text = "".join(" " if (ord(c) < 32 or 0x7F <= ord(c) < 0xA0) else c for c in str(value))
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text:
        return "–"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    if table:
        text = text.replace("|", "\\|")
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def literal_block(value: Any, *, limit: int = 20_000) -> str:
    """A multi-line string from the report as a fenced text block (never rendered)."""
    text = "".join(c if (c in "\n\t" or ord(c) >= 32) else " " for c in str(value)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    longest = max((len(run) for run in re.findall(r"`{3,}|~{3,}", text)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


_HTML_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    '"': "&quot;",
    # GitHub turns @name and #123 into mentions and links after rendering: break them.
    "@": "&#64;\u200b",
    "#": "&#35;\u200b",
}


def html_text(value: Any, limit: int = 200) -> str:
    """A string from the artifact inside our own HTML: escaped, mentions and links broken."""
    text = " ".join(str(value).split())[:limit]
    return "".join(_HTML_ESCAPES.get(c, c) for c in text)
