"""Build a candidate's kernels before its sandbox worker starts, several candidates at once.

A candidate is Python source; its builds are `load_cuda(...)` / `build_cuda(...)` calls
(the fast path) and `load_inline(...)` calls (the full path, `extension.py`). `find_builds` reads them from the syntax tree without running anything: the source
argument must be a string literal, a module-level name bound to one (or a `+` of such), and
the keywords (`flags`, `cutlass`, `arch`, `name`) literals. A call it cannot resolve is
left to the worker, which builds it when the candidate's module runs (the same cache key,
only not in parallel).

`Prebuilder` compiles the builds of the N candidates of one expansion on a thread pool (each
compile is an nvcc process, so the threads run on separate cores) while the evaluator runs
the GPU part of the candidates that are ready; `wait(code)` blocks until one candidate's
builds are in the cache. A compile error is cached, so the worker reports it as that
candidate's build error; prebuilding never raises into the search.
"""

from __future__ import annotations

import ast
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.build.cache import BuildCache, BuildError

_BUILD_FUNCTIONS = frozenset({"load_cuda", "build_cuda"})
_LITERAL_KEYWORDS = ("name", "arch", "flags", "cutlass")
_INLINE_POSITIONAL = ("name", "cpp_sources", "cuda_sources")


@dataclass(frozen=True)
class BuildRequest:
    """One statically resolved fast-path build of a candidate."""

    source: str
    options: Mapping[str, Any] = field(default_factory=dict)  # name, arch, flags, cutlass
    line: int = 0
    kind: str = "cubin"  # "cubin" (load_cuda) or "extension" (load_inline: options = its kwargs)


class _Unresolved(Exception):
    pass


def _module_strings(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level `NAME = expr` bindings (a name bound twice is dropped: ambiguous)."""
    bound: dict[str, ast.expr] = {}
    twice: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                if target.id in bound:
                    twice.add(target.id)
                bound[target.id] = value
    return {k: v for k, v in bound.items() if k not in twice}


def _resolve(node: ast.expr, names: Mapping[str, ast.expr], depth: int = 0) -> Any:
    if depth > 20:
        raise _Unresolved
    if isinstance(node, ast.Name) and node.id in names:
        return _resolve(names[node.id], names, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _resolve(node.left, names, depth + 1), _resolve(node.right, names, depth + 1)
        if type(left) is not type(right) or not isinstance(left, (str, list, tuple)):
            raise _Unresolved
        return left + right
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_resolve(e, names, depth + 1) for e in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise _Unresolved from exc


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def find_builds(code: str) -> list[BuildRequest]:
    """The fast-path builds of a candidate that can be resolved without running it."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    names = _module_strings(tree)
    requests = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) == "load_inline":
            inline = _inline_request(node, names)
            if inline is not None:
                requests.append(inline)
            continue
        if not isinstance(node, ast.Call) or _called_name(node) not in _BUILD_FUNCTIONS:
            continue
        source_node = node.args[0] if node.args else None
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        source_node = source_node or keywords.get("source")
        if source_node is None:
            continue
        try:
            source = _resolve(source_node, names)
            options = {
                key: _resolve(keywords[key], names) for key in _LITERAL_KEYWORDS if key in keywords
            }
        except _Unresolved:
            continue
        if not isinstance(source, str) or (source.endswith(".cu") and "\n" not in source):
            continue  # a path: read by the worker, not guessed here
        requests.append(BuildRequest(source, options, getattr(node, "lineno", 0)))
    return requests


def _inline_request(call: ast.Call, names: Mapping[str, ast.expr]) -> BuildRequest | None:
    """A `load_inline(...)` call whose arguments are all literals that the cached path
    supports (see `extension.SUPPORTED_KEYWORDS`)."""
    from pytest_kernelpro.optimize.build.extension import SUPPORTED_KEYWORDS

    if len(call.args) > len(_INLINE_POSITIONAL):
        return None
    nodes = dict(zip(_INLINE_POSITIONAL, call.args, strict=False))
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg not in SUPPORTED_KEYWORDS:
            return None
        nodes[keyword.arg] = keyword.value
    if "cpp_sources" not in nodes or "name" not in nodes:
        return None
    try:
        values = {key: _resolve(node, names) for key, node in nodes.items()}
    except _Unresolved:
        return None
    if values.get("with_cuda") is False or not values.get("cuda_sources"):
        return None
    values.pop("verbose", None)
    values.pop("build_directory", None)
    values.pop("with_cuda", None)
    return BuildRequest("", values, getattr(call, "lineno", 0), kind="extension")


@dataclass
class PrebuildResult:
    """What prebuilding one candidate did."""

    seconds: float = 0.0  # wall time from submission to the last build's end (queue included)
    build_s: float = 0.0  # wall time of this candidate's builds (lookups, waits, compiles)
    compile_s: float = 0.0  # compile time of the builds this candidate caused (misses)
    builds: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # build errors (cached for the worker)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 4),
            "build_s": round(self.build_s, 4),
            "compile_s": round(self.compile_s, 4),
            "builds": self.builds,
            "errors": self.errors,
        }


class Prebuilder:
    """Compiles candidates' fast-path builds on a pool of threads (module doc)."""

    def __init__(self, cache: BuildCache, *, arch: str, jobs: int | None = None) -> None:
        self.cache = cache
        self.arch = arch
        self.jobs = jobs or max(1, min(8, os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="kp-build")
        self._pending: dict[str, Future[PrebuildResult]] = {}
        self._lock = threading.Lock()

    def submit(self, code: str) -> Future[PrebuildResult] | None:
        """Start building `code`'s resolvable builds; None when it has none."""
        requests = find_builds(code)
        if not requests:
            return None
        with self._lock:
            future = self._pending.get(code)
            if future is None:
                future = self._pool.submit(self._build_all, requests, time.monotonic())
                self._pending[code] = future
        return future

    def submit_many(self, codes: Sequence[str]) -> None:
        """Start building several candidates (one expansion)."""
        for code in codes:
            self.submit(code)

    def wait(self, code: str) -> PrebuildResult | None:
        """Block until `code`'s builds are done (submitting them if needed)."""
        future = self.submit(code)
        if future is None:
            return None
        try:
            return future.result()
        finally:
            with self._lock:
                self._pending.pop(code, None)

    def _build_all(self, requests: Sequence[BuildRequest], submitted: float) -> PrebuildResult:
        from pytest_kernelpro.optimize.build.api import build_cuda
        from pytest_kernelpro.optimize.build.extension import build_extension

        result = PrebuildResult()
        for request in requests:
            options = dict(request.options)
            began = time.monotonic()
            try:
                if request.kind == "extension":
                    # The sandbox worker builds under the profiler's capture, which adds its
                    # flags: the same flags here, or the worker would not find this entry.
                    from pytest_kernelpro.profile.capture import (
                        DEFAULT_CUDA_FLAGS,
                        merge_cuda_flags,
                    )

                    options["extra_cuda_cflags"] = merge_cuda_flags(
                        options.get("extra_cuda_cflags"), DEFAULT_CUDA_FLAGS
                    )
                    build: Any = build_extension(cache=self.cache, **options)
                else:
                    options.setdefault("arch", self.arch)
                    build = build_cuda(request.source, cache=self.cache, **options)
            except BuildError as exc:
                result.errors.append(exc.message)
                continue
            except (KernelproError, TypeError, ValueError, OSError) as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            finally:
                result.build_s += time.monotonic() - began
            record = build.record()
            record["line"] = request.line
            result.builds.append(record)
            if not build.hit:
                result.compile_s += build.compile_s
        result.seconds = time.monotonic() - submitted
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
