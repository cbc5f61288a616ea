"""text_safety: the one redaction and control-character filter for candidate and model text,
and the sinks that must use it (trajectory, llm-calls records, prompts, the optimize table
of the terminal, the PR comment and JUnit)."""

from __future__ import annotations

import json

import pytest

from pytest_kernelpro.text_safety import (
    redact,
    safe_text,
    safe_tree,
    secret_values,
    strip_controls,
)

# Shapes of real credentials (made up, never issued).
KEYS = {
    "anthropic key": "sk-ant-api03-" + "A1b2C3d4E5f6G7h8I9j0" * 3,
    "openai key": "sk-proj-" + "Zz09Yy18Xx27Ww36Vv45",
    "github token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "aws access key": "AKIA" + "IOSFODNN7EXAMPLE",
    "slack token": "xoxb-" + "123456789012-abcdefABCDEF",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_every_key_shape_is_redacted_and_named(kind: str) -> None:
    text = f"error: could not open {KEYS[kind]} (stolen)"
    out = redact(text, secrets=())
    assert KEYS[kind] not in out
    assert f"[redacted: {kind}]" in out
    assert out.startswith("error: could not open ")
    assert out.endswith(" (stolen)")


def test_fine_grained_github_tokens_and_pem_blocks_are_redacted() -> None:
    pat = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
    out = redact(f"x {pat} y\n{PEM}\nafter", secrets=())
    assert pat not in out
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in out
    assert out.endswith("\nafter")
    # A block cut off before its END line (an excerpt of stdout) is redacted to the end.
    cut = redact("head\n" + PEM.split("\n-----END")[0], secrets=())
    assert cut == "head\n[redacted: private key]"


def test_passwords_in_urls_and_authorization_headers_are_redacted() -> None:
    out = redact(
        "remote https://bot:s3cr3t-pa55@github.com/x.git\nAuthorization: Bearer abcdefgh12345",
        secrets=(),
    )
    assert "s3cr3t-pa55" not in out
    assert "abcdefgh12345" not in out
    assert "https://[redacted: url password]@github.com/x.git" in out


def test_the_values_of_the_sessions_secret_variables_are_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "plain-looking-value-42")
    monkeypatch.setenv("DB_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to redact without false hits
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-13")  # not a secret's name
    values = secret_values()
    assert "plain-looking-value-42" in values
    assert "hunter2hunter2" in values
    assert "abc" not in values
    assert "/usr/local/cuda-13" not in values
    out = safe_text("read plain-looking-value-42 and hunter2hunter2 from /usr/local/cuda-13")
    assert out == (
        "read [redacted: secret variable] and [redacted: secret variable] from /usr/local/cuda-13"
    )


# Unicode format characters (category Cf) a candidate could put inside a token so that no
# shape matches: each is invisible or nearly so where the text is shown.
FORMAT_CHARACTERS = {
    "zero-width space": "\u200b",
    "soft hyphen": "\u00ad",
    "zero-width joiner": "\u200d",
    "zero-width non-joiner": "\u200c",
    "word joiner": "\u2060",
    "byte-order mark": "\ufeff",
    "invisible separator": "\u2063",
    "left-to-right mark": "\u200e",
    "arabic letter mark": "\u061c",
    "mongolian vowel separator": "\u180e",
    "tag letter a": "\U000e0061",
}


@pytest.mark.parametrize("name", sorted(FORMAT_CHARACTERS))
@pytest.mark.parametrize("kind", ["github token", "anthropic key", "aws access key"])
def test_a_token_split_by_a_format_character_is_still_redacted(name: str, kind: str) -> None:
    char = FORMAT_CHARACTERS[name]
    key = KEYS[kind]
    split = char.join([key[:4], key[4:9], key[9:]])  # inside the prefix and the body
    out = safe_text(f"settings: {split} end", secrets=())
    assert f"[redacted: {kind}]" in out
    assert key[9:] not in out
    assert char not in out


def test_a_secret_variables_value_split_by_format_characters_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = "kp-session-secret-9a8b7c6d5e"
    monkeypatch.setenv("KERNELPRO_CANARY_TOKEN", value)
    split = "\u00ad".join(value[i : i + 3] for i in range(0, len(value), 3))
    out = safe_tree({"reason": f"got {split}", "logs": ["x\u200b" + split]})
    assert json.dumps(out).count("[redacted: secret variable]") == 2
    assert value[3:] not in json.dumps(out)


def test_every_format_character_of_unicode_is_removed_and_other_text_is_kept() -> None:
    import sys
    import unicodedata

    every = "".join(
        chr(c) for c in range(0x80, sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"
    )
    assert len(every) > 150
    assert safe_text(f"a{every}b", secrets=()) == "ab"
    kept = "µs, 1e+06 µs, naïve, 日本語, emoji 😀, tab\tand newline\n"
    assert safe_text(kept, secrets=()) == kept


def test_escape_sequences_and_control_characters_are_removed() -> None:
    attack = (
        "\x1b[2J\x1b[H=== 14 passed in 0.01s ===\x1b]0;owned\x07\r"
        "ok\x00\x07\x08\x9b31m tab\there\r\nnext\u202eline"
    )
    out = strip_controls(attack)
    assert out == "=== 14 passed in 0.01s ===ok tab\there\nnextline"
    assert not any(ord(c) < 32 and c not in "\n\t" for c in out)
    assert not any(0x7F <= ord(c) <= 0x9F for c in out)


def test_safe_tree_covers_nested_strings_and_keys_and_keeps_numbers() -> None:
    key = KEYS["github token"]
    data = {"reason": f"x {key}", "nested": [{"\x1b[31mk": (1.5, key)}], "n": 3}
    out = safe_tree(data, secrets=())
    text = json.dumps(out)
    assert key not in text
    assert "\\u001b" not in text
    assert out["n"] == 3
    assert out["nested"][0]["k"][0] == 1.5


def test_plain_text_is_unchanged() -> None:
    text = "CUDA error: an illegal memory access\n\tat kernel.cu:12 (sk-short) AKIA123\n"
    assert safe_text(text, secrets=()) == text


# ------------------------------------------------------------------- the sinks use it


def test_the_strategy_and_the_evaluation_leave_the_sandbox_safe() -> None:
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

    key = KEYS["anthropic key"]
    cand = Candidate(code="x = 1  # \x1b[2J kept", strategy=f"\x1b[2Jfast {key}")
    assert cand.strategy == "fast [redacted: anthropic key]"
    assert cand.code == "x = 1  # \x1b[2J kept"  # the program is run as written
    ev = Evaluation(
        status="run_error",
        reason=f"RuntimeError: {key}",
        logs=f"STOLEN {KEYS['aws access key']}\x1b[1A",
        build_log=PEM,
        metrics={"stdout": [key]},
    ).made_safe()
    assert key not in json.dumps(ev.to_dict())
    assert KEYS["aws access key"] not in ev.logs
    assert "\x1b" not in ev.logs
    assert ev.build_log == "[redacted: private key]"


def test_the_trajectory_and_the_llm_record_and_the_prompt_are_safe() -> None:
    from pytest_kernelpro.optimize.agents.llm.model_api import LLMRequest, LLMResponse
    from pytest_kernelpro.optimize.agents.llm.replay import call_record
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
    from pytest_kernelpro.optimize.search.trajectory import node_record
    from pytest_kernelpro.optimize.search.tree import SearchNode

    key = KEYS["openai key"]
    request = LLMRequest.single("system \x1b[2J", f"fix this error: {key}\x1b[H", max_tokens=10)
    assert key not in request.messages[0].content
    assert "\x1b" not in request.system
    response = LLMResponse(
        text=f"answer {key}\x1b[2J",
        stop_reason="end_turn",
        input_tokens=1,
        output_tokens=1,
        cost_usd=0.0,
        model="m",
    )
    record = json.dumps(call_record(request, response))
    assert key not in record
    assert "\\u001b" not in record

    node = SearchNode(
        id=1,
        parent=SearchNode(id=0),
        candidate=Candidate(code="code stays", strategy="s"),
        evaluation=Evaluation(status="run_error", reason=f"err {key}", logs="\x1b]0;t\x07x"),
        mode="initial",
    )
    line = json.dumps(node_record(node))
    assert key not in line
    assert "\\u001b" not in line
    assert "code stays" in line


def test_the_optimize_table_of_the_terminal_and_the_comment_is_safe() -> None:
    from pytest_kernelpro.optimize.loop import report_texts as optimize_texts
    from pytest_kernelpro.text_safety import safe_line  # the optimize table's strategy cells

    key = KEYS["github token"]
    assert safe_line(f"\x1b[2J=== 14 passed ===\r{key}", 200) == (
        "=== 14 passed ===[redacted: github token]"
    )
    assert "\x1b" not in optimize_texts._text("\x1b[31mred")
