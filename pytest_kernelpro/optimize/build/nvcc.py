"""nvcc: find it, name its version, compile device code to a cubin, trim its errors.

`nvcc -cubin` compiles device code only (no host compiler pass), which is why a kernel
without torch headers builds in about a second where `load_inline` takes tens of seconds.
`-Xptxas=-v` puts the register and shared-memory report in the build log, which
`profile.ptxas` reads.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pytest_kernelpro.optimize.build.cache import (
    BuildError,
    CacheableBuildError,
    Confinement,
    confined_env,
    sandbox_outcome,
)

SOURCE_NAME = "kernel.cu"
CUBIN_NAME = "kernel.cubin"
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v")

# Flags a candidate may add. Anything that names a file or a tool (-o, -I, -include,
# -Xcompiler, --output-directory, -ccbin, ...) is refused: see check_flags.
_ALLOWED_FLAG = re.compile(
    r"^(?:-O[0-3]|-D[A-Za-z_]\w*(?:=[\w.+\-]*)?|-U[A-Za-z_]\w*|-lineinfo|-G|"
    r"--?use_fast_math|--?use-fast-math|-std=c\+\+(?:17|20)|--expt-relaxed-constexpr|"
    r"--expt-extended-lambda|--extended-lambda|-maxrregcount=\d+|--maxrregcount=\d+|"
    r"-ftz=(?:true|false)|-prec-div=(?:true|false)|-prec-sqrt=(?:true|false)|"
    r"-fmad=(?:true|false)|--extra-device-vectorization|-restrict|--restrict|"
    r"-Xptxas=(?:-v|-O[0-3]|--allow-expensive-optimizations(?:=true|=false)?|"
    r"--warn-on-spills|-warn-spills|--warn-on-local-memory-usage)|"
    r"-w|--disable-warnings|-Wno-deprecated-declarations|--ptxas-options=-v|"
    r"-DCUTLASS_\w+(?:=\w+)?|--diag-suppress=[\d,]+)$"
)
_ERROR_LINE = re.compile(r"\berror\b|\bfatal\b", re.IGNORECASE)
_DIAGNOSTIC = re.compile(
    r"^\S.*?(?:\(\d+\)|:\d+:).*?:\s*(?:fatal\s+)?(?:error|warning|remark)\b|^ptxas|^nvcc"
)
# Build-driver noise around the diagnostics (ninja, torch's header, the command lines).
_NOISE = re.compile(
    r"^\s*(?:\[\d+/\d+\]|FAILED:|ninja:|Error building extension|/\S+/(?:nvcc|c\+\+|g\+\+)\s)"
)
_MAX_LINE = 300


def check_flags(flags: Sequence[str]) -> list[str]:
    """The flags, or `BuildError` naming the first one a candidate may not pass."""
    for flag in flags:
        if not isinstance(flag, str) or not _ALLOWED_FLAG.match(flag):
            raise CacheableBuildError(
                f"nvcc flag {flag!r} is not allowed in a fast-path build: use optimization "
                "and code-generation flags only (-O3, -DNAME=value, --use_fast_math, "
                "-maxrregcount=N, -Xptxas=-v, ...); include paths come from the build "
                "options (cutlass=True), not from flags."
            )
    return list(flags)


def find_nvcc() -> str:
    """The nvcc to use: $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").exists():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return "/usr/local/cuda/bin/nvcc"
    raise BuildError(
        "nvcc not found (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin): "
        "install the CUDA toolkit or set CUDA_HOME"
    )


@functools.lru_cache(maxsize=8)
def compiler_version(nvcc: str) -> str:
    """`nvcc --version`'s last line ("Build cuda_13.0.r13.0/compiler.36424714_0")."""
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {nvcc} --version: {exc}") from exc
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    release = next((line for line in lines if "release" in line), "")
    return " | ".join(x for x in (release, lines[-1] if lines else "") if x) or "unknown"


def trim_compiler_log(log: str, *, limit: int = 2000, max_errors: int = 8) -> str:
    """What a debug prompt needs from a compiler log: each error with the source line and
    caret nvcc prints under it, then the summary line; warnings only when there is no error.
    """
    lines = log.splitlines()
    blocks: list[list[str]] = []
    current: list[str] | None = None
    summary = ""
    for line in lines:
        stripped = line.rstrip()
        if _NOISE.match(stripped) or (" -c " in stripped and " -o " in stripped):
            current = None
            continue
        if len(stripped) > _MAX_LINE:
            stripped = stripped[:_MAX_LINE] + " [...]"
        if re.search(r"\d+ errors? detected in the compilation", stripped):
            summary = stripped.strip()
            current = None
            continue
        if _DIAGNOSTIC.search(stripped) or (current is None and _ERROR_LINE.search(stripped)):
            current = [stripped]
            blocks.append(current)
        elif current is not None and stripped and len(current) < 4:
            current.append(stripped)
        elif not stripped:
            current = None
    errors = [b for b in blocks if _ERROR_LINE.search(b[0])]
    chosen = errors or [b for b in blocks if "warning" in b[0].lower()]
    if not chosen:
        tail = "\n".join(line for line in lines if line.strip())[-limit:]
        return tail
    out: list[str] = []
    for block in chosen[:max_errors]:
        text = "\n".join(block)
        if sum(len(x) + 1 for x in out) + len(text) > limit:
            break
        out.append(text)
    more = len(chosen) - len(out)
    if more > 0:
        out.append(f"[... {more} more {'error' if errors else 'warning'}(s)]")
    if summary:
        out.append(summary)
    return "\n".join(out)


def compile_cubin(
    source: str,
    folder: Path,
    *,
    arch: str,
    flags: Sequence[str] = (),
    include_dirs: Sequence[str] = (),
    nvcc: str | None = None,
    timeout_s: float = 300.0,
    confine: Confinement | None = None,
) -> tuple[Path, str]:
    """Compile `source` to `folder/kernel.cubin` for `arch` ("sm_90a"); returns the cubin's
    path and the compiler's log. A compiler error raises `CacheableBuildError` with the
    trimmed message (file paths shown relative to the build folder)."""
    tool = nvcc or find_nvcc()
    src = folder / SOURCE_NAME
    src.write_text(source, encoding="utf-8")
    out = folder / CUBIN_NAME
    number = arch.removeprefix("sm_")
    command = [
        tool,
        "-cubin",
        f"-gencode=arch=compute_{number},code=sm_{number}",
        *DEFAULT_FLAGS,
        *flags,
        *(f"-I{d}" for d in include_dirs),
        "-o",
        CUBIN_NAME,
        SOURCE_NAME,
    ]
    env = _compiler_env()
    sandboxed = False
    if confine is not None:  # in the candidates' sandbox, writing only `folder`
        env.update(confined_env(folder))
        wrapped = confine(command, folder, [])
        sandboxed, command = wrapped != command, wrapped
    try:
        done = subprocess.run(
            command,
            cwd=folder,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"nvcc did not finish within {timeout_s:g}s (killed)") from exc
    except OSError as exc:
        raise BuildError(f"cannot run {tool}: {exc}") from exc
    log = (done.stdout + done.stderr).replace(str(folder) + os.sep, "")
    if sandboxed:
        started, log = sandbox_outcome(log)
        if not started:  # not the source's fault: not cached
            raise BuildError(
                f"the build sandbox did not start (exit {done.returncode}): {log[-600:]}", log
            )
    if done.returncode != 0 or not out.exists():
        if done.returncode < 0:  # killed by a signal (out of memory?): not the source's fault
            raise BuildError(f"nvcc was killed by signal {-done.returncode}", log)
        message = trim_compiler_log(log) or f"nvcc exited with code {done.returncode}"
        raise CacheableBuildError(message, log)
    with open(out, "rb") as handle:
        os.fsync(handle.fileno())
    return out, log


def _compiler_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
    return {name: os.environ[name] for name in keep if name in os.environ}
