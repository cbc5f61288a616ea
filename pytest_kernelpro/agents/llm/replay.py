"""Replay recorded model responses: reproducible searches and tests without an API key.

Two sources are read, both keyed by `LLMRequest.request_hash()` (system prompt, messages,
max_tokens, temperature; not the model):

1. A recording JSONL written by `RecordingBackend` (this module's own format): one line per
   call, `{"kind": "llm", "format": "kernelpro-llm-recording", "version": 1,
   "request_hash": ..., "purpose": ..., "prompt_id": ..., "request": {...},
   "response": {...}}`. The full request is kept so that a recording can be read by a person.
2. A search trajectory (`pytest_kernelpro.search.trajectory`): its node lines carry the
   candidate's `meta`, where the Programmer Agent stores the model calls that produced the
   node as `meta["llm_calls"]` (a list of `{"request_hash", "purpose", "response"}`; the
   request text is not repeated there: the trajectory already holds the code).

The same request may have been sent several times (fresh seeds at ROOT are the same prompt);
its recorded responses are served in the order they were recorded, and asking once more than
was recorded is an `LLMError`, as is a request that was never recorded.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_kernelpro.agents.llm.base import LLMBackend, LLMError, LLMRequest, LLMResponse
from pytest_kernelpro.fileio import append_jsonl

RECORDING_FORMAT = "kernelpro-llm-recording"
RECORDING_VERSION = 1
TRAJECTORY_FORMAT = "kernelpro-trajectory"  # pytest_kernelpro.search.trajectory.FORMAT


def call_record(request: LLMRequest, response: LLMResponse, *, full: bool = True) -> dict[str, Any]:
    """One recorded call; `full=False` leaves the request text out (for trajectory meta)."""
    record: dict[str, Any] = {
        "request_hash": request.request_hash(),
        "purpose": str(request.meta.get("purpose", "")),
        "prompt_id": request.meta.get("prompt_id"),
        "response": response.to_dict(),
    }
    if full:
        record = {
            "kind": "llm",
            "format": RECORDING_FORMAT,
            "version": RECORDING_VERSION,
            **record,
            "request": request.to_dict(),
        }
    return record


def _read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LLMError(
            f"cannot read the LLM recording {path}: {exc}; check the path given to "
            "--kernelpro-llm=replay:PATH"
        ) from None
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if number == len(lines) or not any(rest.strip() for rest in lines[number:]):
                continue  # a last line cut off mid-write by a crash: ignore it
            raise LLMError(
                f"{path} line {number} is not JSON ({exc}); the recording is damaged"
            ) from None
        if isinstance(record, dict):
            yield number, record


def load_recorded_calls(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The recorded calls of a recording JSONL or a trajectory, in recorded order."""
    target = Path(path)
    calls: list[dict[str, Any]] = []
    kinds: set[str] = set()
    for _, record in _read_lines(target):
        kind = str(record.get("kind", ""))
        kinds.add(kind)
        if kind == "llm":
            calls.append(record)
        elif kind == "node":
            meta = record.get("meta") or {}
            calls.extend(c for c in meta.get("llm_calls") or () if isinstance(c, Mapping))
    if not kinds & {"llm", "header", "node"}:
        raise LLMError(
            f"{target} is neither an LLM recording ({RECORDING_FORMAT}) nor a kernelpro "
            "trajectory; record one with --kernelpro-llm-record=PATH or pass a trajectory file"
        )
    return calls


class ReplayBackend:
    """`LLMBackend` that answers from recorded responses (see the module doc)."""

    name = "replay"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._queues: dict[str, deque[LLMResponse]] = {}
        self._served: dict[str, int] = {}
        for call in load_recorded_calls(self.path):
            key = str(call.get("request_hash") or "")
            if not key or "response" not in call:
                continue
            self._queues.setdefault(key, deque()).append(LLMResponse.from_dict(call["response"]))

    def __repr__(self) -> str:
        return f"ReplayBackend({str(self.path)!r}, {self.recorded} responses)"

    @property
    def recorded(self) -> int:
        """Responses not served yet."""
        return sum(len(q) for q in self._queues.values())

    def complete(self, request: LLMRequest) -> LLMResponse:
        """The next recorded response to this exact request."""
        key = request.request_hash()
        queue = self._queues.get(key)
        if not queue:
            served = self._served.get(key, 0)
            purpose = request.meta.get("purpose") or "model"
            why = (
                f"all {served} recorded response(s) to it were already served"
                if served
                else "it was never recorded"
            )
            raise LLMError(
                f"no recorded response for {purpose} request {key} "
                f"(prompt {request.meta.get('prompt_id')!r}, max_tokens {request.max_tokens}) in "
                f"{self.path}: {why}. A replay reproduces only the recorded run: use the same "
                "options, problem and seed, or record a new run with the anthropic backend."
            )
        self._served[key] = self._served.get(key, 0) + 1
        return queue.popleft()


class RecordingBackend:
    """Wraps a backend and appends every call (request and response) to a recording JSONL."""

    def __init__(self, inner: LLMBackend, path: str | os.PathLike[str]) -> None:
        self.inner = inner
        self.path = Path(path)
        self.name = f"{inner.name}+record"

    def __repr__(self) -> str:
        return f"RecordingBackend({self.inner!r}, {str(self.path)!r})"

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Call the wrapped backend and record the exchange before returning it."""
        response = self.inner.complete(request)
        append_jsonl(self.path, call_record(request, response))
        return response
