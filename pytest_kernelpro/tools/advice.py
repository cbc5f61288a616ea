"""The built-in tools' advice and code examples, read from `advice.yaml` (data, not code):
code examples (`example`), the text of every recommendation (`action`, with `{name}` fields
the tool fills with what it measured), the warp-stall table (`STALL_ADVICE`) and the
saturated-pipe table (`SATURATED_PIPE_ADVICE`). The expected-improvement ranges stay in the
tools, computed from the evidence.

A tool looks its advice up by name here instead of importing another tool's constants, so
every tool module stands alone (a rule file in the manner of Nsight Compute's rules) and
the words a finding carries can be edited without touching a tool. This is not a tool
module: it registers nothing and imports no tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from pytest_kernelpro.errors import KernelproError

_DATA = "advice.yaml"


@dataclass(frozen=True)
class StallAdvice:
    """What a warp-stall reason means, why it happens, and the ranked fixes as
    (action, low, high) with their expected-improvement range."""

    meaning: str
    cause: str
    recommendations: tuple[tuple[str, float, float], ...]
    code: str | None = None


@dataclass(frozen=True)
class PipeAdvice:
    """A compute pipe at its peak: the finding's severity, the cause and one fix with its
    expected-improvement range."""

    severity: str
    cause: str
    action: str
    low: float
    high: float


def _load() -> dict[str, Any]:
    text = resources.files(__package__).joinpath(_DATA).read_text(encoding="utf-8")
    # The pure-Python safe loader: libyaml's C loader compares node classes by identity with
    # the `yaml.nodes` it was first imported with, so after `yaml` is imported again in one
    # process (pytester restores sys.modules after an in-process run) it resolves every
    # mapping to the tag None and fails. The file is small; the C speed buys nothing here.
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise KernelproError(
            f"pytest_kernelpro/tools/{_DATA} is not a mapping; reinstall the package"
        )
    return data


_RAW = _load()

EXAMPLES: Mapping[str, str] = MappingProxyType(dict(_RAW["examples"]))


def example(name: str) -> str:
    """The code example `name` of `advice.yaml`."""
    try:
        return EXAMPLES[name]
    except KeyError:
        raise KernelproError(
            f"No code example {name!r} in pytest_kernelpro/tools/{_DATA}; "
            f"known: {', '.join(sorted(EXAMPLES))}"
        ) from None


STALL_ADVICE: Mapping[str, StallAdvice] = MappingProxyType(
    {
        reason: StallAdvice(
            entry["meaning"],
            entry["cause"],
            tuple((str(a), float(lo), float(hi)) for a, lo, hi in entry["recommendations"]),
            example(entry["code"]) if entry.get("code") else None,
        )
        for reason, entry in _RAW["stall_advice"].items()
    }
)

ACTIONS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {tool: MappingProxyType(dict(texts)) for tool, texts in _RAW["actions"].items()}
)


def action(tool: str, key: str, **values: str) -> str:
    """The recommendation text `key` of `tool` in `advice.yaml`, its `{name}` fields filled
    from `values` (the numbers the tool measured, already formatted)."""
    try:
        text = ACTIONS[tool][key]
    except KeyError:
        known = ", ".join(sorted(ACTIONS.get(tool, {}))) or "(none)"
        raise KernelproError(
            f"No recommendation {key!r} for tool {tool!r} in pytest_kernelpro/tools/{_DATA}; "
            f"known for that tool: {known}"
        ) from None
    return text.format(**values) if values else text


SATURATED_PIPE_ADVICE: Mapping[str, PipeAdvice] = MappingProxyType(
    {
        pipe: PipeAdvice(e["severity"], e["cause"], e["action"], float(e["low"]), float(e["high"]))
        for pipe, e in _RAW["saturated_pipe_advice"].items()
    }
)
