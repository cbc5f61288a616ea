"""The package's import graph has no cycle.

Every import counts: module level, inside functions and methods, relative ones resolved, and
`from pkg import sub` as an import of the submodule `pkg.sub`. Only imports under
`if TYPE_CHECKING:` are left out (they never run). A cycle closed through an import inside a
function still ties the modules into one unit that cannot be read, tested or moved alone,
so it fails here like any other, with the modules and lines that close it.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

import pytest_kernelpro

PACKAGE_DIR = Path(pytest_kernelpro.__file__).resolve().parent

Edges = dict[str, dict[str, int]]  # module -> {imported module: first line}


def find_modules(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _known(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """`name` or its closest enclosing module of the package (`pkg.mod.Class` -> `pkg.mod`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(modules: dict[str, tuple[Path, bool]]) -> Edges:
    edges: Edges = {name: {} for name in modules}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        found = edges[name]

        def add(
            target: str | None, line: int, found: dict[str, int] = found, own: str = name
        ) -> None:
            if target is not None and target != own:
                found.setdefault(target, line)

        stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), str(path))]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                stack.extend(node.orelse)  # the body never runs
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(_known(alias.name, modules), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    source = ".".join(base) + (f".{node.module}" if node.module else "")
                else:
                    source = node.module or ""
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    add(submodule if submodule in modules else _known(source, modules), node.lineno)
            stack.extend(ast.iter_child_nodes(node))
    return edges


def strongly_connected(edges: Edges) -> list[list[str]]:
    """The groups of two or more modules that import each other (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def shortest_cycle(group: list[str], edges: Edges) -> list[str]:
    """One shortest cycle through the group's first module, as a closed path."""
    start = group[0]
    members = set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start} in {group}")


def describe_cycles(package_dir: Path) -> list[str]:
    modules = find_modules(package_dir)
    edges = import_edges(modules)
    described = []
    for group in strongly_connected(edges):
        cycle = shortest_cycle(group, edges)
        steps = [
            f"{a} -> {b} ({modules[a][0].relative_to(package_dir.parent)}:{edges[a][b]})"
            for a, b in zip(cycle, cycle[1:], strict=False)
        ]
        described.append(f"{len(group)} modules {group}: " + "; ".join(steps))
    return described


def test_package_has_no_import_cycle() -> None:
    cycles = describe_cycles(PACKAGE_DIR)
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(cycles)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


@pytest.mark.parametrize(
    ("a_source", "cyclic"),
    [
        ("def f():\n    from .b import x\n", True),  # a function-level import counts
        ("from pkg import b\n", True),  # `from pkg import sub` imports the submodule
        ("from .sub.c import y\n", True),  # through a subpackage, back with `..`
        ("import pkg.b\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n", False),
        (
            "import typing\nif typing.TYPE_CHECKING:\n    from .b import x\nelse:\n    x = 1\n",
            False,
        ),
        ("x = 1\n", False),
    ],
)
def test_cycle_finder_on_a_small_package(tmp_path: Path, a_source: str, cyclic: bool) -> None:
    package = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": a_source,
            "b.py": "from .a import something\nx = 1\n",
            "sub/__init__.py": "",
            "sub/c.py": "from ..b import x\ny = 2\n",
        },
    )
    cycles = describe_cycles(package)
    if cyclic:
        assert len(cycles) == 1, cycles
        assert "pkg.a" in cycles[0]
        assert "pkg.b" in cycles[0]
        assert "pkg/a.py:" in cycles[0]  # names the line that closes it
    else:
        assert cycles == []
