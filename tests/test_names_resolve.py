"""Every name the package imports from itself exists, wherever the import runs.

A restructure that moves or merges modules breaks imports that only run on some machines: an
import inside a function that runs only on a GPU, in the sandbox's worker or in the profiler's
target, or an import in code the package writes as text for another process (the KernelBench
shims, the sandbox's scripts). The CPU suite never runs those lines, so this reads them instead:

- every `import pytest_kernelpro...` and `from pytest_kernelpro... import name` in the package,
  at any depth (functions and methods included), relative ones resolved;
- every `from pytest_kernelpro... import ...` line and every dotted `pytest_kernelpro.a.b` name
  inside the package's string constants (generated code, messages and docstrings).

Each must resolve to a module, or to an attribute of one. A name whose module needs an optional
dependency that is not installed here is left out (it cannot be checked on this machine).
"""

from __future__ import annotations

import ast
import importlib
import re
import types
from pathlib import Path

import pytest

import pytest_kernelpro

PACKAGE_DIR = Path(pytest_kernelpro.__file__).resolve().parent
PACKAGE = "pytest_kernelpro"

FROM_IMPORT_TEXT = re.compile(
    r"^\s*from\s+(pytest_kernelpro(?:\.\w+)*)\s+import\s+\(?([\w\s,]+?)\)?\s*$", re.MULTILINE
)
DOTTED_TEXT = re.compile(r"\bpytest_kernelpro(?:\.[A-Za-z_]\w*)+")


class Unchecked(Exception):
    """The module needs an optional dependency missing on this machine."""


def _import(module: str) -> object:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith(PACKAGE):
            raise Unchecked(exc.name) from exc
        raise


def resolve(dotted: str, *, attribute: str | None = None) -> str | None:
    """None if `dotted` (and `attribute` of it) exists, else what is missing: the longest
    prefix that imports as a module, then attributes (or submodules) of it."""
    parts = [*dotted.split("."), *([attribute] if attribute else [])]
    obj = _import(parts[0])
    path = parts[0]
    for name in parts[1:]:
        if hasattr(obj, name):
            obj = getattr(obj, name)
        elif isinstance(obj, types.ModuleType):
            try:
                obj = _import(f"{path}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{path}.{name}":
                    return f"{path}.{name}: {exc}"
                return f"{path} has no {name}"
        else:
            return f"{path} has no {name}"
        path = f"{path}.{name}"
    return None


def _module_name(path: Path, package_dir: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def references(path: Path, package_dir: Path) -> list[tuple[int, str, str | None]]:
    """(line, module or dotted name, imported name or None) of the file's own-package names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name, is_package = _module_name(path, package_dir)
    package = name if is_package else name.rpartition(".")[0]
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.startswith(PACKAGE)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.startswith(PACKAGE):
                found += [(node.lineno, module, a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            for match in FROM_IMPORT_TEXT.finditer(text):
                for imported in match.group(2).replace("\n", " ").split(","):
                    imported = imported.split(" as ")[0].strip()
                    if imported:
                        found.append((node.lineno, match.group(1), imported))
            found += [(node.lineno, dotted, None) for dotted in DOTTED_TEXT.findall(text)]
    return found


def unresolved(package_dir: Path, files: list[Path] | None = None) -> list[str]:
    missing = []
    for path in files if files is not None else sorted(package_dir.rglob("*.py")):
        for line, dotted, attribute in references(path, package_dir):
            try:
                problem = resolve(dotted, attribute=attribute)
            except Unchecked:
                continue
            if problem is not None:
                where = path.relative_to(package_dir.parent)
                name = f"{dotted}.{attribute}" if attribute else dotted
                missing.append(f"{where}:{line}: {name} ({problem})")
    return missing


def test_every_name_the_package_imports_from_itself_exists() -> None:
    missing = unresolved(PACKAGE_DIR)
    assert not missing, "names that no longer exist:\n" + "\n".join(missing)


def test_every_name_the_benchmarks_import_from_the_package_exists() -> None:
    """The benches run on the GPU machine, where a renamed function costs a device call (the
    autotune bench once failed there on a name a restructure had moved)."""
    bench = PACKAGE_DIR.parent / "bench"
    if not bench.is_dir():
        pytest.skip("no bench/ beside the package (an installed copy)")
    missing = unresolved(PACKAGE_DIR, sorted(bench.rglob("*.py")))
    assert not missing, "names that no longer exist:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from pytest_kernelpro.record import NoSuchName\n", "NoSuchName"),
        ("def f():\n    import pytest_kernelpro.no_such_module\n", "no_such_module"),
        (
            "CODE = '''\nfrom pytest_kernelpro.profile.problem_loader import load_problem, Gone\n'''\n",
            "Gone",
        ),
        ('"""See `pytest_kernelpro.locate.load_problem`."""\n', "locate"),
        ("def f():\n    from pytest_kernelpro.record import KernelRecord\n", None),
        ('"""`pytest_kernelpro.record.KernelRecord.median_s`, `pytest_kernelpro.gate`."""\n', None),
        ('"""`pytest_kernelpro.record.KernelRecord.no_such_method`."""\n', "no_such_method"),
        ("CODE = 'from pytest_kernelpro.profile.problem_loader import load_problem'\n", None),
    ],
)
def test_finder_on_a_small_file(tmp_path: Path, source: str, expected: str | None) -> None:
    """The finder sees an import inside a function and one written as text for another
    process, and names what is missing."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "mod.py").write_text(source, encoding="utf-8")
    # References are read from the file; names resolve against the real package.
    found = []
    for _line, dotted, attribute in references(package / "mod.py", package):
        problem = resolve(dotted, attribute=attribute)
        if problem is not None:
            found.append(problem)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1, found
        assert expected in found[0], found
