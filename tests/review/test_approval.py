"""`kernelpro approval` (review/approval.py) against a fake GitHub: the GPU job runs only the
commit a person with write access approved, and every way around that stops with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_github import running_fake_github

from pytest_kernelpro.review.approval import approval_main, decide

TOKEN = "ghs_testtoken123"
REPO = "octo/kernels"
PR = 7
REVIEWED = "a" * 40
PUSHED = "b" * 40


@pytest.fixture
def github():
    with running_fake_github(TOKEN) as gh:
        gh.heads[PR] = REVIEWED
        gh.authors[PR] = "contributor"
        gh.permissions.update({"maint": "maintain", "admin1": "admin", "triager": "triage"})
        gh.permissions["contributor"] = "write"
        yield gh


def run(gh, sha: str = REVIEWED):
    return decide(REPO, PR, sha, token=TOKEN, api_url=gh.url)


def test_an_approving_review_of_the_exact_commit_by_a_maintainer_runs_it(github) -> None:
    github.add_review(PR, "maint", "APPROVED", REVIEWED)
    decision = run(github)
    assert decision.ok
    assert decision.sha == REVIEWED
    assert decision.approver == "maint"
    assert decision.reason.startswith("approved by maint (maintain) in review ")


def test_a_push_between_the_review_and_the_label_stops_the_job(github) -> None:
    """The race of the issue: reviewed at A, pushed B, then labeled: B runs nothing."""
    github.add_review(PR, "maint", "APPROVED", REVIEWED)
    github.heads[PR] = PUSHED
    decision = run(github, PUSHED)
    assert not decision.ok
    assert decision.reason.startswith(f"commit {PUSHED} has no approval by someone with write")
    assert f"maint approved {REVIEWED[:12]}" in decision.reason


def test_a_push_after_the_label_stops_the_queued_job(github) -> None:
    github.add_review(PR, "maint", "APPROVED", REVIEWED)
    github.heads[PR] = PUSHED  # the event said REVIEWED; the pull request is at PUSHED now
    decision = run(github, REVIEWED)
    assert not decision.ok
    assert "head moved since the label was added" in decision.reason


@pytest.mark.parametrize(
    ("login", "state", "why"),
    [
        ("triager", "APPROVED", "triager approved it but has triage access"),
        ("stranger", "APPROVED", "stranger approved it but has none access"),
        ("contributor", "APPROVED", "contributor is the author"),
        ("maint", "DISMISSED", "no approving review"),
        ("maint", "COMMENTED", "no approving review"),
        ("maint", "CHANGES_REQUESTED", "no approving review"),
    ],
)
def test_only_an_approval_by_someone_with_write_access_counts(github, login, state, why) -> None:
    github.add_review(PR, login, state, REVIEWED)
    decision = run(github)
    assert not decision.ok
    assert why in decision.reason


def test_a_maintainer_can_name_the_sha_in_a_comment(github) -> None:
    github.add_comment(PR, f"looks fine\n/gpu-ci approve {REVIEWED}\n", login="admin1")
    github.add_comment(PR, f"/gpu-ci approve {REVIEWED}", login="triager")  # not enough
    decision = run(github)
    assert decision.ok
    assert decision.approver == "admin1"
    assert decision.reason.startswith("named by admin1 (admin) in comment ")


def test_a_comment_naming_another_sha_or_by_the_author_approves_nothing(github) -> None:
    github.add_comment(PR, f"/gpu-ci approve {PUSHED}", login="maint")
    github.add_comment(PR, f"/gpu-ci approve {REVIEWED}", login="contributor")
    github.add_comment(PR, f"please /gpu-ci approve {REVIEWED} thanks", login="maint")
    decision = run(github)
    assert not decision.ok


def test_reviews_on_later_pages_are_found(github) -> None:
    for _ in range(5):  # page size 2 in the fake
        github.add_review(PR, "stranger", "COMMENTED", REVIEWED)
    github.add_review(PR, "maint", "APPROVED", REVIEWED)
    assert run(github).ok


def test_a_malformed_sha_is_refused_without_a_request(github) -> None:
    decision = run(github, "main")
    assert not decision.ok
    assert "is not a 40-hex commit id" in decision.reason
    assert github.requests == []


def test_the_command_exits_1_with_the_reason_and_0_with_the_sha(
    github, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    output = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    args = ["--repo", REPO, "--pr", str(PR), "--head-sha", REVIEWED, "--api-url", github.url]
    assert approval_main(args) == 1
    assert "::error::kernelpro approval: commit " in capsys.readouterr().err
    assert not output.exists()
    github.add_review(PR, "maint", "APPROVED", REVIEWED)
    assert approval_main(args) == 0
    assert output.read_text() == f"sha={REVIEWED}\n"
    # The token is sent only with requests to the API host and never printed.
    assert TOKEN not in capsys.readouterr().out
