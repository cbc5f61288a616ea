"""Request hashing, recording, replay (determinism and clear errors), the backend factory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_backend import ScriptedBackend

from pytest_kernelpro.errors import KernelproConfigError, KernelproError
from pytest_kernelpro.optimize.agents.llm import (
    LLMError,
    LLMRequest,
    Message,
    RecordingBackend,
    ReplayBackend,
    find_price,
    make_backend,
)


def test_request_hash_covers_what_is_sent_only() -> None:
    base = LLMRequest.single("sys", "hello", 100, 0.5, meta={"purpose": "programmer"})
    same = LLMRequest.single("sys", "hello", 100, 0.5, meta={"purpose": "other"})
    assert base.request_hash() == same.request_hash()
    assert len(base.request_hash()) == 16
    for other in (
        LLMRequest.single("sys", "hello", 200, 0.5),
        LLMRequest.single("sys", "hello", 100, 0.7),
        LLMRequest.single("sys2", "hello", 100, 0.5),
        LLMRequest.single("sys", "hello!", 100, 0.5),
        LLMRequest("sys", (Message("user", "hello"), Message("assistant", "x")), 100, 0.5),
    ):
        assert other.request_hash() != base.request_hash()


def test_request_validation() -> None:
    with pytest.raises(KernelproError, match="max_tokens=0"):
        LLMRequest.single("", "hi", 0)
    with pytest.raises(KernelproError, match="starting with 'user'"):
        LLMRequest("", (Message("assistant", "x"),), 10)
    with pytest.raises(KernelproError, match="temperature=1.5"):
        LLMRequest.single("", "hi", 10, 1.5)


def test_price_lookup_accepts_dated_ids_only() -> None:
    assert find_price("claude-sonnet-4-5-20250929") == find_price("claude-sonnet-4-5")
    assert find_price("claude-opus-4-1").input_per_mtok == 15.0
    assert find_price("claude-sonnet-4-6") is None  # not priced as claude-sonnet-4
    assert find_price("my-model", {"my-model": [1.0, 2.0]}).cost(1_000_000, 500_000) == 2.0


def _record(tmp_path: Path) -> tuple[Path, list[LLMRequest]]:
    path = tmp_path / "calls.jsonl"
    scripted = ScriptedBackend(["first answer", "second answer", ("cut", "max_tokens")])
    recorder = RecordingBackend(scripted, path)
    first = LLMRequest.single("sys", "same question", 64, meta={"purpose": "programmer"})
    other = LLMRequest.single("sys", "other question", 64)
    assert recorder.complete(first).text == "first answer"
    assert recorder.complete(first).text == "second answer"  # same request, asked again
    assert recorder.complete(other).truncated
    return path, [first, first, other]


def test_recording_is_jsonl_with_request_and_response(tmp_path: Path) -> None:
    path, requests = _record(tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["llm"] * 3
    assert lines[0]["format"] == "kernelpro-llm-recording"
    assert lines[0]["request_hash"] == requests[0].request_hash()
    assert lines[0]["request"]["messages"] == [{"role": "user", "content": "same question"}]
    assert lines[0]["purpose"] == "programmer"
    assert lines[2]["response"]["stop_reason"] == "max_tokens"


def test_replay_is_deterministic_and_ordered(tmp_path: Path) -> None:
    path, requests = _record(tmp_path)
    runs = []
    for _ in range(2):
        replay = ReplayBackend(path)
        assert replay.recorded == 3
        runs.append([replay.complete(r).to_dict() for r in requests])
        assert replay.recorded == 0
    assert runs[0] == runs[1]
    assert [r["text"] for r in runs[0]] == ["first answer", "second answer", "cut"]


def test_replay_errors_are_clear(tmp_path: Path) -> None:
    path, requests = _record(tmp_path)
    replay = ReplayBackend(path)
    never = LLMRequest.single("sys", "never asked", 64, meta={"purpose": "profiling"})
    with pytest.raises(
        LLMError, match=rf"profiling request {never.request_hash()}.*never recorded"
    ):
        replay.complete(never)
    replay.complete(requests[2])
    with pytest.raises(LLMError, match="all 1 recorded response"):
        replay.complete(requests[2])


def test_replay_file_damage(tmp_path: Path) -> None:
    path, requests = _record(tmp_path)
    lines = path.read_text().splitlines()
    # A last line cut off mid-write is ignored ...
    path.write_text("\n".join(lines) + "\n" + lines[0][:40])
    assert ReplayBackend(path).recorded == 3
    # ... a corrupt line in the middle is damage.
    path.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(LLMError, match="line 2 is not JSON"):
        ReplayBackend(path)
    other = tmp_path / "other.jsonl"
    other.write_text('{"something": 1}\n')
    with pytest.raises(LLMError, match="neither an LLM recording"):
        ReplayBackend(other)
    with pytest.raises(LLMError, match="cannot read the LLM recording"):
        ReplayBackend(tmp_path / "missing.jsonl")


def test_make_backend(tmp_path: Path) -> None:
    path, requests = _record(tmp_path)
    backend = make_backend(f"replay:{path}")
    assert isinstance(backend, ReplayBackend)
    assert backend.complete(requests[0]).text == "first answer"
    wrapped = make_backend(f"replay:{path}", record_to=tmp_path / "again.jsonl")
    assert isinstance(wrapped, RecordingBackend)
    wrapped.complete(requests[0])
    assert len((tmp_path / "again.jsonl").read_text().splitlines()) == 1
    with pytest.raises(KernelproConfigError, match="names no file"):
        make_backend("replay:")
    with pytest.raises(KernelproConfigError, match="Unknown LLM backend 'gpt'"):
        make_backend("gpt")
    with pytest.raises(KernelproConfigError, match="takes no options"):
        make_backend(f"replay:{path}", model="x")
