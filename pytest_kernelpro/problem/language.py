"""Which language a kernel is written in: `pytorch`, `triton` or `cuda`.

A kernel is often a thin call into a library (`LigerSiLUMulFunction.apply(a, b)`), so its own
source is only the first place to look: then the modules it imports in its own code, the
modules and functions it names, and the compiled kernel objects its code reaches a few calls
deep. The language decides where a kernel can run (Triton and CUDA need a GPU) and what the
optimizer's prompts ask for.
"""

from __future__ import annotations

import functools
import inspect
import mmap
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
# kernel -> layer object -> its forward -> autograd.Function -> forward -> launcher -> helper
# module -> @triton.jit kernel, with room to spare
_REACH_DEPTH = 10
_MAX_VISITED = 4000  # objects looked at in one walk: a large model's graph ends the walk
_MAX_ITEMS = 256  # elements of one container (a ModuleList, a dict of kernels) looked at
# nvcc's marks in a shared object: the fat binary section and the registration call.
_DEVICE_CODE_MARKS = (b".nv_fatbin", b"__cudaRegisterFatBinary")
_SCAN_BYTES = 512 * 1024 * 1024  # read no further into one extension file


def _compiled_language(value: Any) -> str | None:
    """`"triton"` for a Triton kernel object (`@triton.jit`, `@triton.autotune` and
    `@triton.heuristics` all make `triton.runtime` objects), `"cuda"` for a compiled extension
    module (or one of its functions) that carries device code, else None."""
    type_module = getattr(type(value), "__module__", "") or ""
    if type_module.split(".")[0] == "triton":
        return "triton"
    return "cuda" if _extension_has_device_code(value) else None


def _extension_has_device_code(value: Any) -> bool:
    """A compiled extension module (a `load_inline`/`CUDAExtension` build), or a builtin
    function of one, whose shared object holds nvcc's device code (`_DEVICE_CODE_MARKS`)."""
    import importlib.machinery

    if inspect.ismodule(value):
        module = value
    elif inspect.isbuiltin(value):
        # A module-level function of an extension is bound to its module.
        owner = getattr(value, "__self__", None)
        module = (
            owner
            if inspect.ismodule(owner)
            else sys.modules.get(getattr(value, "__module__", None) or "")
        )
    else:
        return False
    name = getattr(module, "__name__", "") or ""
    file = getattr(module, "__file__", None)
    if not file or name.split(".")[0] in _LIBRARY_ROOTS:
        return False
    if not str(file).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        return False
    return _has_device_code(str(file))


@functools.lru_cache(maxsize=256)
def _has_device_code(path: str) -> bool:
    try:
        with (
            open(path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            return any(data.find(mark, 0, _SCAN_BYTES) != -1 for mark in _DEVICE_CODE_MARKS)
    except (OSError, ValueError):  # unreadable, or empty (an empty file cannot be mapped)
        return False


def _is_library(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return isinstance(module, str) and module.split(".")[0] in _LIBRARY_ROOTS


def _code_of(value: Any) -> list[Any]:
    """The functions whose code a reference to `value` runs: a function (unwrapped past
    decorators such as `functools.wraps` wrappers), or a class's own methods (an
    `autograd.Function`'s `forward`, an `nn.Module`'s `forward` and helpers)."""
    if inspect.isclass(value):
        if _is_library(value):
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


def _items(container: Any) -> list[Any]:
    if isinstance(container, dict):
        return list(container.values())[:_MAX_ITEMS]
    if isinstance(container, (list, tuple, set, frozenset)):
        return list(container)[:_MAX_ITEMS]
    return []


def _held_by(value: Any) -> list[Any]:
    """What an object's calls can reach besides its code: a layer object's class methods,
    its attributes (a kernel kept as `self.kernel`, child modules in `_modules`, one level
    into their containers), a `functools.partial`'s function and arguments, a bound
    method's object. Tensors and other objects of the library roots hold no user code,
    but a torch container (`nn.Sequential`, `nn.ModuleList`) holds user layers."""
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if inspect.ismethod(value):
        return [value.__self__]
    if inspect.isclass(value) or inspect.isroutine(value) or inspect.ismodule(value):
        return []
    if type(value).__module__ == "torch" or isinstance(value, (str, bytes, int, float)):
        return []  # tensors, dtypes, devices and plain values
    held = [] if _is_library(type(value)) else _code_of(type(value))
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        for attribute in list(attributes.values())[:_MAX_ITEMS]:
            held.append(attribute)
            held += _items(attribute)
    return held


def _reached_language(obj: Any) -> str | None:
    """The language of the compiled kernels `obj`'s code reaches through the names it uses,
    a few calls deep: `LigerSiLUMulFunction.apply(a, b)` in a test module reaches
    `swiglu_forward` in the library and through it a `@triton.jit` kernel object, although
    no source on the way up names Triton. The walk follows functions, classes (their methods)
    and objects (a module-level layer instance, its children and attributes)."""
    seen: set[int] = set()
    frontier: list[Any] = _code_of(obj) or [obj]
    for _ in range(_REACH_DEPTH):
        following: list[Any] = []
        for value in frontier:
            if value is None or id(value) in seen:
                continue
            if len(seen) >= _MAX_VISITED:
                return None
            seen.add(id(value))
            found = _compiled_language(value)
            if found:
                return found
            if inspect.isfunction(value):
                following += _reached_by_function(value)
            elif inspect.isclass(value):
                following += _code_of(value)
            elif inspect.ismethod(value):
                following += [*_code_of(value), value.__self__]
            else:
                following += _held_by(value)
        frontier = following
        if not frontier:
            break
    return None


def _reached_by_function(function: Any) -> list[Any]:
    """The objects a function's code names: its globals, closures, and for an imported
    helper module the attributes the code reads of it (`ops.norm_forward(x)`)."""
    function = inspect.unwrap(function)
    if _is_library(function):
        return []
    namespace = getattr(function, "__globals__", {})
    code = getattr(function, "__code__", None)
    names = list(getattr(code, "co_names", ()))
    for constant in getattr(code, "co_consts", ()):
        names += getattr(constant, "co_names", ())  # names a nested function uses
    values: list[Any] = [namespace.get(name) for name in names]
    values += [
        cell.cell_contents
        for cell in getattr(function, "__closure__", None) or ()
        if _cell_filled(cell)
    ]
    reached = []
    for value in values:
        if value is None:
            continue
        reached.append(value)
        if inspect.ismodule(value) and not _is_library_module(value):
            attributes = vars(value)
            reached += [attributes[name] for name in names if name in attributes]
    return reached


def _is_library_module(module: Any) -> bool:
    return (getattr(module, "__name__", "") or "").split(".")[0] in _LIBRARY_ROOTS


def _cell_filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def detect_language_of(obj: Any) -> str:
    """The language of a kernel callable, looked for in the order of the module docstring
    (`triton_kernels.softmax(x)` -> "triton")."""
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
