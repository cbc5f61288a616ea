"""What a candidate sees of the project: the files its import needs, and nothing else.

The rule (docs/sandbox.md states it for users; `audit.py` prints it for a repository):

- the project is every directory of the session's import path that is not installed
  software (the rootdir, conftest insertions, the `pythonpath` ini, a src/ layout), and the
  directory of each entry file (the test file that marks the kernel);
- shown are the entry files, and every project module they import, transitively:
  `import a.b`, `from a import b`, relative imports, and `importlib.import_module` /
  `__import__` with a literal name, resolved against the project's directories as Python
  would (`a/b.py`, `a/b/__init__.py`, `a/b.*.so`), with each package's `__init__.py`;
- beside each shown module: its compiled bytecode (`__pycache__/<name>.*.pyc`) and the
  native sources and libraries of its directory (`NATIVE_SUFFIXES`: what
  `load_inline`/`load`/`ctypes` read by path);
- the data files the project names (`kernelpro_sandbox_data` in the pytest ini: paths or
  glob patterns relative to the rootdir, a directory meaning every file under it);
- never, whatever the rules above would take: a path with a component starting with "."
  (`.git`, `.env`, `.venv`, `.ssh`, any dotfile), anything inside a virtual environment (a
  directory holding `pyvenv.cfg`), `site-packages`, `node_modules`, and anything but a
  regular file (links are not followed);
- at most `MAX_FILES` files (a bigger closure is cut there, and says so).

So a configuration file (`settings_local.py`, `prod.tfvars`, `pip.conf`), the git history
and a submodule's `.git/modules` are not there at all, whatever their names, unless the
kernel's own import reaches a Python module (then it is code the kernel runs). Computed once
per session (`project_view`, cached by its inputs; `task_project_view`: an optimizer task's).
"""

from __future__ import annotations

import ast
import glob
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask
from pytest_kernelpro.profile.problem_loader import project_import_path

MAX_FILES = 2000
NATIVE_SUFFIXES = (
    ".cu",
    ".cuh",
    ".h",
    ".hh",
    ".hpp",
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".inl",
    ".so",
)
NEVER_DIRS = frozenset({"site-packages", "dist-packages", "node_modules", "__pypackages__"})
DATA_INI_KEY = "kernelpro_sandbox_data"


@dataclass(frozen=True)
class ProjectView:
    """The project files a candidate sees (module doc), with why each is there."""

    roots: tuple[str, ...]  # the project's directories (real paths)
    files: dict[str, str] = field(default_factory=dict)  # real path -> why it is shown
    refused: dict[str, str] = field(default_factory=dict)  # named but not shown -> why
    cut: bool = False  # the closure passed MAX_FILES


def refusal(path: str, roots: Sequence[str]) -> str | None:
    """Why `path` is never shown (module doc), or None."""
    real = Path(path)
    base = next((r for r in roots if _under(path, r)), None)
    parts = real.relative_to(base).parts if base else real.parts
    for part in parts:
        if part.startswith("."):
            return f"a dot path ({part})"
        if part in NEVER_DIRS:
            return f"installed software ({part})"
    directory = real.parent
    stop = Path(base) if base else Path(real.anchor)
    while True:
        if (directory / "pyvenv.cfg").exists():
            return f"inside a virtual environment ({directory})"
        if directory == stop or directory.parent == directory:
            break
        directory = directory.parent
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class _Closure:
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = list(roots)
        self.files: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self.todo: list[str] = []
        self.cut = False

    def add(self, path: str, why: str) -> bool:
        if os.path.islink(path):  # a link's target is not what the import named
            self.refused[os.path.abspath(path)] = "a symbolic link"
            return False
        real = os.path.realpath(path)
        if real in self.files or real in self.refused:
            return real in self.files
        reason = refusal(real, self.roots)
        if reason is not None:
            self.refused[real] = reason
            return False
        if len(self.files) >= MAX_FILES:
            self.cut = True
            return False
        self.files[real] = why
        if real.endswith(".py"):
            self.todo.append(real)
            self._beside(real)
        return True

    def _beside(self, module: str) -> None:
        directory, name = os.path.split(module)
        stem = name[: -len(".py")]
        for pyc in glob.glob(os.path.join(glob.escape(directory), "__pycache__", stem + ".*.pyc")):
            self.add(pyc, f"bytecode of {module}")
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for other in names:
            if other.endswith(NATIVE_SUFFIXES):
                self.add(os.path.join(directory, other), f"native source beside {module}")

    def module(self, dotted: str, why: str, search: Sequence[str]) -> None:
        """Add the files of `dotted` (and its packages' __init__.py) found on `search`."""
        parts = [p for p in dotted.split(".") if p]
        if not parts:
            return
        for root in search:
            base = root
            found = True
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                package = os.path.join(base, part)
                if os.path.isdir(package):
                    init = os.path.join(package, "__init__.py")
                    if os.path.isfile(init):
                        self.add(init, why)
                    base = package
                    continue
                if last:
                    hits = [os.path.join(base, part + ".py")] + glob.glob(
                        os.path.join(glob.escape(base), glob.escape(part) + ".*.so")
                    )
                    hits = [h for h in hits if os.path.isfile(h)]
                    for hit in hits:
                        self.add(hit, why)
                    found = bool(hits)
                else:
                    found = False
                break
            if found:
                return

    def imports_of(self, source: str, filename: str) -> None:
        try:
            tree = ast.parse(source, filename=filename)
        except (SyntaxError, ValueError):
            return
        why = f"imported by {filename}"
        here = os.path.dirname(filename) if os.path.isabs(filename) else ""
        search = [*([here] if here else []), *self.roots]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.module(alias.name, why, search)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    if not here:
                        continue
                    base = here
                    for _ in range(node.level - 1):
                        base = os.path.dirname(base)
                    dotted_search: Sequence[str] = [base]
                else:
                    dotted_search = search
                stem = node.module or ""
                if stem:
                    self.module(stem, why, dotted_search)
                for alias in node.names:  # `from a import b`: b may be a submodule
                    if alias.name != "*":
                        self.module(
                            f"{stem}.{alias.name}" if stem else alias.name, why, dotted_search
                        )
            elif isinstance(node, ast.Call) and _literal_import(node):
                self.module(node.args[0].value, why, search)  # type: ignore[attr-defined]

    def run(self) -> None:
        while self.todo:
            path = self.todo.pop()
            try:
                source = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            self.imports_of(source, path)


def _literal_import(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (
        name in ("import_module", "__import__")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def data_files(rootdir: str, patterns: Iterable[str]) -> list[str]:
    """The files the patterns name (relative to `rootdir`; a directory: every file under
    it, links not followed)."""
    out: list[str] = []
    for pattern in patterns:
        pattern = pattern.strip()
        if not pattern:
            continue
        full = pattern if os.path.isabs(pattern) else os.path.join(rootdir, pattern)
        for hit in sorted(glob.glob(full, recursive=True)):
            if os.path.isdir(hit) and not os.path.islink(hit):
                for dirpath, dirnames, filenames in os.walk(hit):
                    dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                    out += [os.path.join(dirpath, f) for f in filenames]
            else:
                out.append(hit)
    return out


_CACHE: dict[tuple[object, ...], ProjectView] = {}


def project_view(
    roots: Sequence[str],
    entries: Sequence[str] = (),
    sources: Sequence[str] = (),
    data: Sequence[str] = (),
    rootdir: str | None = None,
) -> ProjectView:
    """The files shown of the project (module doc): `roots` its directories, `entries` the
    files whose imports define it, `sources` texts whose imports count too (the task's
    reference), `data` the ini's patterns (relative to `rootdir`). Cached by its inputs."""
    real_roots = tuple(
        dict.fromkeys(
            os.path.realpath(r)
            for r in [*roots, *(os.path.dirname(os.path.abspath(e)) for e in entries)]
            if r and os.path.isdir(r) and os.path.realpath(r) != "/"
        )
    )
    key = (real_roots, tuple(entries), tuple(sources), tuple(data), rootdir)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    closure = _Closure(real_roots)
    for entry in entries:
        closure.add(entry, "entry (the file that marks the kernel)")
    for k, source in enumerate(sources):
        closure.imports_of(source, f"<task source {k + 1}>")
    for path in data_files(rootdir or (real_roots[0] if real_roots else "."), data):
        closure.add(path, f"data ({DATA_INI_KEY})")
    closure.run()
    view = ProjectView(
        real_roots, dict(sorted(closure.files.items())), closure.refused, closure.cut
    )
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[key] = view
    return view


def ini_data_patterns(rootdir: str) -> tuple[str, ...]:
    """`kernelpro_sandbox_data` of the rootdir's pytest configuration, read from the first
    file pytest itself would take (pytest.ini, pyproject.toml, tox.ini, setup.cfg): one
    pattern per line or separated by spaces."""
    root = Path(rootdir)
    value: object = None
    for name, section in (
        ("pytest.ini", "pytest"),
        ("pyproject.toml", None),
        ("tox.ini", "pytest"),
        ("setup.cfg", "tool:pytest"),
    ):
        path = root / name
        if not path.is_file():
            continue
        try:
            if section is None:
                try:
                    import tomllib
                except ImportError:  # Python 3.10: pytest's own dependency there
                    import tomli as tomllib

                table = tomllib.loads(path.read_text(encoding="utf-8"))
                options = table.get("tool", {}).get("pytest", {}).get("ini_options")
                if options is None:
                    continue
                value = options.get(DATA_INI_KEY)
            else:
                import iniconfig

                ini = iniconfig.IniConfig(str(path))
                if section not in ini:
                    continue
                value = ini[section].get(DATA_INI_KEY)
        except Exception:  # a broken file is pytest's to report, not the sandbox's
            return ()
        break
    if isinstance(value, list):
        return tuple(str(v) for v in value if str(v).strip())
    return tuple(str(value or "").split())


_SESSION: list[ProjectView] = []


def set_session_view(view: ProjectView) -> None:
    """Make `view` what every sandbox of this process shows of the project (the evaluator
    registers its task's view; the profiler and re-measurement workers use it too)."""
    _SESSION[:] = [view]


def session_view() -> ProjectView | None:
    return _SESSION[0] if _SESSION else None


def task_project_view(task: KernelBenchTask) -> ProjectView:
    """The project view of `task` (`project_view`): the project is the working directory
    and the import path entries of the task and of this process that are not installed
    software; its imports are the entry files' and the reference's."""
    cwd = os.getcwd()
    roots = [cwd, *project_import_path(task.sys_path), *project_import_path()]
    return project_view(
        roots,
        entries=task.view_entries,
        sources=(task.reference,),
        data=task.sandbox_data,
        rootdir=task.rootdir or cwd,
    )


__all__ = [
    "DATA_INI_KEY",
    "MAX_FILES",
    "NATIVE_SUFFIXES",
    "ProjectView",
    "data_files",
    "ini_data_patterns",
    "project_view",
    "session_view",
    "set_session_view",
    "task_project_view",
    "refusal",
]
