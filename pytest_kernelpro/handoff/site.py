"""The marked kernel's place in the user's repository, as pytest imported it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kernelpro.search.patch import KernelSite, import_style_of, repository_root

if TYPE_CHECKING:
    from pytest_kernelpro.run.items import KernelItem


def kernel_site(item: KernelItem, rootpath: Path) -> tuple[KernelSite, Path]:
    """(site of the marked kernel, repository root for the patch's paths)."""
    import pytest

    path = Path(item.locator.path).resolve()
    kind = item.problem.kind
    if kind == "kernelbench":
        style = "absolute"  # the plugin imports KernelBench files with their folder on sys.path
    else:
        module = item.getparent(pytest.Module)
        obj = getattr(module, "obj", None) if module is not None else None
        name = getattr(obj, "__name__", "")
        style = import_style_of(name, getattr(obj, "__file__", None) or path)
    site = KernelSite(path=path, qualname=item.locator.qualname, kind=kind, import_style=style)
    return site, repository_root(path, Path(rootpath).resolve())
