"""One kernel item's path through the package, traced while it runs.

Saves a baseline of a project's kernels (by default `example_repo/test_kernels.py`), then
runs `pytest --kernelpro-check` against it with a profiler hook on for the first kernel item,
from its run protocol to its end, and counts what that item's code crosses:

- files: the package's modules entered at least once;
- stops: how many times the call path moves from one package file to another;
- returns: stops that come back to a file the path had already left;
- orchestrators: files with a function that itself calls functions of 3 or more other
  package files on this path (the files that sequence the stages, as opposed to the stages);

and, for the session as a whole, how many of the package's modules it imported (and whether
any is the optimizer's), and the package's modules and lines per part.

Usage (from the repository root, the package importable):
    python bench/item_path.py [--project example_repo] [--select test_kernels.py] [--json OUT]

Point it at an older checkout with `PYTHONPATH=<that checkout>` to compare before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ORCHESTRATOR_FANOUT = 3  # other package files one function must call to count as sequencing


class PathTracer:
    """A pytest plugin that traces the package's frames while the first kernel item runs."""

    def __init__(self, package_root: Path) -> None:
        self.package_root = str(package_root) + os.sep
        self.files_in_order: list[str] = []
        self.callees: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.item_name: str | None = None

    def _relative(self, filename: str) -> str | None:
        if not filename.startswith(self.package_root):
            return None
        return filename[len(self.package_root) :]

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = self._relative(frame.f_code.co_filename)
        if callee is None:
            return
        self.files_in_order.append(callee)
        # The nearest package frame above: the function that called into this file.
        caller = frame.f_back
        while caller is not None and self._relative(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is None:
            return
        caller_file = self._relative(caller.f_code.co_filename)
        if caller_file is not None and caller_file != callee:
            self.callees[(caller_file, caller.f_code.co_name)].add(callee)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        traced = self.item_name is None and type(item).__name__ == "KernelItem"
        if traced:
            self.item_name = item.nodeid
            sys.setprofile(self._profile)
        try:
            yield
        finally:
            if traced:
                sys.setprofile(None)

    def summary(self) -> dict[str, Any]:
        stops, returns, left, previous = 0, 0, set(), None
        for current in self.files_in_order:
            if current == previous:
                continue
            if previous is not None:
                stops += 1
                left.add(previous)
                if current in left:
                    returns += 1
            previous = current
        fanout: dict[str, int] = defaultdict(int)
        for (caller_file, _function), files in self.callees.items():
            fanout[caller_file] = max(fanout[caller_file], len(files))
        orchestrators = sorted(f for f, n in fanout.items() if n >= ORCHESTRATOR_FANOUT)
        files = sorted(set(self.files_in_order))
        return {
            "item": self.item_name,
            "files": len(files),
            "stops": stops,
            "returns": returns,
            "orchestrators": len(orchestrators),
            "orchestrator_files": {f: fanout[f] for f in orchestrators},
            "file_list": files,
        }


def package_sizes(package: Path) -> dict[str, dict[str, int]]:
    """Modules and lines per top-level part of the package (`.` for the top-level files)."""
    sizes: dict[str, dict[str, int]] = defaultdict(lambda: {"modules": 0, "lines": 0})
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        part = parts[0] if len(parts) > 1 else "."
        sizes[part]["modules"] += 1
        sizes[part]["lines"] += len(path.read_text(encoding="utf-8").splitlines())
    total = {"modules": sum(v["modules"] for v in sizes.values())}
    total["lines"] = sum(v["lines"] for v in sizes.values())
    return {**dict(sorted(sizes.items())), "total": total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default="example_repo")
    parser.add_argument("--select", default="test_kernels.py")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import pytest_kernelpro

    tracer = PathTracer(Path(pytest_kernelpro.__file__).resolve().parent)
    os.chdir(args.project)
    with tempfile.TemporaryDirectory() as scratch:
        common = [args.select, "-q", "-p", "no:cacheprovider", "--kernelpro-only"]
        common += ["--kernelpro-json", f"{scratch}/report.json"]
        baseline = f"{scratch}/baseline.yaml"
        pytest.main([*common, f"--kernelpro-save-baseline={baseline}"])  # not traced
        rc = pytest.main(
            [*common, "--kernelpro-check", f"--kernelpro-baseline={baseline}"], plugins=[tracer]
        )
    result = tracer.summary()
    result["pytest_exit"] = int(rc)
    package = Path(pytest_kernelpro.__file__).resolve().parent
    imported = sorted(n for n in sys.modules if n.split(".")[0] == "pytest_kernelpro")
    result["modules_imported_by_the_check_session"] = len(imported)
    result["optimizer_modules_imported"] = [
        n for n in imported if n.startswith("pytest_kernelpro.optimize")
    ]
    result["package"] = package_sizes(package)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
