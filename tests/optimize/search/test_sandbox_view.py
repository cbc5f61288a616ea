"""The allow-list view's lists, computed in the session (optimize/sandbox/view.py): what is
hidden, what is shown back, which project files are covered. Plain unit tests (the mounts
themselves: test_sandbox_attacks.py)."""

from __future__ import annotations

import os
from pathlib import Path

from pytest_kernelpro.optimize.sandbox import view


def test_home_and_every_non_system_top_level_directory_are_hidden(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for name in ("usr", "etc", "opt", "proc", "home", "work", "tmp", "data"):
        (root / name).mkdir(parents=True)
    (root / "lib").symlink_to("usr")  # a link is not a directory to hide
    home = tmp_path / "elsewhere" / "me"
    home.mkdir(parents=True)
    hidden = view.hidden_roots(str(home), root=str(root))
    assert sorted(p for p in hidden if p.startswith(str(root))) == [
        str(root / n) for n in ("data", "home", "tmp", "work")
    ]
    assert str(home) in hidden  # $HOME wherever it is
    assert str(root / "usr") not in hidden


def test_a_shown_path_never_undoes_a_hidden_one() -> None:
    hidden = ["/home", "/tmp"]
    needed = ["/home/me/project", "/home/me/project/src", "/home", "/", "/usr/lib", "/tmp/x"]
    # The project and /tmp/x are bound back; /home itself, / and the nested path are not
    # (the outer one carries it); /usr is visible anyway.
    assert view.shown_paths(needed, hidden) == ["/tmp/x", "/home/me/project"]


def test_secret_looking_project_files_are_found_and_code_is_not(tmp_path: Path) -> None:
    project = tmp_path / "project"
    files = [
        ".env",
        ".env.local",
        "deploy/id_ed25519",
        "certs/server.pem",
        "config/credentials.json",
        ".git/config",
        ".vault-token",
        "src/secrets.py",  # a module, not a secret
        "src/kernels.py",
        ".venv/lib/.env",  # in an installed environment: not scanned
    ]
    for rel in files:
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("x")
    (project / ".aws").mkdir()
    found = {os.path.relpath(p, project) for p in view.secret_files(str(project))}
    assert found == {
        ".env",
        ".env.local",
        "deploy/id_ed25519",
        "certs/server.pem",
        "config/credentials.json",
        ".git/config",
        ".vault-token",
        ".aws",
    }


def test_a_secret_file_created_after_a_scan_is_found(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    assert view.secret_files(str(project)) == ()
    (project / "sub" / ".env.production").write_text("API_KEY=x")
    assert view.secret_files(str(project)) == (str(project / "sub" / ".env.production"),)


def test_the_system_secrets_are_covered_and_installed_software_is_not_scanned(
    tmp_path: Path,
) -> None:
    covered = view.covered_paths([str(tmp_path / "site-packages"), "/"])
    assert all(p in view.SYSTEM_SECRETS for p in covered)
    if os.path.exists("/etc/shadow"):
        assert "/etc/shadow" in covered


def test_the_directories_of_the_workers_environment_are_needed(tmp_path: Path) -> None:
    libs = tmp_path / "driver-libs"
    libs.mkdir()
    needed = view.needed_paths(env={"LD_LIBRARY_PATH": f"{libs}:relative/ignored"})
    assert str(libs) in needed
    assert not any(p.endswith("relative/ignored") for p in needed)
