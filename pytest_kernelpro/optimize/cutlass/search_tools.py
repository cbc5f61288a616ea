"""Code-search tools over the CUTLASS tree, for the Programmer Agent.

- `search` (search_cutlass): recursive grep with optional folder and glob scope; budgeted
  per iteration (`new_iteration()` refills it) so that the model converges on generating;
- `read_file` (read_cutlass_file): a line range of one file, numbered;
- `list_directory` (list_cutlass_directory): one folder's entries.

Reads and listings are unbudgeted. Every path is resolved (symlinks included) and must stay
inside the CUTLASS root: `..`, absolute paths outside it and symlinks that leave it are
refused with `CutlassToolError`. `tool_specs()` describes the tools as JSON schemas and
`dispatch()` runs one call by name, returning text (errors included) for the model.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError

TEXT_SUFFIXES = frozenset({
    ".h", ".hpp", ".hh", ".cuh", ".cu", ".cpp", ".cc", ".c", ".inl", ".py", ".md", ".txt",
    ".cmake", ".json", ".yaml", ".yml", ".rst",
})  # fmt: skip


class CutlassToolError(KernelproError):
    """A refused or failed tool call (path outside the root, budget spent, bad pattern)."""


@dataclass(frozen=True)
class Match:
    """One matching line."""

    path: str  # relative to the root, with "/"
    line: int
    text: str


@dataclass(frozen=True)
class SearchResult:
    """Matches of one search, and what is left of the budget."""

    pattern: str
    matches: tuple[Match, ...]
    truncated: bool
    files_scanned: int
    searches_left: int

    def render(self) -> str:
        """Text for the model: `path:line: text` per match."""
        head = f"{len(self.matches)} match(es) for {self.pattern!r} in {self.files_scanned} files"
        if self.truncated:
            head += " (truncated: narrow the path or glob)"
        head += f"; {self.searches_left} search(es) left this iteration"
        return "\n".join([head, *(f"{m.path}:{m.line}: {m.text}" for m in self.matches)])


@dataclass(frozen=True)
class FileExcerpt:
    """Lines `start`..`end` (1-based, inclusive) of a file."""

    path: str
    start: int
    end: int
    total_lines: int
    text: str

    def render(self) -> str:
        """Numbered lines with a header."""
        return f"{self.path} lines {self.start}-{self.end} of {self.total_lines}\n{self.text}"


@dataclass(frozen=True)
class DirEntry:
    """One entry of a listing."""

    name: str
    is_dir: bool
    size: int


class CutlassSearchTools:
    """The search/read/list tools, confined to `root` (see the module doc)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        search_budget: int = 8,
        max_results: int = 60,
        max_read_lines: int = 400,
        max_file_bytes: int = 2_000_000,
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise CutlassToolError(f"CUTLASS root {self.root} is not a directory")
        if search_budget < 0:
            raise CutlassToolError(f"search_budget={search_budget} must be >= 0")
        self.search_budget = search_budget
        self.max_results = max_results
        self.max_read_lines = max_read_lines
        self.max_file_bytes = max_file_bytes
        self.searches_used = 0

    @property
    def searches_left(self) -> int:
        """Searches still allowed in this iteration."""
        return max(0, self.search_budget - self.searches_used)

    def new_iteration(self) -> None:
        """Refill the search budget (call once per Programmer iteration)."""
        self.searches_used = 0

    # ------------------------------------------------------------------ confinement

    def resolve(self, path: str | os.PathLike[str] = ".") -> Path:
        """`path` (relative to the root, or absolute inside it) resolved; outside is refused."""
        raw = Path(path)
        candidate = raw if raw.is_absolute() else self.root / raw
        resolved = candidate.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise CutlassToolError(
                f"path {str(path)!r} is outside the CUTLASS root {self.root}; use a path "
                "relative to the root, e.g. 'include/cute/atom'"
            )
        return resolved

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    # ------------------------------------------------------------------ the tools

    def search(
        self,
        pattern: str,
        *,
        path: str = ".",
        glob: str | None = None,
        regex: bool = False,
        ignore_case: bool = False,
        max_results: int | None = None,
    ) -> SearchResult:
        """Grep `pattern` (a literal, or a regex with `regex=True`) under `path`."""
        if not pattern:
            raise CutlassToolError("search pattern is empty; give a symbol or phrase to find")
        if self.searches_used >= self.search_budget:
            raise CutlassToolError(
                f"search budget spent ({self.search_budget} searches this iteration); read or "
                "list files you already found (unbudgeted) and write the kernel"
            )
        flags = re.IGNORECASE if ignore_case else 0
        try:
            compiled = re.compile(pattern if regex else re.escape(pattern), flags)
        except re.error as exc:
            raise CutlassToolError(f"invalid regex {pattern!r}: {exc}") from None
        base = self.resolve(path)
        self.searches_used += 1
        limit = max_results or self.max_results
        matches: list[Match] = []
        scanned = 0
        truncated = False
        files = [base] if base.is_file() else self._walk(base, glob)
        for file in files:
            if file.stat().st_size > self.max_file_bytes:
                continue
            scanned += 1
            try:
                text = file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for number, line in enumerate(text.splitlines(), start=1):
                if compiled.search(line):
                    if len(matches) >= limit:
                        truncated = True
                        break
                    matches.append(Match(self._relative(file), number, line.strip()[:240]))
            if truncated:
                break
        return SearchResult(pattern, tuple(matches), truncated, scanned, self.searches_left)

    def _walk(self, base: Path, glob: str | None) -> list[Path]:
        files: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                file = Path(dirpath) / name
                if glob and not (
                    fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(self._relative(file), glob)
                ):
                    continue
                if not glob and file.suffix not in TEXT_SUFFIXES:
                    continue
                # A symlink inside the tree may point outside it: skip those silently.
                real = file.resolve()
                if self.root in real.parents and real.is_file():
                    files.append(file)
        return files

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> FileExcerpt:
        """Lines `start`..`end` (1-based, inclusive; at most `max_read_lines`), numbered."""
        file = self.resolve(path)
        if not file.is_file():
            raise CutlassToolError(f"{path!r} is not a file under the CUTLASS root")
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        total = len(lines)
        start = max(1, int(start))
        stop = total if end is None else min(total, int(end))
        stop = min(stop, start + self.max_read_lines - 1)
        if start > max(total, 1) or stop < start:
            raise CutlassToolError(f"line range {start}-{end} is outside {path!r} ({total} lines)")
        width = len(str(stop))
        text = "\n".join(f"{n:>{width}}  {lines[n - 1]}" for n in range(start, stop + 1))
        return FileExcerpt(self._relative(file), start, stop, total, text)

    def list_directory(self, path: str = ".") -> list[DirEntry]:
        """The entries of one folder, folders first, each sorted by name."""
        folder = self.resolve(path)
        if not folder.is_dir():
            raise CutlassToolError(f"{path!r} is not a directory under the CUTLASS root")
        entries = []
        for child in folder.iterdir():
            if child.name.startswith("."):
                continue
            is_dir = child.is_dir()
            entries.append(DirEntry(child.name, is_dir, 0 if is_dir else child.stat().st_size))
        return sorted(entries, key=lambda e: (not e.is_dir, e.name))

    # ------------------------------------------------------------------ tool-use glue

    @staticmethod
    def tool_specs() -> list[dict[str, Any]]:
        """JSON-schema descriptions of the tools (Anthropic tool-use format)."""
        path = {"type": "string", "description": "path relative to the CUTLASS root"}
        return [
            {
                "name": "search_cutlass",
                "description": "Recursive grep over the CUTLASS/CuTe sources (budgeted per "
                "iteration).",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "pattern": {"type": "string"},
                        "path": path,
                        "glob": {"type": "string", "description": "e.g. '*.hpp'"},
                        "regex": {"type": "boolean"},
                    },
                    "required": ["pattern"],
                },
            },
            {
                "name": "read_cutlass_file",
                "description": "Read a line range of one CUTLASS file.",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "path": path,
                        "start": {"type": "integer"},
                        "end": {"type": "integer"},
                    },
                    "required": ["path"],
                },
            },
            {
                "name": "list_cutlass_directory",
                "description": "List one CUTLASS directory.",
                "input_schema": {"type": "object", "properties": {"path": path}},
            },
        ]

    def dispatch(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run one tool call; errors come back as text starting with "error:"."""
        args = dict(arguments)
        try:
            if name == "search_cutlass":
                return self.search(
                    str(args.get("pattern", "")),
                    path=str(args.get("path") or "."),
                    glob=args.get("glob") or None,
                    regex=bool(args.get("regex", False)),
                ).render()
            if name == "read_cutlass_file":
                return self.read_file(
                    str(args.get("path", "")),
                    int(args.get("start") or 1),
                    None if args.get("end") is None else int(args["end"]),
                ).render()
            if name == "list_cutlass_directory":
                entries = self.list_directory(str(args.get("path") or "."))
                return "\n".join(
                    f"{e.name}/" if e.is_dir else f"{e.name}  ({e.size} bytes)" for e in entries
                )
        except (CutlassToolError, ValueError, TypeError) as exc:
            return f"error: {exc}"
        return f"error: unknown tool {name!r}; use search_cutlass, read_cutlass_file or list_cutlass_directory"
