"""Clocks and serialization, bound before any kernel code runs.

A kernel may rebind `time.perf_counter`, wrap `json.dumps` or patch
`torch.cuda.Event.elapsed_time`. This module, imported by the plugin at load and by the
sandbox worker before the candidate, keeps the function objects it found then (a kept object
runs the original code whatever the name points to later), and so does each of the plugin's
timing modules' namespace (`keep_module`). `intact`/`binding_failure` run around every sample
and name every rebound name with the module that made it (`patcher_of`, remembered in
`patchers`): its kernels are refused, others are timed on the originals put back (the CUDA
timer's events: `timing.cuda.CudaEvents`). Standard library only at import.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

# The kept originals (module, attribute name, function object).
perf_counter: Callable[[], float] = time.perf_counter
perf_counter_ns: Callable[[], int] = time.perf_counter_ns
monotonic: Callable[[], float] = time.monotonic
process_time: Callable[[], float] = time.process_time
thread_time: Callable[[], float] = time.thread_time  # the CPU anchor's on-CPU time
os_pread: Callable[[int, int, int], bytes] = os.pread  # its run-queue wait (schedstat)
json_dumps: Callable[..., str] = json.dumps
os_urandom: Callable[[int], bytes] = os.urandom  # which timed calls are checked
_os_write = os.write
_os_open = os.open
_os_close = os.close
_os_fsync = os.fsync
_os_replace = os.replace

_KEPT_VALUES = (perf_counter, perf_counter_ns, monotonic, process_time, thread_time, os_pread)
_KEPT_VALUES += (json_dumps, os_urandom, _os_write, _os_open, _os_close, _os_fsync, _os_replace)


def _describe(value: Any) -> str:
    module = getattr(value, "__module__", None) or "?"
    name = getattr(value, "__qualname__", None) or type(value).__name__
    return f"{module}.{name}"


# torch's timing functions and what the timed calls' checks and content run (`torch.equal =
# lambda a, b: True` would pass every output), checked by where their code lives (torch may
# be imported later): a file inside the torch package.
_TORCH_TIMING = tuple(
    ("torch.cuda", path)
    for path in "Event.elapsed_time Event.record Event.synchronize synchronize current_stream".split()
) + tuple(("torch", path) for path in "equal lerp where isfinite allclose isclose".split())
_TORCH_DIR = f"{os.sep}torch{os.sep}"


def _torch_own(value: Any) -> bool:
    """Whether `value` is torch's own: Python code from a file inside the torch package, or
    a C function torch defines (a builtin whose module is torch's)."""
    code = getattr(value, "__code__", None)
    if code is not None:
        return _TORCH_DIR in code.co_filename
    module = getattr(value, "__module__", None)
    return type(value).__name__ == "builtin_function_or_method" and (
        module is None or str(module).startswith("torch")
    )


# The torch functions seen intact, by (module, path): (owner object, attribute, function),
# so `restore` can put them back after a kernel replaced them.
_TORCH_KEPT: dict[tuple[str, str], tuple[Any, str, Any]] = {}


class Kept:
    """Kept objects as parallel lists (owners, names, values, where kept), so one `map` of
    `getattr` (or `dict.get` on namespaces) compares them all in C."""

    def __init__(self, by_dict: bool) -> None:
        self.by_dict = by_dict
        self.owners: list[Any] = []
        self.names: list[str] = []
        self.values: list[Any] = []
        self.where: list[str] = []

    def add(self, where: str, owner: Any, name: str, value: Any) -> None:
        self.owners.append(owner)
        self.names.append(name)
        self.values.append(value)
        self.where.append(where)

    def extend(self, rows: list[tuple[str, Any, str, Any]]) -> None:
        """Add (where, owner, name, value) rows."""
        if rows:
            where, owners, names, values = zip(*rows, strict=True)
            self.where.extend(where)
            self.owners.extend(owners)
            self.names.extend(names)
            self.values.extend(values)

    def absent(self, where: str, namespace: dict[str, Any], names: Iterable[str]) -> None:
        """Keep `names` as absent from `namespace` (a `by_dict` group): setting one fails."""
        self.extend([(where, namespace, name, _MISSING) for name in names])

    def clear(self) -> None:
        for part in (self.owners, self.names, self.values, self.where):
            part.clear()

    def currents(self) -> Any:
        """What each kept name holds now (`_MISSING` where a name is gone), lazily."""
        if self.by_dict:
            return map(dict.get, self.owners, self.names, repeat(_MISSING))
        return map(getattr, self.owners, self.names, repeat(_MISSING))

    def put_back(self) -> None:
        for owner, name, value in zip(self.owners, self.names, self.values, strict=True):
            if self.by_dict:
                owner[name] = value
            else:
                setattr(owner, name, value)


_MISSING = object()
# The standard library's kept functions; the timing modules' names (`_NAMESPACES`) and their
# functions' code and defaults and classes' methods (`_ATTRIBUTES`), by `keep_module`.
_STDLIB = Kept(by_dict=False)
_KEPT_NAMES = (
    "time.perf_counter time.perf_counter_ns time.monotonic time.process_time time.thread_time "
    "os.pread json.dumps os.urandom os.write os.open os.close os.fsync os.replace"
).split()
for _path, _value in zip(_KEPT_NAMES, _KEPT_VALUES, strict=True):
    _module_name, _attr = _path.split(".")
    _STDLIB.add(_module_name, sys.modules[_module_name], _attr, _value)
_NAMESPACES = Kept(by_dict=True)
_ATTRIBUTES = Kept(by_dict=False)
# Every link from `sys.modules` to each torch timing function seen intact, rebuilt by
# `_torch_tampered`: while all are the same objects, so are the functions.
_TORCH_MODULES = Kept(by_dict=True)
_TORCH_LINKS = Kept(by_dict=False)
_ALL_KEPT = (_STDLIB, _NAMESPACES, _ATTRIBUTES, _TORCH_MODULES, _TORCH_LINKS)
_torch_pending: list[str] = [name for name, _path in _TORCH_TIMING]  # modules not seen yet
_torch_clean = [False]  # the links were built by a `_torch_tampered` that found nothing


def _torch_tampered() -> list[str]:
    """torch timing functions whose code no longer comes from torch's own files (the ones
    seen intact are kept for `restore`, their links for `intact`)."""
    found = []
    modules: list[tuple[str, Any, str, Any]] = []
    links: list[tuple[str, Any, str, Any]] = []
    _TORCH_MODULES.clear()
    _TORCH_LINKS.clear()
    _torch_pending.clear()
    for module_name, path in _TORCH_TIMING:
        owner: Any = sys.modules.get(module_name)
        if owner is None:
            _torch_pending.append(module_name)
            continue
        modules.append((module_name, sys.modules, module_name, owner))
        *parents, attr = path.split(".")
        for part in parents:
            parent, owner = owner, getattr(owner, part, None)
            links.append((module_name, parent, part, owner))
        value = getattr(owner, attr, None)
        links.append((module_name, owner, attr, value))
        if not _torch_own(value):
            patcher = patcher_of(value)
            part = f"{module_name}.{path} (now {_describe(value)}, made by {patcher})"
            patchers[_module_key(patcher)] = part
            found.append(part)
        else:
            _TORCH_KEPT.setdefault((module_name, path), (owner, attr, value))
    _TORCH_MODULES.extend(modules)
    _TORCH_LINKS.extend(links)
    _torch_clean[0] = not found
    return found


def intact(*extra: Kept) -> bool:
    """Every kept name, torch timing function and name of the `extra` groups (a timer's
    `Seal`) still the kept object: the per-sample check, compared in C. False sends the
    caller to `binding_failure`."""
    if not _torch_clean[0] or any(map(sys.modules.__contains__, _torch_pending)):
        return False
    try:
        for kept in _ALL_KEPT + extra:
            read = dict.get if kept.by_dict else getattr
            currents = map(read, kept.owners, kept.names, repeat(_MISSING))
            if any(map(operator.is_not, currents, kept.values)):
                return False
    except Exception:  # a kept owner made unreadable: the slow path names it
        return False
    return True


def keep_module(module: Any) -> None:
    """Keep every name of `module`'s namespace but dunders: the last statement of each timing
    module, so what is kept is what its own code bound."""
    namespace = vars(module)
    name = module.__name__
    if name in _NAMESPACES.where:
        return
    rows = [(name, namespace, a, v) for a, v in namespace.items() if not a.startswith("__")]
    _NAMESPACES.extend(rows)
    attributes = []
    for _name, _namespace, attr, value in rows:
        if getattr(value, "__module__", None) != name:
            continue
        # Its functions' code and defaults too, its classes' methods.
        where = f"{name}.{attr}"
        if hasattr(value, "__code__"):
            for part in ("__code__", "__defaults__", "__kwdefaults__"):
                attributes.append((where, value, part, getattr(value, part)))
        elif isinstance(value, type):
            for method, function in list(vars(value).items()):
                if not method.startswith("__") and callable(function):
                    attributes.append((where, value, method, function))
    _ATTRIBUTES.extend(attributes)


def _replacements() -> list[tuple[str, Any]]:
    """(the rebound name, what it points to now) for every rebinding `binding_failure` sees."""
    out = []
    for kept in (_STDLIB, _NAMESPACES, _ATTRIBUTES):
        for where, name, current, original in zip(
            kept.where, kept.names, kept.currents(), kept.values, strict=True
        ):
            if current is not original:
                out.append((f"{where}.{name}", current))
    return out


def _code_file(value: Any) -> str | None:
    """The file of the Python code behind `value` (a function, a bound method, a callable
    object's `__call__`, a `functools.partial`), or None for C code."""
    for candidate in (
        value,
        getattr(value, "__func__", None),
        getattr(value, "func", None),
        type(value).__dict__.get("__call__"),
    ):
        code = getattr(candidate, "__code__", None)
        if code is not None:
            return str(code.co_filename)
    return None


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def patcher_of(value: Any) -> str:
    """The module that made `value`: the one whose file holds its code, else its
    `__module__`, else the modules outside the plugin whose globals hold it."""
    filename = _code_file(value)
    owner = getattr(value, "__module__", None)
    if filename is not None:
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) == filename:
                return f"{name} ({filename})"
        return f"{owner} ({filename})" if isinstance(owner, str) else filename
    if isinstance(owner, str) and owner not in ("builtins", "time", "os", "json", "posix"):
        return owner
    holders = []
    installed = tuple({sys.prefix, sys.base_prefix, _OWN_DIR})
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if not path or path.startswith(installed):  # the plugin, the standard library, packages
            continue
        try:
            if any(v is value for v in vars(module).values()):
                holders.append(name)
        except TypeError:
            continue
    return ", ".join(holders[:3]) if holders else "an unknown module"


# The modules found to have patched a kept name, with what: their kernels are refused.
patchers: dict[str, str] = {}


def _module_key(described: str) -> str:
    """The file of a `patcher_of` description when it names one ("mod (file)"), else it."""
    if described.endswith(")") and " (" in described:
        return described.rsplit(" (", 1)[1][:-1]
    return described


def binding_failure(when: str) -> str | None:
    """Why the kept bindings are not intact `when`, naming each rebound name and who made it
    (added to `patchers`), or None."""
    if intact():
        return None
    replaced = _replacements()
    torch_found = _torch_tampered()
    if not replaced and not torch_found:
        return None
    by_patch: dict[tuple[str, str], list[str]] = {}
    for name, value in replaced:
        by_patch.setdefault((_describe(value), patcher_of(value)), []).append(name)
    parts = []
    for (now, patcher), names in by_patch.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        parts.append(f"{shown} (now {now}, made by {patcher})")
        patchers[_module_key(patcher)] = f"{shown} (to {now})"
    return (
        f"{', '.join(parts + torch_found)} was replaced {when}: a kernel timed across a "
        "rebound clock, serializer or timing function cannot be timed (its numbers could be "
        "anything) and none of them is published. Remove the patch from the module named; "
        "the originals are put back now"
    )


def kernel_is_patcher(kernel: Any) -> str | None:
    """The patcher entry (`patchers`) of the module `kernel` was defined in, or None."""

    names = {getattr(kernel, "__module__", None), getattr(type(kernel), "__module__", None)}
    files = {_code_file(kernel), _code_file(getattr(type(kernel), "forward", None))}
    for name in list(names):
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is not None and getattr(module, "__file__", None):
            files.add(module.__file__)
    for patcher, what in patchers.items():
        if patcher in names or patcher in files:
            return f"its module ({patcher}) rebound {what}, found and put back before this timing"
    return None


def restore() -> None:
    """Put every kept function back (after a refusal: later kernels are not blamed)."""
    for kept in (_STDLIB, _NAMESPACES, _ATTRIBUTES):
        kept.put_back()
    for owner, attr, original in _TORCH_KEPT.values():
        setattr(owner, attr, original)


keep_module(sys.modules[__name__])
