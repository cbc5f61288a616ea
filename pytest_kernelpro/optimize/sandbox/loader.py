"""Execute problem and candidate source text as fresh, importable modules, with the pytest
session's import path."""

from __future__ import annotations

import linecache
import sys
import types
from typing import Any


def load_source(source: str, name: str) -> types.ModuleType:
    """Exec `source` in a new module called `name`, registered in `sys.modules`.

    Registering it lets dataclasses, pickling and `inspect` work inside the code; the source
    is put in `linecache` so tracebacks show its lines. `__name__` is `name`, so an
    `if __name__ == "__main__":` block does not run.
    """
    filename = f"<{name}>"
    module = types.ModuleType(name)
    module.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    sys.modules[name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def add_session_path(entries: Any) -> None:
    """Put the pytest session's sys.path entries missing here in front of the worker's
    (keeping their order), so the kernel's modules import as they did under pytest."""
    missing = [str(p) for p in entries if str(p) and str(p) not in sys.path]
    sys.path[:0] = missing
