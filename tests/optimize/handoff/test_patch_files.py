"""optimize/loop/outcome.py: the patches folder holds exactly what the summary lists;
`best.patch` only for a ranked winner, `interim-N.patch` before the ranking."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelpro.optimize.loop.outcome import write_patches
from pytest_kernelpro.optimize.loop.patch import KernelSite

KERNEL = "def double(x):\n    return x * 2\n"
CODE = "import torch\nfrom torch import nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x + x\n"


def _site(tmp_path: Path) -> KernelSite:
    path = tmp_path / "kernels.py"
    path.write_text(KERNEL)
    return KernelSite(path=path, qualname="double", kind="function")


def _entries(*ids: int) -> list[dict]:
    return [{"node_id": i, "speedup_vs_current": 2.0, "strategy": "s"} for i in ids]


def test_interim_patches_are_named_interim_and_never_best(tmp_path: Path) -> None:
    folder = tmp_path / "patches"
    ranked = _entries(3, 1)
    info = write_patches(
        ranked, {3: CODE, 1: CODE}, _site(tmp_path), tmp_path, folder,
        kernel="double", best=3, interim=True,
    )  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["interim-1.patch", "interim-3.patch"]
    assert info["best_patch"] is None
    assert info["interim_best_patch"] == str(folder / "interim-3.patch")
    assert [Path(e["patch"]).name for e in ranked] == ["interim-3.patch", "interim-1.patch"]


def test_final_write_removes_interim_and_stale_patches(tmp_path: Path) -> None:
    """The attack: an interim best (and a best.patch left by an earlier run resumed in this
    folder) outliving a ranking that did not confirm it."""
    folder = tmp_path / "patches"
    site = _site(tmp_path)
    write_patches(
        _entries(3, 1), {3: CODE, 1: CODE}, site, tmp_path, folder,
        kernel="double", best=3, interim=True,
    )  # fmt: skip
    (folder / "best.patch").write_text("a stale winner of an earlier run\n")
    ranked = _entries(1)
    info = write_patches(ranked, {1: CODE}, site, tmp_path, folder, kernel="double", best=None)
    assert sorted(p.name for p in folder.iterdir()) == ["candidate-1.patch"]
    assert info["best_patch"] is None
    assert ranked[0]["patch"] == str(folder / "candidate-1.patch")


def test_final_winner_gets_best_patch_and_its_candidate_patch(tmp_path: Path) -> None:
    folder = tmp_path / "patches"
    info = write_patches(
        _entries(2), {2: CODE}, _site(tmp_path), tmp_path, folder, kernel="double", best=2
    )
    assert sorted(p.name for p in folder.iterdir()) == ["best.patch", "candidate-2.patch"]
    assert info["best_patch"] == str(folder / "best.patch")
    assert (folder / "best.patch").read_text() == (folder / "candidate-2.patch").read_text()
