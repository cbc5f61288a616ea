"""Replay recorded model responses: reproducible searches and tests without an API key.

Two sources are read. Every recorded call carries `request_hash` (`LLMRequest.request_hash()`:
system prompt, messages, max_tokens, temperature; not the model) and, when the agent gave
one, a `replay_key` (`replay_key(...)`: what the request is for, without any measured number):

1. A recording JSONL written by `RecordingBackend` (this module's own format): one line per
   call, `{"kind": "llm", "format": "kernelpro-llm-recording", "version": 1,
   "request_hash": ..., "purpose": ..., "prompt_id": ..., "request": {...},
   "response": {...}}`. The full request is kept so that a recording can be read by a person.
2. A search trajectory (`pytest_kernelpro.optimize.search.trajectory`): its node lines carry the
   candidate's `meta`, where the Programmer Agent stores the model calls that produced the
   node as `meta["llm_calls"]` (a list of `{"request_hash", "purpose", "response"}`; the
   request text is not repeated there: the trajectory already holds the code).

Why two keys. A prompt holds measured numbers (the parent's speedup, its profile), and two
runs of the same kernel never measure the same nanoseconds, so a search keyed by the prompt's
bytes cannot be replayed on a GPU: the first optimize prompt would miss. The Programmer and
Profiling agents therefore key each request by what decides the answer's meaning: the
purpose, the prompt template version, the mode, the code of the solution it works on and the
retry phase. A request with a `replay_key` is served by that key; the replay counts the
answers whose prompt bytes differed from the recording (`divergent`, measurement noise) so a
byte-for-byte replay can be asserted. A request without a key is served by its hash.

The same request may have been sent several times (fresh seeds at ROOT are the same prompt);
its recorded responses are served in the order they were recorded, and asking once more than
was recorded is an `LLMError` naming the search node, as is a request that was never recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelpro.fileio import append_jsonl
from pytest_kernelpro.optimize.agents.llm.model_api import (
    LLMBackend,
    LLMError,
    LLMRequest,
    LLMResponse,
)
from pytest_kernelpro.text_safety import safe_tree

RECORDING_FORMAT = "kernelpro-llm-recording"
RECORDING_VERSION = 1


def replay_key(*parts: object) -> str:
    """A 16-hex-digit key from the parts that decide what a request asks (never a measured
    number): e.g. purpose, prompt id, mode, the SHA-256 of the code it works on, the phase."""
    canonical = json.dumps([str(p) for p in parts], separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def code_hash(code: str | None) -> str:
    """The SHA-256 (16 hex digits) of a solution's code, "" for none (ROOT)."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()[:16] if code else ""


def call_record(request: LLMRequest, response: LLMResponse, *, full: bool = True) -> dict[str, Any]:
    """One recorded call; `full=False` leaves the request text out (for trajectory meta)."""
    record: dict[str, Any] = {
        "request_hash": request.request_hash(),
        "purpose": str(request.meta.get("purpose", "")),
        "prompt_id": request.meta.get("prompt_id"),
        "response": response.to_dict(),
    }
    if request.meta.get("replay_key"):
        record["replay_key"] = str(request.meta["replay_key"])
    if request.meta.get("node") is not None:
        record["node"] = request.meta["node"]
    if full:
        record = {
            "kind": "llm",
            "format": RECORDING_FORMAT,
            "version": RECORDING_VERSION,
            **record,
            "request": request.to_dict(),
        }
    # The model's answer may repeat what a candidate printed: the form text_safety gives it.
    return safe_tree(record)


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


@dataclass
class _Recorded:
    request_hash: str
    response: LLMResponse
    served: bool = False


class ReplayBackend:
    """`LLMBackend` that answers from recorded responses (see the module doc)."""

    name = "replay"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._by_hash: dict[str, deque[_Recorded]] = {}
        self._by_key: dict[str, deque[_Recorded]] = {}
        self._served: dict[str, int] = {}
        self.divergent = 0  # answers served by replay key whose prompt bytes differed
        for call in load_recorded_calls(self.path):
            digest = str(call.get("request_hash") or "")
            if not digest or "response" not in call:
                continue
            entry = _Recorded(digest, LLMResponse.from_dict(call["response"]))
            self._by_hash.setdefault(digest, deque()).append(entry)
            if call.get("replay_key"):
                self._by_key.setdefault(str(call["replay_key"]), deque()).append(entry)

    def __repr__(self) -> str:
        return f"ReplayBackend({str(self.path)!r}, {self.recorded} responses)"

    @property
    def recorded(self) -> int:
        """Responses not served yet."""
        return sum(1 for q in self._by_hash.values() for e in q if not e.served)

    @staticmethod
    def _next(queue: deque[_Recorded] | None) -> _Recorded | None:
        while queue and queue[0].served:
            queue.popleft()
        return queue.popleft() if queue else None

    def complete(self, request: LLMRequest) -> LLMResponse:
        """The next recorded response to this request: by its replay key when it has one
        (measurement noise in the prompt does not matter), else by its exact hash."""
        digest = request.request_hash()
        key = str(request.meta.get("replay_key") or "")
        lookup = key or digest
        entry = self._next(self._by_key.get(key) if key else self._by_hash.get(digest))
        if entry is None:
            served = self._served.get(lookup, 0)
            purpose = request.meta.get("purpose") or "model"
            node = request.meta.get("node")
            where = f" at search node {node}" if node is not None else ""
            mode = f", {request.meta['mode']} mode" if request.meta.get("mode") else ""
            why = (
                f"all {served} recorded response(s) to it were already served"
                if served
                else "it was never recorded"
            )
            raise LLMError(
                f"no recorded response for {purpose} request {digest}{where} "
                f"(replay key {key or 'none'}{mode}, prompt {request.meta.get('prompt_id')!r}, "
                f"max_tokens {request.max_tokens}) in {self.path}: {why}. A replay reproduces "
                "only the recorded run: use the same options, problem and seed, or record a "
                "new run with a model backend."
            )
        entry.served = True
        self._served[lookup] = self._served.get(lookup, 0) + 1
        if entry.request_hash != digest:
            self.divergent += 1
        return entry.response


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
