"""The marked kernel's place in the user's repository, as pytest imported it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.search.patch import KernelSite, import_style_of, repository_root

if TYPE_CHECKING:
    from pytest_kernelpro.problem import ProblemLocator


def kernel_site(
    locator: ProblemLocator, kind: str, module: Any, rootpath: Path
) -> tuple[KernelSite, Path]:
    """(site of the marked kernel, repository root for the patch's paths).

    `module` is the test module pytest imported the kernel from (its `__name__` and
    `__file__` decide the import style the patch keeps); KernelBench files need none."""
    path = Path(locator.path).resolve()
    if kind == "kernelbench":
        style = "absolute"  # the plugin imports KernelBench files with their folder on sys.path
    else:
        name = getattr(module, "__name__", "")
        style = import_style_of(name, getattr(module, "__file__", None) or path)
    site = KernelSite(path=path, qualname=locator.qualname, kind=kind, import_style=style)
    return site, repository_root(path, Path(rootpath).resolve())
