"""Which language a kernel is written in: `pytorch`, `triton` or `cuda`.

A kernel is often a thin call into a library (`LigerSiLUMulFunction.apply(a, b)`), so its own
source is only the first place to look: then the modules it imports in its own code, the
modules and functions it names, and the compiled kernel objects its code reaches a few calls
deep. The language decides where a kernel can run (Triton and CUDA need a GPU) and what the
optimizer's prompts ask for.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any


def detect_language(source_text: str) -> str:
    """Best guess of the kernel language from its defining module's source."""
    if re.search(r"@triton\.jit|import triton|from triton", source_text):
        return "triton"
    if re.search(r"load_inline|cpp_extension|__global__", source_text):
        return "cuda"
    return "pytorch"


def _source_of(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _local_import_sources(obj: Any, own: str) -> list[str]:
    """Sources of the modules imported inside `obj`'s own code (`from .kernelpro_x import
    ...` in a function body, as a patch writes it), and of sibling `*.py` files it names."""
    import ast
    import importlib.util
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(own))
    except SyntaxError:
        return []
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    package = getattr(module, "__package__", None) or None
    module_file = getattr(module, "__file__", None)
    names: list[str] = []
    files: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            dotted = "." * node.level + (node.module or "")
            try:
                names.append(importlib.util.resolve_name(dotted, package) if node.level else dotted)
            except (ImportError, ValueError):
                continue
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.endswith(".py")
            and module_file
        ):
            files.append(Path(module_file).with_name(Path(node.value).name))
    sources = []
    for name in names:
        if name.split(".")[0] in ("torch", "numpy", "math", "importlib", "pathlib"):
            continue
        loaded = sys.modules.get(name)
        if loaded is not None:
            sources.append(_source_of(loaded))
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            files.append(Path(spec.origin))
    for file in files:
        try:
            sources.append(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return sources


_LIBRARY_ROOTS = frozenset({"torch", "numpy", "math", "builtins", "functools", "typing"})
# kernel -> autograd.Function -> forward -> launcher -> @triton.jit kernel, with room to spare
_REACH_DEPTH = 6


def _compiled_language(value: Any) -> str | None:
    """`"triton"` for a Triton kernel object (`@triton.jit`, `@triton.autotune`,
    `@triton.heuristics` all make objects of `triton.runtime` types), else None."""
    type_module = getattr(type(value), "__module__", "") or ""
    return "triton" if type_module.split(".")[0] == "triton" else None


def _code_of(value: Any) -> list[Any]:
    """The functions whose code a reference to `value` runs: a function (unwrapped past
    decorators such as `functools.wraps` wrappers), or a class's own methods (an
    `autograd.Function`'s `forward`, an `nn.Module`'s `forward` and helpers)."""
    if inspect.isclass(value):
        if (getattr(value, "__module__", "") or "").split(".")[0] in _LIBRARY_ROOTS:
            return []
        members = []
        for attribute in vars(value).values():
            if isinstance(attribute, (staticmethod, classmethod)):
                attribute = attribute.__func__
            if inspect.isfunction(attribute):
                members.append(attribute)
        return members
    if inspect.isfunction(value) or inspect.ismethod(value):
        return [inspect.unwrap(value)]
    return []


def _reached_language(obj: Any) -> str | None:
    """The language of the compiled kernels `obj`'s code reaches through the names it uses,
    a few calls deep: `LigerSiLUMulFunction.apply(a, b)` in a test module reaches
    `swiglu_forward` in the library and through it a `@triton.jit` kernel object, although
    no source on the way up names Triton."""
    seen: set[int] = set()
    frontier = _code_of(obj)
    for _ in range(_REACH_DEPTH):
        following: list[Any] = []
        for function in frontier:
            if id(function) in seen:
                continue
            seen.add(id(function))
            module = (getattr(function, "__module__", "") or "").split(".")[0]
            if module in _LIBRARY_ROOTS:
                continue
            namespace = getattr(function, "__globals__", {})
            code = getattr(function, "__code__", None)
            names = list(getattr(code, "co_names", ()))
            for constant in getattr(code, "co_consts", ()):
                names += getattr(constant, "co_names", ())  # names a nested function uses
            closure = [
                cell.cell_contents
                for cell in getattr(function, "__closure__", None) or ()
                if _cell_filled(cell)
            ]
            for value in [namespace.get(name) for name in names] + closure:
                if value is None:
                    continue
                found = _compiled_language(value)
                if found:
                    return found
                following += _code_of(value)
        frontier = following
        if not frontier:
            break
    return None


def _cell_filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def detect_language_of(obj: Any) -> str:
    """The language of a kernel callable: its own source, then the modules it imports in
    its own code, then the modules and functions its code refers to (one level), e.g.
    `triton_kernels.softmax(x)` -> "triton", then the Triton kernels its code reaches
    through library calls (`_reached_language`)."""
    own = _source_of(obj)
    found = detect_language(own)
    if found != "pytorch":
        return found
    for source in _local_import_sources(obj, own):
        found = detect_language(source)
        if found != "pytorch":
            return found
    target = obj.forward if inspect.isclass(obj) and hasattr(obj, "forward") else obj
    code = getattr(target, "__code__", None)
    namespace = getattr(target, "__globals__", {})
    for name in getattr(code, "co_names", ()):
        ref = namespace.get(name)
        if inspect.ismodule(ref) or inspect.isfunction(ref):
            if inspect.ismodule(ref) and ref.__name__.split(".")[0] in ("torch", "numpy", "math"):
                continue
            found = detect_language(_source_of(ref))
            if found != "pytorch":
                return found
    return _reached_language(obj) or "pytorch"
