"""A hostile report artifact rendered by the commenter: only escaped text comes out.

The report is written by a job that ran the pull request's code, so every string in it is
attacker-controlled. The body is rendered with markdown-it-py (CommonMark plus GFM tables;
installed with rich) and the HTML is checked: no link, image, heading, or HTML of the
attacker's; every hostile string sits inside <code> or <pre>; mentions and issue references
(which GitHub adds after Markdown) appear only inside code, where GitHub does not make them.
"""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest
from gate_factories import make_record
from markdown_it import MarkdownIt

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.report import build_report
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import VerdictPart, part_of
from pytest_kernelpro.review.comment import MARKER, render_comment
from pytest_kernelpro.review.comment_cli import comment_main

EVIL = (
    "x](https://evil.example/a) ![i](https://evil.example/i.png) <img src=x onerror=alert(1)> "
    "@octocat #1 https://evil.example/b </details></summary><h1>APPROVED</h1> **bold** "
    "`code` ``` <!-- kernelpro-report --> | pipe"
)
EVIL_BLOCK = (
    "</details>\n\n## ✅ Approved by @maintainer\n[click](https://evil.example)\n"
    "```\n<img src=https://evil.example/x.png>\n```\n~~~\nclose #12\n<!-- kernelpro-report -->"
)


def hostile_report() -> dict:
    rec = make_record("evil", seed=5)
    rec.gate = part_of(VerdictPart, decide_verdict(rec, None))
    rec.name = EVIL
    rec.outcome = "failed"
    rec.message = EVIL + "\n### ✅ all passed\n" + EVIL
    rec.device = "@admin " + EVIL
    rec.guidance = EVIL_BLOCK
    rec.roofline = msgspec.structs.replace(rec.roofline, bound="<script>alert(1)</script> @x")
    failed = make_record("fail2", seed=6)
    failed.outcome = "failed"
    failed.message = EVIL_BLOCK
    failed.gate = msgspec.structs.replace(
        part_of(VerdictPart, decide_verdict(failed, None)),
        status="approved</td><td>@boss",
        reason=EVIL,
        basis=EVIL,
        baseline_device=EVIL,
    )
    meta = {"devices": [EVIL], "commit": "`;@x[a](b)", "torch": EVIL, "baseline_commit": EVIL}
    return build_report([rec, failed], meta=meta)


class _Walk(HTMLParser):
    """Tags seen, and text outside <code>/<pre>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.depth = 0
        self.outside: list[str] = []
        self.comments: list[str] = []

    def handle_comment(self, data: str) -> None:
        if self.depth == 0:
            self.comments.append(data)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        if tag in ("code", "pre"):
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("code", "pre"):
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth == 0:
            self.outside.append(data)


def rendered(body: str) -> _Walk:
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(body)
    walk = _Walk()
    walk.feed(html)
    return walk


def test_every_hostile_string_is_shown_as_text() -> None:
    body = render_comment(hostile_report())
    walk = rendered(body)
    # Tags: only the ones the commenter writes itself.
    assert set(walk.tags) <= {
        "h3", "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "p", "ul", "li",
        "strong", "details", "summary", "hr",
    }  # fmt: skip
    assert walk.tags.count("h3") == 1  # the summary line, nothing the artifact wrote
    assert walk.tags.count("details") == 2  # one per failed kernel, none broken out
    outside = " ".join(walk.outside)
    for needle in ("evil.example", "APPROVED", "Approved", "@", "#1", "<script", "alert"):
        assert needle not in outside, needle
    assert "all passed" not in outside
    # The marker stays first, and the only HTML comment is ours.
    assert body.startswith(MARKER + "\n")
    assert walk.comments == [" kernelpro-report "]


def test_the_unknown_status_is_named_not_trusted() -> None:
    report = hostile_report()
    report["records"][1]["outcome"] = "passed"
    body = render_comment(report)
    assert "❔ 1 with an unknown status" in body.splitlines()[1]
    assert "unknown status `approved</td><td>@boss`" in body


def test_summary_is_not_all_passed_for_unknown_statuses() -> None:
    report = hostile_report()
    for rec in report["records"]:
        rec["outcome"] = "passed"
        rec["gate"] = {"status": "totally-fine"}
    summary = render_comment(report).splitlines()[1]
    assert "all passed" not in summary
    assert "no regressions" not in summary
    assert "2 with an unknown status" in summary


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("records", 0, "gate", "change"), "+10%", r"report\.records\[0\]\.gate\.change is '\+10%' \(str\), expected a number"),
        (("records", 0, "efficiency"), [1], r"records\[0\]\.efficiency is \[1\] \(list\), expected a number"),
        (("records", 0, "timing", "stats", "median_s"), "fast", r"timing\.stats\.median_s is 'fast'"),
        (("records", 0, "gate", "n_baseline"), 2.5, r"gate\.n_baseline is 2\.5 \(float\), expected an integer"),
        (("records", 0, "gate", "change"), True, r"gate\.change is True \(bool\), expected a number"),
        (("records", 0, "name"), 7, r"records\[0\]\.name is 7 \(int\), expected a string"),
        (("meta", "wall_s"), "1 s", r"report\.meta\.wall_s is '1 s'"),
        (("meta", "devices"), "H200", r"report\.meta\.devices is 'H200' \(str\), expected a list"),
    ],
)  # fmt: skip
def test_a_wrong_type_is_a_clear_error(path: tuple, value: object, message: str) -> None:
    report = copy.deepcopy(hostile_report())
    target = report
    for key in path[:-1]:
        target = (
            target[key]
            if not isinstance(target, dict) or key in target
            else target.setdefault(key, {})
        )
    target[path[-1]] = value
    with pytest.raises(KernelproError, match=message):
        render_comment(report)


def test_the_cli_posts_nothing_for_a_malformed_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = hostile_report()
    report["records"][0]["gate"]["p_value"] = "0.01"
    path = atomic_write_json(tmp_path / "r.json", report)
    out = tmp_path / "c.md"
    assert comment_main([str(path), "--out", str(out)]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    # The report's reader names the file, the record and the field (msgspec's validation).
    assert f"kernelpro report {path}: records[0]: not a kernel record" in err
    assert "got `str` - at `$.gate.p_value`" in err
    assert "Traceback" not in err


def test_code_spans_survive_backticks_and_pipes() -> None:
    body = render_comment(hostile_report())
    row = next(line for line in body.splitlines() if line.startswith("| ````x]"))
    # Four backticks: one more than the longest run (```) inside; the pipe is escaped.
    assert re.search(r"````x\]\(https://evil\.example/a\).*\\\| pipe````", row)
