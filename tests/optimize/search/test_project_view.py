"""The project view as an allow-list (optimize/sandbox/project_view.py, audit.py): a
candidate sees the kernel's imports, their native sources and the data the ini names; never
git history, a submodule's git directory, dotfiles, virtual environments or configuration
files, whatever their names. Plain unit tests; the mounts themselves: test_sandbox_view_attacks.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox import audit, view
from pytest_kernelpro.optimize.sandbox.project_view import (
    ini_data_patterns,
    project_view,
    refusal,
)

SECRETS = {
    # Each a configuration or infrastructure file a user keeps in a repository, under a
    # name no deny-list of secret names has.
    "mypkg/settings_local.py": 'SECRET_KEY = "kp-view-settings-1a2b3c"\n',
    "mypkg/notes.txt": "token kp-view-notes-4d5e6f\n",
    "infra/prod.tfvars": 'db_password = "kp-view-tfvars-7a8b9c"\n',
    "venv/pip.conf": "[global]\nindex-url = https://u:kp-view-pip-0d1e2f@pypi.example\n",
    "venv/pyvenv.cfg": "home = /usr/bin\n",
    ".venv/pip.conf": "[global]\nindex-url = https://u:kp-view-dotvenv-3a4b5c@x\n",
    ".venv/pyvenv.cfg": "home = /usr/bin\n",
    ".git/config": '[remote "origin"]\n\turl = https://kp-view-git-6d7e8f@github.com/o/r\n',
    ".git/modules/sub/config": "[remote]\n\turl = https://kp-view-sub-9a0b1c@x\n",
    ".git/objects/ab/cdef": "kp-view-object-2d3e4f",
    "docs/conf.yaml": "key: kp-view-yaml-5a6b7c\n",
}
CODE = {
    "test_k.py": "import pytest\nfrom mypkg.kern import k\n\n@pytest.mark.kernelpro\ndef t(): ...\n",
    "mypkg/__init__.py": "",
    "mypkg/kern.py": "from . import util\nfrom .ops import fused\nimport importlib\n"
    "importlib.import_module('mypkg.lazy')\nimport torch\n",
    "mypkg/util.py": "X = 1\n",
    "mypkg/ops/__init__.py": "from .fused import fused\n",
    "mypkg/ops/fused.py": "def fused(): ...\n",
    "mypkg/ops/fused.cu": "// kernel\n",
    "mypkg/lazy.py": "Y = 2\n",
    "mypkg/unused.py": "Z = 3\n",
    "data/weights.bin": "w",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    for rel, text in {**SECRETS, **CODE}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def shown(root: Path, **options: object) -> list[str]:
    entries = options.pop("entries", [str(root / "test_k.py")])
    found = project_view([str(root)], entries=entries, rootdir=str(root), **options)  # type: ignore[arg-type]
    return [os.path.relpath(p, root) for p in found.files]


def test_the_view_is_the_kernels_import_closure_and_its_native_sources(project: Path) -> None:
    assert shown(project) == [
        "mypkg/__init__.py",
        "mypkg/kern.py",
        "mypkg/lazy.py",  # importlib.import_module with a literal name
        "mypkg/ops/__init__.py",
        "mypkg/ops/fused.cu",  # a native source beside an imported module
        "mypkg/ops/fused.py",
        "mypkg/util.py",
        "test_k.py",
    ]


def test_configuration_files_git_and_virtualenvs_are_never_shown(project: Path) -> None:
    files = shown(project)
    for rel in SECRETS:
        assert rel not in files
    assert "mypkg/unused.py" not in files  # not imported: not needed


def test_named_data_is_shown_but_never_a_dot_path_or_a_virtualenvs_file(project: Path) -> None:
    data = ["data/*", ".env", ".git/config", "venv/pip.conf", ".venv/*", "missing/*"]
    found = project_view(
        [str(project)], entries=[str(project / "test_k.py")], data=data, rootdir=str(project)
    )
    files = [os.path.relpath(p, project) for p in found.files]
    assert "data/weights.bin" in files
    refused = {os.path.relpath(p, project): why for p, why in found.refused.items()}
    assert refused[".git/config"] == "a dot path (.git)"
    assert refused["venv/pip.conf"].startswith("inside a virtual environment")
    assert refused[".venv/pip.conf"] == "a dot path (.venv)"
    for rel in SECRETS:
        assert rel not in files


def test_an_import_of_a_configuration_module_shows_it_and_says_why(project: Path) -> None:
    """The rule is the import, not the name: a kernel that imports its settings runs them."""
    (project / "test_k.py").write_text("from mypkg import settings_local\n")
    found = project_view([str(project)], entries=[str(project / "test_k.py")])
    path = str((project / "mypkg" / "settings_local.py").resolve())
    assert found.files[path] == f"imported by {(project / 'test_k.py').resolve()}"


def test_links_and_dot_components_are_refused_with_a_reason(project: Path) -> None:
    (project / "mypkg" / "link.py").symlink_to(project / "infra" / "prod.tfvars")
    (project / "test_k.py").write_text("import mypkg.link\n")
    found = project_view([str(project)], entries=[str(project / "test_k.py")])
    assert not any(p.endswith(("prod.tfvars", "link.py")) for p in found.files)
    assert found.refused[str(project / "mypkg" / "link.py")] == "a symbolic link"
    assert refusal(str(project / ".git" / "config"), [str(project)]) == "a dot path (.git)"
    assert refusal(str(project / "missing.py"), [str(project)]) == "missing"


def test_the_view_is_computed_once_per_inputs(project: Path) -> None:
    entries = [str(project / "test_k.py")]
    first = project_view([str(project)], entries=entries)
    (project / "mypkg" / "late.py").write_text("")
    assert project_view([str(project)], entries=entries) is first


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pytest.ini", "[pytest]\nkernelpro_sandbox_data =\n    data/*.bin\n    tables/\n"),
        ("tox.ini", "[pytest]\nkernelpro_sandbox_data = data/*.bin tables/\n"),
        ("setup.cfg", "[tool:pytest]\nkernelpro_sandbox_data = data/*.bin tables/\n"),
        (
            "pyproject.toml",
            '[tool.pytest.ini_options]\nkernelpro_sandbox_data = ["data/*.bin", "tables/"]\n',
        ),
    ],
)
def test_the_ini_names_data_files(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    assert ini_data_patterns(str(tmp_path)) == ("data/*.bin", "tables/")


def test_no_ini_names_no_data(tmp_path: Path) -> None:
    assert ini_data_patterns(str(tmp_path)) == ()
    (tmp_path / "pyproject.toml").write_text("[tool.other]\nx = 1\n")
    assert ini_data_patterns(str(tmp_path)) == ()


def test_a_virtualenv_is_shown_as_what_the_interpreter_needs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    for rel in ("bin/python", "lib/python3.11/site-packages/x.py", "pyvenv.cfg", "pip.conf"):
        (venv / rel).parent.mkdir(parents=True, exist_ok=True)
        (venv / rel).write_text("")
    (venv / "etc").mkdir()
    needed = view.needed_paths(extra=[venv])
    assert str(venv / "bin") in needed
    assert str(venv / "lib") in needed
    assert str(venv / "pyvenv.cfg") in needed
    assert str(venv) not in needed
    assert str(venv / "pip.conf") not in needed
    assert str(venv / "etc") not in needed


def test_the_project_directories_are_hidden_and_only_the_view_bound_back(
    project: Path,
) -> None:
    hidden, needed, files = view.with_project(
        ["/tmp-hidden"],
        [str(project), str(project / "src"), "/usr/lib"],
        [str(project)],
        [str(project / "test_k.py")],
    )
    assert str(project) in hidden  # outside every hidden root: hidden itself
    assert needed == ["/usr/lib"]  # the project is not shown whole
    assert files == [str(project / "test_k.py")]
    # A root that holds a system directory is never hidden (it is not a project).
    hidden, _, _ = view.with_project([], [], ["/"], [])
    assert hidden == []


def test_the_audit_prints_what_a_candidate_could_read(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pytest.ini").write_text("[pytest]\nkernelpro_sandbox_data = data/*\n")
    (project / "test_k.py").write_text(
        CODE["test_k.py"].replace("@pytest.mark.kernelpro", "#kernelpro")
    )
    assert audit.main([str(project), "--data", "venv/pip.conf"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"project {project.resolve()}: a candidate sees 9 of its files, read-only"
    )
    assert "entries: test_k.py" in out  # found by its mention of kernelpro
    assert "  data/weights.bin  (data (kernelpro_sandbox_data))" in out
    assert "  mypkg/ops/fused.cu  (native source beside " in out
    assert "  venv/pip.conf  (inside a virtual environment " in out
    for text in SECRETS.values():
        assert text.strip() not in out
    assert "hidden (empty):" in out


def test_the_audit_of_a_missing_directory_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert audit.main([str(tmp_path / "nope")]) == 2
    assert "nope is not a directory" in capsys.readouterr().err
