"""The PR comment: Markdown rendering, sticky posting against a loopback GitHub, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_github import running_fake_github
from gate_factories import make_record

from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.confirmation import confirm
from pytest_kernelpro.gate.report import build_report
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import VerdictPart, part_of
from pytest_kernelpro.review.comment import MARKER, render_comment
from pytest_kernelpro.review.comment_cli import comment_main, post_comment
from pytest_kernelpro.review.github import GitHubApiError

US = 1e-6
TOKEN = "ghs_testtoken123"


def gated(name: str, scale: float, *, device: str = "NVIDIA H200", **kw: object):
    base = make_record(name, seed=500)
    entry = entry_from_record(base)
    rec = make_record(name, median_s=50 * US * scale, seed=7, device=device, **kw)  # type: ignore[arg-type]
    verdict = decide_verdict(rec, entry)
    if verdict.change_status == "regressed":
        verdict = confirm(verdict, make_record(name, median_s=50 * US * scale, seed=8), entry)
    rec.gate = part_of(VerdictPart, verdict)
    return rec


@pytest.fixture
def report() -> dict:
    slow = gated("softmax[8192x4096]", 1.10)
    slow.guidance = "### Automated Bottleneck Analysis\n- uncoalesced global loads <!-- x -->"
    fast = gated("matmul[4096]", 0.85, bound="compute")
    same = gated("rms|norm[1024]", 1.0)  # a pipe in a name must not break the table
    new = make_record("fresh[1]", seed=3)
    new.gate = part_of(VerdictPart, decide_verdict(new, None))
    other = gated("gelu[2048]", 1.0, device="NVIDIA H100 80GB HBM3")
    broken = make_record("broken[1]", timed=False, outcome="failed")
    broken.message = "output mismatch at [3, 7]: 1.5 vs 2.0"
    meta = {"devices": ["NVIDIA H200"], "commit": "0123456789abcdef", "torch": "2.11.0"}
    return build_report([same, fast, slow, new, other, broken], meta=meta)


def table_rows(body: str) -> dict[str, list[str]]:
    rows = {}
    for line in body.splitlines():
        if line.startswith("| ") and not line.startswith("| Kernel") and "|:--" not in line:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_comment_has_marker_summary_and_table(report: dict) -> None:
    body = render_comment(report)
    assert body.startswith(MARKER + "\n")
    summary = body.splitlines()[1]
    assert summary == (
        "### kernelpro: ❌ 1 failed · 🔴 1 regressed · 🟢 1 improved · 🆕 1 new (6 kernels)"
    )
    rows = table_rows(body)
    slow = rows["softmax[8192x4096]"]
    assert slow[1:3] == ["50.0 µs", "55.0 µs"]
    assert re.fullmatch(r"\*\*\+(9\.9|10\.0|10\.1)%\*\*", slow[3])
    assert slow[4].startswith("`████▍")
    assert slow[4].endswith("55%")
    assert slow[5:] == ["memory", "🔴 regressed"]  # our own words: plain text
    assert rows["matmul[4096]"][3].startswith("**−")
    assert rows["matmul[4096]"][6] == "🟢 improved"
    assert rows["fresh[1]"][1] == "–"
    assert rows["fresh[1]"][6] == "🆕 new"
    assert rows["rms\\|norm[1024]"][6] == "⚪ ok"
    assert rows["gelu[2048]"][3].endswith("\\*")  # other device: by efficiency, footnoted
    assert "compared by efficiency" in body
    assert rows["broken[1]"][6] == "❌ failed"
    # Order: what needs attention first.
    names = list(rows)
    assert names.index("broken[1]") < names.index("softmax[8192x4096]") < names.index("fresh[1]")
    assert "commit `0123456789ab`" in body
    assert "torch `2.11.0`" in body


def test_details_for_regressed_and_failed_kernels(report: dict) -> None:
    body = render_comment(report)
    assert body.count("<details>") == 2
    start = body.index("<details><summary>🔴 <code>softmax[8192x4096]</code>: regressed")
    block = body[start : body.index("</details>", start)]
    assert "Mann-Whitney U:** one-sided p = " in block
    assert "Confirmation re-measurement:** reproduced (+" in block
    assert "time (same device: NVIDIA H200)`; tolerance 5.0%" in block
    # The guidance comes from the artifact: a text block, shown verbatim, never rendered.
    assert "```text\n### Automated Bottleneck Analysis\n- uncoalesced global loads" in block
    assert body.startswith(MARKER)
    assert "output mismatch at [3, 7]" in body


def test_many_unchanged_kernels_are_folded() -> None:
    records = [gated(f"k{i}[1]", 1.0) for i in range(20)] + [gated("slow[1]", 1.2)]
    body = render_comment(build_report(records, meta={}))
    assert "<details><summary>20 unchanged or skipped kernels</summary>" in body
    first_table = body.split("<details>")[0]
    assert "slow[1]" in first_table
    assert "k3[1]" not in first_table


def test_huge_comment_stays_under_github_limit() -> None:
    rec = gated("slow[1]", 1.2)
    rec.guidance = "x" * 70_000
    body = render_comment(build_report([rec], meta={}))
    assert len(body) < 65_536
    assert "slow[1]" in body


def test_empty_report() -> None:
    assert "no kernel items ran" in render_comment(build_report([], meta={}))


def test_post_creates_then_updates_one_sticky_comment() -> None:
    with running_fake_github(TOKEN) as gh:
        gh.add_comment(7, "LGTM")
        gh.add_comment(7, "please rebase")
        gh.add_comment(7, "ci is green")  # three comments: two pages of two
        url = post_comment(
            f"{MARKER}\nfirst", repo="octo/kernels", pr_number=7, token=TOKEN, api_url=gh.url
        )
        assert url.endswith(f"#issuecomment-{gh.all_comments(7)[-1]['id']}")
        assert [c["body"] for c in gh.all_comments(7)][-1] == f"{MARKER}\nfirst"
        post_comment("second", repo="octo/kernels", pr_number=7, token=TOKEN, api_url=gh.url)
        bodies = [c["body"] for c in gh.all_comments(7)]
        assert len(bodies) == 4  # updated, never a second comment
        assert bodies[-1] == f"{MARKER}\nsecond"  # the marker is added when missing
        methods = [(m, p.split("?")[0]) for m, p, _, _ in gh.requests]
        assert methods.count(("POST", "/repos/octo/kernels/issues/7/comments")) == 1
        assert (
            "PATCH",
            f"/repos/octo/kernels/issues/comments/{gh.all_comments(7)[-1]['id']}",
        ) in methods
        assert any("page=2" in p for m, p, _, _ in gh.requests if m == "GET")  # pagination
        for _, _, headers, _ in gh.requests:
            assert headers["Authorization"] == f"Bearer {TOKEN}"
            assert headers["Accept"] == "application/vnd.github+json"


def test_post_updates_only_the_bots_own_comment() -> None:
    with running_fake_github(TOKEN) as gh:
        for i in range(5):
            gh.add_comment(3, f"review {i}")
        quoted = gh.add_comment(3, f"> {MARKER} quoted by a person")
        human = gh.add_comment(3, f"{MARKER}\na person's comment that starts with the marker")
        other_bot = gh.add_comment(3, f"{MARKER}\nanother bot", user_type="Bot", login="evil[bot]")
        impostor = gh.add_comment(  # the bot's login but another id
            3, f"{MARKER}\nimpostor", user_type="Bot", login="github-actions[bot]", uid=7
        )
        mentions = gh.add_comment(  # the bot, but the marker is not at the start
            3, f"hello {MARKER}", user_type="Bot", login="github-actions[bot]", uid=41898282
        )
        ours = gh.add_comment(
            3, f"{MARKER}\nold", user_type="Bot", login="github-actions[bot]", uid=41898282
        )
        post_comment("new", repo="o/r", pr_number=3, token=TOKEN, api_url=gh.url)
        assert ours["body"] == f"{MARKER}\nnew"  # found on the last page, by identity
        for untouched in (quoted, human, other_bot, impostor, mentions):
            assert "new" not in untouched["body"].splitlines()
        assert len(gh.all_comments(3)) == 11
        patched = [p for m, p, _, _ in gh.requests if m == "PATCH"]
        assert patched == [f"/repos/o/r/issues/comments/{ours['id']}"]


def test_post_never_edits_a_human_comment_with_the_marker_it_creates_its_own() -> None:
    with running_fake_github(TOKEN) as gh:
        human = gh.add_comment(4, f"{MARKER}\nI pasted the marker")
        post_comment("ours", repo="o/r", pr_number=4, token=TOKEN, api_url=gh.url)
        assert human["body"] == f"{MARKER}\nI pasted the marker"
        assert [c["body"] for c in gh.all_comments(4)][-1] == f"{MARKER}\nours"


def test_api_error_is_clear_and_never_shows_the_token() -> None:
    with running_fake_github(TOKEN) as gh:
        gh.fail_with = (403, f"Resource not accessible by integration (token {TOKEN})")
        with pytest.raises(GitHubApiError) as info:
            post_comment("x", repo="o/r", pr_number=1, token=TOKEN, api_url=gh.url)
    message = str(info.value)
    assert "HTTP 403" in message
    assert "GET /repos/o/r/issues/1/comments" in message
    assert "pull-requests: write" in message
    assert TOKEN not in message
    assert "***" in message


def test_bad_token_is_reported_as_such() -> None:
    with running_fake_github(TOKEN) as gh, pytest.raises(GitHubApiError, match="HTTP 401"):
        post_comment("x", repo="o/r", pr_number=1, token="wrong", api_url=gh.url)


def test_token_is_not_sent_to_another_host() -> None:
    with running_fake_github(TOKEN) as gh:
        for i in range(3):
            gh.add_comment(2, f"c{i}")
        gh.link_host = "http://127.0.0.2:9"
        with pytest.raises(GitHubApiError, match="refusing to send the token"):
            post_comment("x", repo="o/r", pr_number=2, token=TOKEN, api_url=gh.url)
        assert len(gh.requests) == 1


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"repo": "not-a-repo"}, "OWNER/NAME"),
        ({"pr_number": 0}, "pull request number"),
        ({"token": ""}, "GITHUB_TOKEN"),
    ],
)
def test_post_validates_its_arguments(kw: dict, match: str) -> None:
    args = {"repo": "o/r", "pr_number": 1, "token": TOKEN, "api_url": "http://127.0.0.1:9"}
    args.update(kw)
    with pytest.raises(GitHubApiError, match=match):
        post_comment("x", **args)


def test_cli_writes_markdown_from_json(
    tmp_path: Path, report: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    path = atomic_write_json(tmp_path / "r.json", report)
    out = tmp_path / "comment.md"
    assert comment_main([str(path), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_comment(report)
    assert comment_main([str(path)]) == 0
    assert capsys.readouterr().out.startswith(MARKER)


def test_cli_merges_several_reports(tmp_path: Path) -> None:
    a = atomic_write_json(tmp_path / "a.json", build_report([gated("a[1]", 1.0)], meta={}))
    b = atomic_write_json(tmp_path / "b.json", build_report([gated("b[1]", 1.3)], meta={}))
    out = tmp_path / "c.md"
    assert comment_main([str(a), str(b), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "| `a[1]` |" in text
    assert "| `b[1]` |" in text
    assert "(2 kernels)" in text


def test_cli_posts_with_the_token_from_the_environment(
    tmp_path: Path,
    report: dict,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = atomic_write_json(tmp_path / "r.json", report)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    with running_fake_github(TOKEN) as gh:
        gh.heads[12] = "a" * 40
        args = [str(path), "--post", "--repo", "o/r", "--pr", "12", "--api-url", gh.url]
        assert comment_main([*args, "--head-sha", "a" * 40]) == 0
        assert comment_main(args) == 0
        assert len(gh.all_comments(12)) == 1
        assert gh.all_comments(12)[0]["body"].startswith(MARKER)
        # A report for another head commit is not posted (stale or misdirected artifact).
        before = gh.all_comments(12)[0]["body"]
        gh.all_comments(12)[0]["body"] = before + "\nedited"
        assert comment_main([*args, "--head-sha", "b" * 40]) == 0
        assert gh.all_comments(12)[0]["body"].endswith("edited")
    err = capsys.readouterr().err
    assert "not posting" in err
    assert TOKEN not in err


def test_cli_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("GH_TOKEN", raising=False)
    path = atomic_write_json(tmp_path / "r.json", build_report([gated("a[1]", 1.0)], meta={}))
    assert comment_main([str(path), "--post", "--repo", "o/r", "--pr", "x"]) == 2
    assert comment_main([str(path), "--post", "--repo", "o/r", "--pr", "3"]) == 1
    assert "GITHUB_TOKEN" in capsys.readouterr().err
    assert comment_main([str(tmp_path / "missing.json")]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}), encoding="utf-8")
    assert comment_main([str(bad)]) == 1
    assert "not a pytest-kernelpro JSON report" in capsys.readouterr().err
