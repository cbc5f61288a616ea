"""Find the CUTLASS/CuTe headers: CUTLASS_PATH, else the `nvidia-cutlass` wheel.

CUTLASS_PATH may name a CUTLASS checkout (with `include/cutlass/cutlass.h`) or its `include`
folder. The `nvidia-cutlass` wheel ships the headers under
`cutlass_library/source/include`; it is found with `importlib.util.find_spec`, which does
not import (and so does not run) the package. An explicit CUTLASS_PATH that does not hold the
headers is reported as such rather than silently replaced by the wheel.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CUTLASS_PATH_ENV = "CUTLASS_PATH"
WHEEL = "nvidia-cutlass"
_VERSION_RE = re.compile(r"#define\s+CUTLASS_(MAJOR|MINOR|PATCH)\s+(\d+)")


@dataclass(frozen=True)
class CutlassInstall:
    """A usable CUTLASS tree: `root` holds `include/cutlass` and `include/cute`."""

    root: Path
    include_dirs: tuple[Path, ...]
    version: str | None
    source: str  # "CUTLASS_PATH" or "nvidia-cutlass wheel"

    @property
    def include_dir(self) -> Path:
        """The folder with `cutlass/` and `cute/` (the first include dir)."""
        return self.include_dirs[0]

    def describe(self) -> str:
        """One line: version, where from, include dir."""
        version = f"CUTLASS {self.version}" if self.version else "CUTLASS (version unknown)"
        return f"{version} from {self.source}: {self.include_dir}"


@dataclass(frozen=True)
class CutlassLookup:
    """The result of `locate_cutlass`: an install, or None and the reason."""

    install: CutlassInstall | None
    reason: str

    def __bool__(self) -> bool:
        return self.install is not None


def read_version(include_dir: Path) -> str | None:
    """ "4.2.0" from `cutlass/version.h`, or None when it cannot be read."""
    try:
        text = (include_dir / "cutlass" / "version.h").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    parts = dict(_VERSION_RE.findall(text))
    if {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
        return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    return None


def install_from_root(path: str | os.PathLike[str], source: str) -> CutlassInstall | None:
    """A `CutlassInstall` for a checkout root or an include folder; None if no headers."""
    base = Path(path).expanduser()
    for root, include in ((base, base / "include"), (base.parent, base)):
        if (include / "cutlass" / "cutlass.h").is_file() and (include / "cute").is_dir():
            includes = [include.resolve()]
            util = root / "tools" / "util" / "include"  # cutlass/util/*.h (host helpers)
            if util.is_dir():
                includes.append(util.resolve())
            return CutlassInstall(
                root=root.resolve(),
                include_dirs=tuple(includes),
                version=read_version(include),
                source=source,
            )
    return None


def _wheel_source_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        source = Path(location) / "source"
        if source.is_dir():
            return source
    return None


def locate_cutlass(environ: Mapping[str, str] | None = None) -> CutlassLookup:
    """Where the CUTLASS headers are: CUTLASS_PATH first, then the nvidia-cutlass wheel."""
    env = os.environ if environ is None else environ
    explicit = env.get(CUTLASS_PATH_ENV, "").strip()
    if explicit:
        install = install_from_root(explicit, CUTLASS_PATH_ENV)
        if install is None:
            return CutlassLookup(
                None,
                f"{CUTLASS_PATH_ENV}={explicit!r} has no include/cutlass/cutlass.h and "
                "include/cute; point it at a CUTLASS checkout (or its include folder), or unset "
                f"it to use the {WHEEL} wheel",
            )
        return CutlassLookup(install, f"found through {CUTLASS_PATH_ENV}")
    source = _wheel_source_dir()
    if source is not None:
        install = install_from_root(source, f"{WHEEL} wheel")
        if install is not None:
            return CutlassLookup(install, f"found in the {WHEEL} wheel")
        return CutlassLookup(
            None, f"the {WHEEL} wheel at {source} has no include/cutlass headers; reinstall it"
        )
    return CutlassLookup(
        None,
        f"CUTLASS not found: {CUTLASS_PATH_ENV} is not set and the {WHEEL} wheel is not "
        f"installed; `pip install {WHEEL}` or set {CUTLASS_PATH_ENV} to a CUTLASS checkout",
    )
