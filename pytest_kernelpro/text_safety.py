"""Text that came from generated code or a model, made safe to show, store or send.

Every text that flows from a candidate (its strategy, errors, build logs, stdout and stderr
excerpts) or from a model's answer into a prompt, a trajectory, a report, a log, the PR
comment or the terminal goes through `safe_text` (or `safe_tree` for JSON-like data):

- `redact`: secret-shaped strings are replaced by `[redacted: KIND]`: API keys and tokens
  by their published shapes (`SECRET_PATTERNS`), and the value of every variable of this
  process's environment whose name looks like a credential (`is_secret_name`): a candidate
  that read a secret anywhere cannot carry it out through its error text or its output.
- `strip_controls`: terminal escape sequences (CSI, OSC, ...) are removed whole, then every
  C0 and C1 control character except newline and tab, and the Unicode direction overrides
  that make a line read differently from what it holds. A carriage return alone could
  overwrite a printed line, so `\\r\\n` becomes `\\n` and a lone `\\r` is dropped.

Both run after every Unicode format character (category Cf: the zero-width space, the soft
hyphen, joiners, word joiners, the byte-order mark, tag characters) is removed: a token split
by one reads the same and would match no shape.

Redaction is a second layer, not the barrier: a secret sent reversed, encoded (hex, base64)
or one character per line matches nothing here. What keeps secrets from a candidate is what
it can read (the sandbox's view, docs/sandbox.md).

The rule is one module for every sink, so that no path (a new report, a new log) can forget
half of it. It imports nothing of the optimizer: a `--kernelpro-check` session uses it too.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

_SECRET_WORDS = re.compile(
    r"API_?KEY|TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|AUTH|SESSION|COOKIE|ACCESS_?KEY",
    re.IGNORECASE,
)
_SECRET_PREFIXES = (
    "ANTHROPIC_",
    "OPENAI_",
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GCP_",
    "GH_",
    "GITHUB_",
    "GITLAB_",
    "HF_",
    "HUGGING",
    "WANDB_",
    "SSH_",
    "GPG_",
    "NPM_",
    "PYPI_",
    "TWINE_",
    "DOCKER_",
    "SLACK_",
    "CI_JOB_",
)
# Names that match the words above but hold paths or switches, never a credential: their
# values ("/usr/bin/ssh-agent", "1") would otherwise be redacted wherever they appear.
_NOT_SECRET_VALUES = frozenset({"SSH_AUTH_SOCK", "SSH_AGENT_PID", "GITHUB_WORKSPACE"})
# A value shorter than this is too likely to occur by chance ("1", "true", a short path).
MIN_SECRET_VALUE = 8


def is_secret_name(name: str) -> bool:
    """True for a variable name that may hold a credential."""
    upper = name.upper()
    return bool(_SECRET_WORDS.search(upper)) or upper.startswith(_SECRET_PREFIXES)


# (kind, pattern): the shapes credentials are published in. Longer, more specific shapes
# first (an Anthropic key also matches the OpenAI shape).
SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "private key",
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
            r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.DOTALL,
        ),
    ),
    ("anthropic key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{16,}")),
    ("openai key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}")),
    ("github token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}|\bgh[pousr]_[A-Za-z0-9]{20,}")),
    ("gitlab token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{16,}")),
    ("hugging face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("slack token", re.compile(r"\bxox[abeoprs]-[A-Za-z0-9\-]{10,}")),
    ("google api key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    ("aws access key", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),
    (
        "authorization header",
        re.compile(r"(?i)(?<=authorization: )(?:bearer |basic |token )?[^\s'\"]{8,}"),
    ),
    ("url password", re.compile(r"(?<=://)[^/\s:@'\"]+:[^/\s@'\"]+(?=@)")),
)

# Escape sequences a terminal acts on: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST),
# DCS/SOS/PM/APC strings, and two-character escapes; the 8-bit CSI (0x9b) too.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# C0 but tab and newline, DEL, C1; the bidirectional overrides and isolates.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# Where Unicode puts format characters: the basic and supplementary multilingual planes and
# the special-purpose plane (tags); the ideograph planes between hold none. Scanned once
# (tens of milliseconds) instead of all 1.1 million code points.
_FORMAT_PLANES = (range(0x80, 0x20000), range(0xE0000, 0xF0000))


@functools.cache
def _format_characters() -> re.Pattern[str]:
    """Every code point of Unicode category Cf (format characters) this Python knows."""
    found = [
        chr(c) for plane in _FORMAT_PLANES for c in plane if unicodedata.category(chr(c)) == "Cf"
    ]
    return re.compile("[" + "".join(re.escape(c) for c in found) + "]")


def strip_format(text: str) -> str:
    """`text` without Unicode format characters (category Cf, module doc)."""
    if not text or text.isascii():
        return text
    return _format_characters().sub("", text)


def strip_controls(text: str) -> str:
    """`text` without escape sequences and control characters (newline and tab kept)."""
    if not text:
        return text
    text = text.replace("\r\n", "\n")
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


_VALUES_CACHE: dict[tuple[str, ...], re.Pattern[str] | None] = {}


def secret_values() -> tuple[str, ...]:
    """The values of this process's credential-looking environment variables, longest
    first, each at least `MIN_SECRET_VALUE` characters."""
    values = {
        value
        for name, value in os.environ.items()
        if len(value) >= MIN_SECRET_VALUE
        and name.upper() not in _NOT_SECRET_VALUES
        and is_secret_name(name)
    }
    return tuple(sorted(values, key=lambda v: (-len(v), v)))


def _values_pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    if values not in _VALUES_CACHE:
        if len(_VALUES_CACHE) > 32:
            _VALUES_CACHE.clear()
        _VALUES_CACHE[values] = (
            re.compile("|".join(re.escape(v) for v in values)) if values else None
        )
    return _VALUES_CACHE[values]


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with secret-shaped strings and `secrets` (default: the session's secret values,
    `secret_values()`) replaced."""
    if not text:
        return text
    text = strip_format(text)
    values = (
        secret_values()
        if secrets is None
        else tuple(sorted({s for s in secrets if s}, key=lambda v: (-len(v), v)))
    )
    pattern = _values_pattern(values)
    if pattern is not None:
        text = pattern.sub("[redacted: secret variable]", text)
    for kind, shape in SECRET_PATTERNS:
        text = shape.sub(f"[redacted: {kind}]", text)
    return text


def safe_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """`redact` and `strip_controls`: the form every candidate or model text is shown in."""
    if not text:
        return text
    return strip_controls(redact(text, secrets))


def safe_line(text: Any, limit: int) -> str:
    """`text` as `safe_text` on one line (whitespace runs made one space), cut to `limit`
    characters with "..." at the end when longer: a message quoted inside a sentence."""
    line = " ".join(safe_text(str(text)).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def safe_tree(data: Any, secrets: Iterable[str] | None = None) -> Any:
    """`data` with every string made `safe_text`, dictionary keys included."""
    values = secret_values() if secrets is None else tuple(secrets)
    return _tree(data, values)


def _tree(data: Any, values: tuple[str, ...]) -> Any:
    if isinstance(data, str):
        return safe_text(data, values)
    if isinstance(data, Mapping):
        return {
            (safe_text(k, values) if isinstance(k, str) else k): _tree(v, values)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_tree(v, values) for v in data]
    if isinstance(data, tuple):
        return tuple(_tree(v, values) for v in data)
    return data
