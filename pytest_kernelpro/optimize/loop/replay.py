"""Replaying a recorded search where the prompts carry measured numbers.

A prompt holds the kernel's roofline efficiency, the parent's speedup and its profile, all
measured again in a replay and never bit-identical, so a request's hash rarely matches the
recording. `NoiseTolerantReplay` answers the request recorded with the same replay key (the agents' key
of what a request asks, `agents.llm.replay.replay_key`) or the same bytes, and otherwise
the next recorded response of the same purpose (programmer, profiling), in
recorded order: the candidates of a recorded search are served in the order the model
wrote them, whatever the replaying machine measures. Asking for more than was recorded is
an `LLMError`, which ends the search ("recorded responses used up").

`--kernelpro-llm=replay:DIR` names a directory of recordings, one `<kernel>.jsonl` per
kernel (what a search writes as `llm-calls.jsonl`), so one option replays a whole repository.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

from pytest_kernelpro.optimize.agents.llm.model_api import LLMError, LLMRequest, LLMResponse
from pytest_kernelpro.optimize.agents.llm.replay import load_recorded_calls

REPLAY_PREFIX = "replay:"


def slug(name: str) -> str:
    """A kernel name as a file name: `softmax[8192x4096]` -> `softmax_8192x4096_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def replay_source(llm: str) -> Path | None:
    """The path of `replay:PATH`, or None for another backend."""
    text = (llm or "").strip()
    if not text.startswith(REPLAY_PREFIX):
        return None
    return Path(text.removeprefix(REPLAY_PREFIX).strip()).expanduser()


def recording_for(source: Path, kernel: str, base: str | None = None) -> Path | None:
    """The recording that answers `kernel`: the file itself, or in a directory
    `<kernel>.jsonl` (the item name), else `<base>.jsonl` (the kernel without its shape)."""
    if not source.is_dir():
        return source
    for name in (kernel, base):
        if name:
            candidate = source / f"{slug(name)}.jsonl"
            if candidate.is_file():
                return candidate
    return None


class NoiseTolerantReplay:
    """`LLMBackend` serving recorded responses (module doc)."""

    name = "replay"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._exact: dict[str, deque[int]] = {}
        self._by_purpose: dict[str, deque[int]] = {}
        self._responses: list[LLMResponse] = []
        self._served: set[int] = set()
        for call in load_recorded_calls(self.path):
            if "response" not in call:
                continue
            index = len(self._responses)
            self._responses.append(LLMResponse.from_dict(call["response"]))
            # The agents' replay key (what the request asks, no measured numbers) and the
            # exact hash both identify a recorded request.
            for key in (call.get("replay_key"), call.get("request_hash")):
                if key:
                    self._exact.setdefault(str(key), deque()).append(index)
            self._by_purpose.setdefault(str(call.get("purpose") or ""), deque()).append(index)
        if not self._responses:
            raise LLMError(
                f"{self.path} holds no recorded model responses; record a search with the "
                "anthropic backend (its run folder's llm-calls.jsonl) and replay that"
            )

    def __repr__(self) -> str:
        return f"NoiseTolerantReplay({str(self.path)!r}, {self.remaining} responses left)"

    @property
    def remaining(self) -> int:
        return len(self._responses) - len(self._served)

    def purposes(self) -> dict[str, int]:
        """Recorded responses per purpose (for the preflight check)."""
        return {k: len(v) for k, v in self._by_purpose.items()}

    def skip_served(self, previous: str | Path) -> int:
        """Mark as served the responses an earlier part of this search already used (the
        calls recorded in its trajectory or recording), so a resumed search continues where
        it stopped.
        Returns how many were skipped."""
        path = Path(previous)
        if not path.is_file():
            return 0
        skipped = 0
        for call in load_recorded_calls(path):
            text = str((call.get("response") or {}).get("text", ""))
            purpose = str(call.get("purpose") or "")
            for index in self._by_purpose.get(purpose, ()):
                if index not in self._served and self._responses[index].text == text:
                    self._served.add(index)
                    skipped += 1
                    break
        return skipped

    def _take(self, queue: deque[int] | None) -> int | None:
        while queue:
            index = queue.popleft()
            if index not in self._served:
                return index
        return None

    def complete(self, request: LLMRequest) -> LLMResponse:
        """The exact recorded answer, else the next one of the same purpose."""
        index = None
        for key in (request.meta.get("replay_key"), request.request_hash()):
            if index is None and key:
                index = self._take(self._exact.get(str(key)))
        purpose = str(request.meta.get("purpose") or "")
        if index is None:
            index = self._take(self._by_purpose.get(purpose))
        if index is None:
            raise LLMError(
                f"recorded responses used up: {self.path} holds no more {purpose or 'model'} "
                f"responses ({len(self._served)} of {len(self._responses)} served); the replay "
                "ends here"
            )
        self._served.add(index)
        return self._responses[index]


def recording_record(text: str, *, purpose: str = "programmer", model: str = "recorded") -> dict:
    """One recorded call in `agents.llm.replay`'s recording format, for a hand-written
    corpus (the request hash is unknown: it is served by purpose and order)."""
    from pytest_kernelpro.optimize.agents.llm.replay import RECORDING_FORMAT, RECORDING_VERSION

    return {
        "kind": "llm",
        "format": RECORDING_FORMAT,
        "version": RECORDING_VERSION,
        "request_hash": "",
        "purpose": purpose,
        "prompt_id": None,
        "response": LLMResponse(
            text=text,
            stop_reason="end_turn",
            input_tokens=0,
            output_tokens=0,
            cost_usd=0.0,
            model=model,
        ).to_dict(),
    }
