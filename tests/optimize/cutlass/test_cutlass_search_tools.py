"""CUTLASS code-search tools on a small fake tree: budget, confinement, read and list."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.cutlass.search_tools import CutlassSearchTools, CutlassToolError


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "cutlass"
    (root / "include" / "cute" / "atom").mkdir(parents=True)
    (root / "include" / "cutlass" / "arch").mkdir(parents=True)
    (root / "include" / "cute" / "atom" / "mma_traits_sm90_gmma.hpp").write_text(
        "// GMMA traits\nusing Layout_K_SW128_Atom = int;\nstruct SM90_64x128x16_F32BF16BF16_SS {};\n"
    )
    (root / "include" / "cutlass" / "arch" / "barrier.h").write_text(
        "\n".join(f"// line {i}" for i in range(1, 30)) + "\nvoid fence_barrier_init() {}\n"
    )
    (root / "include" / "cutlass" / "arch" / "notes.bin").write_bytes(b"\x00fence_barrier_init")
    (tmp_path / "secret.txt").write_text("fence_barrier_init outside the root\n")
    return root


def test_search_finds_matches_with_scope(tree: Path) -> None:
    tools = CutlassSearchTools(tree, search_budget=5)
    result = tools.search("fence_barrier_init")
    assert [(m.path, m.line) for m in result.matches] == [("include/cutlass/arch/barrier.h", 30)]
    assert result.searches_left == 4
    assert not result.truncated
    scoped = tools.search(r"SM90_64x\d+x16", regex=True, path="include/cute", glob="*.hpp")
    assert [m.text for m in scoped.matches] == ["struct SM90_64x128x16_F32BF16BF16_SS {};"]
    assert tools.search("layout_k_sw128", ignore_case=True).matches[0].line == 2
    assert "include/cute/atom/mma_traits_sm90_gmma.hpp:2:" in tools.search("SW128").render()


def test_search_budget_per_iteration(tree: Path) -> None:
    tools = CutlassSearchTools(tree, search_budget=2)
    tools.search("GMMA")
    tools.search("GMMA")
    with pytest.raises(CutlassToolError, match="search budget spent \\(2 searches"):
        tools.search("GMMA")
    # Reads and listings are unbudgeted.
    assert tools.read_file("include/cute/atom/mma_traits_sm90_gmma.hpp").total_lines == 3
    assert tools.list_directory("include")[0].name == "cute"
    tools.new_iteration()
    assert tools.searches_left == 2
    assert tools.search("GMMA").matches
    with pytest.raises(CutlassToolError, match="invalid regex"):
        tools.search("(", regex=True)
    assert tools.searches_left == 1  # a refused pattern costs nothing


def test_truncated_results(tree: Path) -> None:
    result = CutlassSearchTools(tree, max_results=3).search("line", path="include/cutlass")
    assert len(result.matches) == 3
    assert result.truncated
    assert "(truncated: narrow the path or glob)" in result.render()


def test_path_traversal_is_refused(tree: Path) -> None:
    tools = CutlassSearchTools(tree)
    for bad in (
        "../secret.txt",
        "include/../../secret.txt",
        str(tree.parent / "secret.txt"),
        "/etc",
    ):
        with pytest.raises(CutlassToolError, match="outside the CUTLASS root"):
            tools.read_file(bad)
    with pytest.raises(CutlassToolError, match="outside the CUTLASS root"):
        tools.search("fence", path="..")
    with pytest.raises(CutlassToolError, match="outside the CUTLASS root"):
        tools.list_directory("../")
    # A symlink that leaves the tree is refused too, and skipped by a recursive search.
    os.symlink(tree.parent / "secret.txt", tree / "include" / "escape.h")
    with pytest.raises(CutlassToolError, match="outside the CUTLASS root"):
        tools.read_file("include/escape.h")
    assert all("secret" not in m.path for m in tools.search("outside the root").matches)
    # An absolute path inside the root is fine.
    assert tools.read_file(str(tree / "include/cutlass/arch/barrier.h"), 30, 30).text.endswith(
        "void fence_barrier_init() {}"
    )


def test_read_ranges_and_listing(tree: Path) -> None:
    tools = CutlassSearchTools(tree, max_read_lines=5)
    excerpt = tools.read_file("include/cutlass/arch/barrier.h", 28)
    assert (excerpt.start, excerpt.end, excerpt.total_lines) == (28, 30, 30)
    assert excerpt.text.splitlines()[0] == "28  // line 28"
    capped = tools.read_file("include/cutlass/arch/barrier.h", 1, 100)
    assert capped.end == 5  # at most max_read_lines
    with pytest.raises(CutlassToolError, match="outside 'include/cutlass/arch/barrier.h'"):
        tools.read_file("include/cutlass/arch/barrier.h", 40, 50)
    with pytest.raises(CutlassToolError, match="is not a file"):
        tools.read_file("include")
    entries = tools.list_directory("include/cutlass/arch")
    assert [(e.name, e.is_dir) for e in entries] == [("barrier.h", False), ("notes.bin", False)]


def test_dispatch_returns_text_for_the_model(tree: Path) -> None:
    tools = CutlassSearchTools(tree, search_budget=1)
    names = [spec["name"] for spec in tools.tool_specs()]
    assert names == ["search_cutlass", "read_cutlass_file", "list_cutlass_directory"]
    assert "barrier.h:30:" in tools.dispatch("search_cutlass", {"pattern": "fence_barrier_init"})
    assert tools.dispatch("search_cutlass", {"pattern": "x"}).startswith(
        "error: search budget spent"
    )
    assert tools.dispatch("read_cutlass_file", {"path": "../secret.txt"}).startswith("error: path")
    assert "cute/" in tools.dispatch("list_cutlass_directory", {"path": "include"})
    assert tools.dispatch("rm_rf", {}).startswith("error: unknown tool")
