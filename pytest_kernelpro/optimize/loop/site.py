"""The marked kernel's place in the user's repository, as pytest imported it."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.optimize.loop.patch import KernelSite, import_style_of, repository_root
from pytest_kernelpro.profile.problem_loader import lookup_qualname

if TYPE_CHECKING:
    from pytest_kernelpro.problem import ProblemLocator


def kernel_site(
    locator: ProblemLocator, kind: str, module: Any, rootpath: Path
) -> tuple[KernelSite, Path]:
    """(site of the marked kernel, repository root for the patch's paths).

    `module` is the test module pytest imported the kernel from (its `__name__` and
    `__file__` decide the import style the patch keeps); KernelBench files need none. A kernel
    the test module imported from a library module (collected there, since pytest never
    collects the library) is rewired where it is defined, so every caller gets the candidate."""
    path = Path(locator.path).resolve()
    qualname = locator.qualname
    if kind == "kernelbench":
        style = "absolute"  # the plugin imports KernelBench files with their folder on sys.path
    else:
        module, path, qualname = _definition_of(module, path, qualname)
        name = getattr(module, "__name__", "")
        style = import_style_of(name, getattr(module, "__file__", None) or path)
    site = KernelSite(path=path, qualname=qualname, kind=kind, import_style=style)
    return site, repository_root(path, Path(rootpath).resolve())


def _definition_of(module: Any, path: Path, qualname: str) -> tuple[Any, Path, str]:
    """(module, file, name) where the marked kernel is defined: the test module's own unless
    the object bound there comes from another module with a source file."""
    live = lookup_qualname(module, qualname)
    home = sys.modules.get(getattr(live, "__module__", None) or "")
    if live is None or home is None or home is module:
        return module, path, qualname
    try:
        source = inspect.getsourcefile(live)
    except TypeError:
        source = None
    if source is None:
        return module, path, qualname
    return home, Path(source).resolve(), getattr(live, "__qualname__", qualname)
