"""What a candidate could read of a project, printed for its owner to audit.

    python -m pytest_kernelpro.optimize.sandbox.audit [ROOT] [--entry FILE]... [--data PATTERN]...

ROOT (default: the working directory) is the project as the session would see it (its
rootdir); the entry files default to the test files under it that mention `kernelpro` (the
files that mark kernels). Printed: every project file a candidate sees and why
(`project_view.py`: the kernels' imports, their native sources, the data the ini names),
the files it named that are refused and why, and what else is bound back read-only (the
interpreter, this package, caches) and what is hidden. Exit status 0, or 2 for a ROOT that
is not a directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_kernelpro.optimize.sandbox import view
from pytest_kernelpro.optimize.sandbox.project_view import (
    DATA_INI_KEY,
    ini_data_patterns,
    project_view,
)
from pytest_kernelpro.profile.problem_loader import project_import_path

TEST_PATTERNS = ("test_*.py", "*_test.py")


def marking_files(root: Path, limit: int = 10_000) -> list[str]:
    """The test files under `root` that mention `kernelpro` (dot directories and virtual
    environments skipped), at most `limit` files looked at."""
    found, seen = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".")
            and d not in ("node_modules", "site-packages", "__pycache__")
            and not (Path(dirpath) / d / "pyvenv.cfg").exists()
        )
        for name in sorted(filenames):
            seen += 1
            if seen > limit:
                return found
            if not any(Path(name).match(p) for p in TEST_PATTERNS):
                continue
            path = os.path.join(dirpath, name)
            try:
                if "kernelpro" in Path(path).read_text(encoding="utf-8", errors="replace"):
                    found.append(path)
            except OSError:
                continue
    return found


def report(root: Path, entries: Sequence[str], data: Sequence[str]) -> list[str]:
    """The audit's lines (module doc)."""
    # The roots as the evaluator takes them: the project and this process's import path
    # entries that are not installed software.
    roots = [str(root), *project_import_path()]
    project = project_view(roots, entries=entries, data=data, rootdir=str(root))
    lines = [
        f"project {root}: a candidate sees {len(project.files)} of its files, read-only",
        f"entries: {', '.join(os.path.relpath(e, root) for e in entries) or 'none found'}",
        f"data ({DATA_INI_KEY}): {' '.join(data) or 'none'}",
        "",
        "shown:",
    ]
    for path, why in project.files.items():
        lines.append(f"  {_rel(path, root)}  ({why})")
    if project.refused:
        lines += ["", "named but not shown:"]
        for path, why in sorted(project.refused.items()):
            lines.append(f"  {_rel(path, root)}  ({why})")
    if project.cut:
        lines.append("(cut: more files than the view holds)")
    hidden = view.hidden_roots(os.environ.get("HOME", ""))
    hide, needed, _ = view.with_project(hidden, view.needed_paths(), project.roots, ())
    lines += ["", "besides the system directories, also shown read-only (not the project):"]
    lines += [f"  {p}" for p in view.shown_paths(needed, hide)]
    lines += ["", "hidden (empty):"] + [f"  {p}" for p in hide]
    return lines


def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root.resolve()))
    except ValueError:
        return path


def main(argv: list[str]) -> int:
    """show what an optimizer candidate could read of a project (`kernelpro sandbox --show`)"""
    parser = argparse.ArgumentParser(
        prog="kernelpro sandbox", description="What a candidate could read of a project."
    )
    parser.add_argument("--show", action="store_true", help="print the view (the one action)")
    parser.add_argument("root", nargs="?", default=".", type=Path)
    parser.add_argument("--entry", action="append", default=[], help="a file that marks a kernel")
    parser.add_argument("--data", action="append", default=[], help=f"as {DATA_INI_KEY}")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not root.is_dir():
        sys.stderr.write(f"kernelpro sandbox --show: {args.root} is not a directory\n")
        return 2
    entries = [str(Path(e).resolve()) for e in args.entry] or marking_files(root)
    data = [*ini_data_patterns(str(root)), *args.data]
    sys.stdout.write("\n".join(report(root, entries, data)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
