"""Locate and run the command-line tools the profilers need (cuobjdump, cu++filt, nm, ncu...).

A tool is looked up in this order: its `KERNELPRO_<NAME>` environment variable (a path),
`PATH`, `$CUDA_HOME/bin` (and `$CUDA_PATH/bin`, `/usr/local/cuda/bin`), then the `bin/`
folders of the PyPI `nvidia-*` wheels (`nvidia-cuda-cuobjdump` ships
`site-packages/nvidia/cu13/bin/cuobjdump`; 12.x wheels use `nvidia/cuda_cuobjdump/bin`).
Every failure comes back as a `NotCollected` with the reason, never as an exception, so a
missing tool never fails a kernel item.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelpro.profile.model import NotCollected

_CUDA_ROOT_VARS = ("CUDA_HOME", "CUDA_PATH")
_DEFAULT_CUDA_ROOTS = ("/usr/local/cuda",)


def env_var_for(tool: str) -> str:
    """`cu++filt` -> `KERNELPRO_CUXXFILT`, `cuobjdump` -> `KERNELPRO_CUOBJDUMP`."""
    return "KERNELPRO_" + tool.upper().replace("+", "X").replace("-", "_")


def _pypi_bin_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    dirs: list[Path] = []
    for root in spec.submodule_search_locations:
        dirs.extend(sorted(Path(root).glob("*/bin")))
    return dirs


def find_tool(tool: str, *, env_var: str | None = None) -> str | None:
    """Absolute path of `tool`, or None when no location has an executable by that name."""
    override = os.environ.get(env_var or env_var_for(tool))
    if override:
        return override if os.access(override, os.X_OK) else None
    found = shutil.which(tool)
    if found:
        return found
    roots = [os.environ[v] for v in _CUDA_ROOT_VARS if os.environ.get(v)]
    candidates = [Path(r) / "bin" / tool for r in [*roots, *_DEFAULT_CUDA_ROOTS]]
    candidates += [d / tool for d in _pypi_bin_dirs()]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def where_looked(tool: str) -> str:
    """A short description of the search path, for NotCollected messages."""
    return (
        f"{env_var_for(tool)}, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and the PyPI "
        f"nvidia-* wheels' bin folders"
    )


@dataclass(frozen=True)
class ToolRun:
    """The outcome of one tool invocation that started and finished."""

    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_tool(
    what: str,
    command: list[str],
    *,
    timeout_s: float = 120.0,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> ToolRun | NotCollected:
    """Run `command`; a missing binary, a timeout or a non-zero exit becomes `NotCollected`."""
    try:
        completed = subprocess.run(
            command,
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        return NotCollected(what, f"{command[0]} could not be executed (not found)")
    except PermissionError:
        return NotCollected(what, f"{command[0]} is not executable (permission denied)")
    except subprocess.TimeoutExpired:
        return NotCollected(what, f"{Path(command[0]).name} timed out after {timeout_s:.0f} s")
    run = ToolRun(tuple(command), completed.returncode, completed.stdout, completed.stderr)
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        return NotCollected(
            what,
            f"{Path(command[0]).name} exited with {completed.returncode}: " + " | ".join(tail),
        )
    return run


def cuobjdump_env() -> dict[str, str]:
    """The environment for cuobjdump: `--dump-sass` runs nvdisasm, which the PyPI
    `nvidia-cuda-cuobjdump` wheel does not ship; point it at a located nvdisasm (PATH,
    CUDA toolkit or the `nvidia-cuda-nvdisasm` wheel) through NVDISASM_PATH and PATH."""
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm is not None and "NVDISASM_PATH" not in env:
        folder = str(Path(nvdisasm).parent)
        env["NVDISASM_PATH"] = folder
        env["PATH"] = folder + os.pathsep + env.get("PATH", "")
    return env
