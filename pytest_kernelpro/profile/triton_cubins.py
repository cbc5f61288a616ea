"""SASS of Triton kernels, read from the cubins Triton's cache wrote during the profiled run.

A Triton kernel has no captured load_inline `.so`: Triton compiles each kernel into its cache
directory as `<cache>/<hash>/<name>.cubin` beside `<name>.json`, whose `name` is the kernel's
function name, the symbol in the cubin and the name ncu prints. A kernel of the report without
SASS gets the SASS of the newest cubin of that name written at or after the run started; an
older entry of the same name may belong to another kernel (another file, another version of
the source), so it is not used. Of several fresh cubins of one name (autotuning compiles one
per config) the newest whose `num_warps` fits the profiled launch's block size is read.

A kernel compiled in an earlier session is a cache hit: Triton writes nothing, so no cubin of
its name is fresh, and one item's entry cannot be told from another's of the same name (two
shapes specialize one kernel into two entries). So a profile gives its own runs a private
cache (`private_triton_cache`): every cubin in it was compiled by those runs from the code as
it is now, whatever its age. Only the entries without a cubin (the C launcher and
`cuda_utils` modules Triton builds with the host compiler) are linked in from the caller's
cache, so they are not rebuilt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pytest_kernelpro.profile.model import (
    KernelProfile,
    NotCollected,
    ProfileReport,
    SassSummary,
)
from pytest_kernelpro.profile.sass import sass_of_module
from pytest_kernelpro.profile.symbols import kernel_base_name

__all__ = [
    "TRITON_CACHE_ENV",
    "TritonCubin",
    "attach_triton_sass",
    "fresh_triton_cubins",
    "private_triton_cache",
    "triton_cache_dir",
]

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def triton_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cache directory Triton uses under `env`: TRITON_CACHE_DIR, else
    `$TRITON_HOME/.triton/cache`, else `~/.triton/cache` (Triton's own default)."""
    env = os.environ if env is None else env
    if env.get(TRITON_CACHE_ENV):
        return Path(env[TRITON_CACHE_ENV]).expanduser()
    home = env.get("TRITON_HOME") or env.get("HOME") or str(Path.home())
    return Path(home).expanduser() / ".triton" / "cache"


def private_triton_cache(directory: Path, shared: Path | None = None) -> Path:
    """Make `directory` a Triton cache for one profile's runs and return it.

    The entries of `shared` (default: this process's cache) that hold no cubin are linked
    in: compiled host modules keyed by their source's hash, which Triton only reads. Kernel
    entries are not, so each kernel the runs launch is compiled into `directory`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    source = triton_cache_dir() if shared is None else shared
    if not source.is_dir():
        return directory
    for entry in source.iterdir():
        try:
            if not entry.is_dir() or any(entry.glob("*.cubin")):
                continue
            (directory / entry.name).symlink_to(entry.resolve(), target_is_directory=True)
        except OSError:  # unreadable or vanished entry, or a name already there: compiled anew
            continue
    return directory


@dataclass(frozen=True)
class TritonCubin:
    """One compiled kernel of a Triton cache entry."""

    name: str  # the kernel function's name (the metadata's `name`)
    path: str  # the .cubin
    mtime: float  # when it was written (seconds since the epoch)
    num_warps: int | None = None  # the metadata's `num_warps`: the launch's block is 32x that


def fresh_triton_cubins(cache_dir: Path, since: float) -> list[TritonCubin]:
    """The cubins of `cache_dir` written at or after `since`, newest first.

    Entries without readable metadata or without a cubin (PTX-only, another backend, a
    half-written entry) are skipped; Triton's `__grp__*.json` group files are not kernels.
    """
    found: list[TritonCubin] = []
    if not cache_dir.is_dir():
        return found
    for meta in cache_dir.glob("*/*.json"):
        if meta.name.startswith("__grp__"):
            continue
        cubin = meta.with_suffix(".cubin")
        try:
            mtime = cubin.stat().st_mtime
            if mtime < since:
                continue
            data = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        name = data.get("name") if isinstance(data, dict) else None
        if isinstance(name, str) and name:
            warps = data.get("num_warps")
            found.append(
                TritonCubin(name, str(cubin), mtime, warps if isinstance(warps, int) else None)
            )
    found.sort(key=lambda c: -c.mtime)
    return found


def _pick(cubins: list[TritonCubin], kernel: KernelProfile) -> TritonCubin | None:
    """The newest of `cubins` (one kernel name, newest first) whose warps fit the profiled
    launch's block: autotuning compiles one cubin per config under the same name."""
    block = kernel.metrics.block_size if kernel.metrics is not None else None
    if block is not None:
        threads = block[0] * block[1] * block[2]
        fitting = [c for c in cubins if c.num_warps is not None and 32 * c.num_warps == threads]
        if fitting:
            return fitting[0]
    return cubins[0] if cubins else None


def _lasting_path(cubin: Path, directory: Path, shared: Path | None) -> str:
    """`cubin`'s path, or that of the same cache entry under `shared` where it exists there
    (Triton names an entry by the hash of the source and options, whatever the directory)."""
    if shared is not None:
        try:
            twin = shared / cubin.relative_to(directory)
        except ValueError:
            return str(cubin)
        if twin.is_file():
            return str(twin)
    return str(cubin)


def _summary_named(sass: Mapping[str, SassSummary], base: str) -> SassSummary | None:
    for summary in sass.values():
        if kernel_base_name(summary.function) == base or summary.mangled == base:
            return summary
    return None


def attach_triton_sass(
    report: ProfileReport,
    *,
    since: float,
    cache_dir: Path | None = None,
    cuobjdump: str | None = None,
    same_entries_in: Path | None = None,
) -> None:
    """Give each kernel of `report` without SASS the SASS of its fresh Triton cubin.

    `since` is the run's start (seconds since the epoch; 0 for a private cache, where every
    cubin is fresh). The kernel records which cubin was read (`sass_source`): where
    `same_entries_in` (the caller's cache, for a private one about to be removed) holds the
    entry of the same cache key, that one's path, which outlives the profile. Kernels that
    still have no SASS are named in a `sass` note saying what was looked for.
    """
    missing = [k for k in report.kernels if k.sass is None]
    if not missing:
        return
    directory = triton_cache_dir() if cache_dir is None else cache_dir
    cubins = fresh_triton_cubins(directory, since)
    by_name: dict[str, list[TritonCubin]] = {}
    for cubin in cubins:  # newest first
        by_name.setdefault(cubin.name, []).append(cubin)
    problems: list[str] = []
    for kernel in missing:
        cubin = _pick(by_name.get(kernel_base_name(kernel.name), []), kernel)
        if cubin is None:
            continue
        sass = sass_of_module(cubin.path, cuobjdump=cuobjdump)
        if isinstance(sass, NotCollected):
            problems.append(f"{cubin.path}: {sass.why}")
            continue
        summary = _summary_named(sass, cubin.name)
        if summary is None:
            problems.append(f"{cubin.path} has no function named {cubin.name}")
            continue
        kernel.sass = summary
        kernel.sass_source = _lasting_path(Path(cubin.path), directory, same_entries_in)
    unmatched = [k.name for k in report.kernels if k.sass is None]
    if not unmatched:
        return
    if since > 0:
        started = datetime.fromtimestamp(since, tz=timezone.utc)
        written = f"was written since {started:%Y-%m-%d %H:%M:%S} UTC in {directory}"
    else:
        written = f"is in the profile's own Triton cache {directory}"
    why = (
        "no captured load_inline module holds these kernels, and no Triton cubin of the same "
        f"name {written} (looked for "
        + ", ".join(dict.fromkeys(kernel_base_name(n) for n in unmatched))
        + f"; {len(cubins)} fresh cubins there): PyTorch or library kernels have no SASS here"
    )
    if problems:
        why += "; " + "; ".join(problems)
    report.not_collected.append(NotCollected("sass", why))
