"""optimize/loop/patch.py: a candidate handed back as a minimal patch that `git apply` takes from the
repository root and that rewires the marked kernel (function, nn.Module class, KernelBench)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.loop.patch import (
    ENTRY_NAME,
    KernelSite,
    PatchError,
    build_patch,
    import_style_of,
    rewired_source,
)
from pytest_kernelpro.problem.kernelbench import import_file
from pytest_kernelpro.problem.language import detect_language_of

CANDIDATE = """import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x
"""

CUDA_CANDIDATE = """import torch
from torch import nn
from torch.utils.cpp_extension import load_inline


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x
"""

KERNELS = '''"""Kernels."""
import pytest
import torch


def helper():
    return 1


@pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=lambda d: (torch.ones(4, device=d),))
def double(x, *rest, scale=1, **options):
    """Doubles."""
    y = x * 2
    return y


class Double(torch.nn.Module):
    """A module."""

    def forward(self, x):
        return x * 2


def after():
    return 2
'''

KERNELBENCH = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []"""


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    assert _git(tmp_path, "init", "-q").returncode == 0
    assert _git(tmp_path, "add", "-A").returncode == 0
    assert _git(tmp_path, "commit", "-qm", "init").returncode == 0
    return tmp_path


def _changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    import difflib

    removed, added = [], []
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed, added


def test_function_body_is_rewired_and_everything_else_kept() -> None:
    site = KernelSite(Path("k.py"), "double", "function", "absolute")
    out = rewired_source(site, KERNELS, note="candidate 3")
    removed, added = _changed_lines(KERNELS, out)
    assert removed == ["    y = x * 2", "    return y"]
    assert added[0] == "    # pytest-kernelpro: candidate 3"
    assert f"    from kernelpro_double import {ENTRY_NAME} as candidate" in added
    assert "    return candidate(x, *rest)" in added
    compile(out, "k.py", "exec")


def test_module_class_gets_a_new_returning_the_candidate() -> None:
    site = KernelSite(Path("k.py"), "Double", "module", "relative")
    out = rewired_source(site, KERNELS, note="")
    removed, added = _changed_lines(KERNELS, out)
    assert removed == ["    def forward(self, x):", "        return x * 2"]
    assert "        from .kernelpro_Double import ModelNew as candidate" in added
    assert '    """A module."""' in out


def test_kernelbench_file_keeps_model_and_gains_one_import() -> None:
    site = KernelSite(Path("19_ReLU.py"), "ModelNew", "kernelbench", "absolute")
    assert site.module_name == "kernelpro_19_ReLU"
    out = rewired_source(site, KERNELBENCH, note="c1")
    assert out.startswith(KERNELBENCH + "\n")  # no trailing newline before: one added
    assert out.rstrip().endswith(
        "from kernelpro_19_ReLU import ModelNew  # noqa: E402  pytest-kernelpro: c1"
    )
    with_new = KERNELBENCH + "\n\n\nclass ModelNew(nn.Module):\n    pass\n"
    replaced = rewired_source(site, with_new, note="c1")
    assert "class ModelNew" not in replaced
    assert "class Model(nn.Module)" in replaced


def test_one_line_def_is_refused_with_the_fix() -> None:
    site = KernelSite(Path("k.py"), "f", "function")
    with pytest.raises(PatchError, match="on one line"):
        rewired_source(site, "def f(x): return x\n", note="")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_patch_applies_from_the_root_with_git_apply_and_git_am(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"pkg/kernels.py": KERNELS, "pkg/__init__.py": ""})
    site = KernelSite(root / "pkg" / "kernels.py", "double", "function", "relative")
    patch = build_patch(site, CANDIDATE, root=root, subject="kernelpro: double candidate 3")
    assert patch.new_file == "pkg/kernelpro_double.py"
    assert patch.changed_file == "pkg/kernels.py"
    (tmp_path / "p.patch").write_text(patch.text)
    assert _git(root, "apply", "--check", "p.patch").returncode == 0
    am = _git(root, "am", "p.patch")
    assert am.returncode == 0, am.stderr
    log = _git(root, "log", "-1", "--format=%s").stdout.strip()
    assert log == "kernelpro: double candidate 3"
    assert (root / "pkg" / "kernelpro_double.py").read_text().count("class ModelNew") == 1
    # The rewired kernel runs the candidate (imported relatively inside the package).
    sys.path.insert(0, str(root))
    try:
        import importlib

        module = importlib.import_module("pkg.kernels")
        import torch

        assert module.double(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
            del sys.modules[name]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_path_import_and_language_detection_after_the_patch(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"kernels_by_path.py": KERNELS})
    site = KernelSite(root / "kernels_by_path.py", "double", "function", "path")
    patch = build_patch(site, CUDA_CANDIDATE, root=root, subject="s")
    (tmp_path / "p.patch").write_text(patch.text)
    assert _git(root, "apply", "p.patch").returncode == 0
    module = import_file(root / "kernels_by_path.py")
    # The patched kernel's own code names no CUDA; the file it loads does.
    assert detect_language_of(module.double) == "cuda"


def test_import_style_follows_how_pytest_imported_the_module(tmp_path: Path) -> None:
    assert import_style_of("no_such_module", tmp_path / "m.py", path=[str(tmp_path)]) == "absolute"
    assert import_style_of("no_such_module", tmp_path / "m.py", path=["/elsewhere"]) == "path"
    assert import_style_of("pytest_kernelpro.optimize.loop.patch", Path(__file__)) == "relative"


def test_an_existing_user_file_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text(KERNELS)
    (tmp_path / "kernelpro_double.py").write_text("# mine\n")
    site = KernelSite(tmp_path / "k.py", "double", "function")
    with pytest.raises(PatchError, match="not written by pytest-kernelpro"):
        build_patch(site, CANDIDATE, root=tmp_path, subject="s")
