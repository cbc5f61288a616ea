"""The compiler and linker flags a candidate may pass to a `load_inline` build.

torch writes `extra_cflags`, `extra_cuda_cflags`, `extra_include_paths` and `extra_ldflags`
unquoted into `build.ninja`, and ninja runs each line through a shell: a flag with a `;`, a
`$`, a backtick, a space or a newline is a shell command, and options such as `-fplugin=`,
`-Xlinker`, `-Wl,`, `-B`, `--compiler-bindir`, `-specs=`, `@file` or `-o` load or write
what the candidate names. So every flag is checked against an allow-list before the build
(`check_extension_flags`): optimisation, code generation, warnings and macro definitions
with plain values; include and library paths only as absolute paths of plain characters;
libraries only from a fixed list. Anything else is refused with a `CacheableBuildError`
(the candidate's `build_error`) that names the flag and where it came from.

The fast path's nvcc flags have their own, narrower list (`nvcc.check_flags`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytest_kernelpro.optimize.build.cache import CacheableBuildError

# A macro value or a path: no shell metacharacter, no space, no quote.
_PLAIN_VALUE = r"[A-Za-z0-9_.+\-]*"
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_./+\-]*$")

# Flags common to the host compiler and nvcc.
_COMMON = (
    r"-O[0-3s]?|-Ofast|-g|-g[0-3]|-DNDEBUG|-D[A-Za-z_]\w*(?:=" + _PLAIN_VALUE + r")?"
    r"|-U[A-Za-z_]\w*|-std=c\+\+(?:14|17|20)|-std=gnu\+\+(?:14|17|20)|-w"
    r"|-W(?:no-)?[a-z][a-z0-9\-]*(?:=\d+)?"
)
HOST_FLAG = re.compile(
    r"^(?:"
    + _COMMON
    + r"|-f(?:no-)?(?:fast-math|openmp|unroll-loops|tree-vectorize|omit-frame-pointer|PIC|pic"
    r"|strict-aliasing|finite-math-only|math-errno|vectorize|slp-vectorize|inline-functions)"
    r"|-fopenmp-simd|-march=(?:native|x86-64(?:-v[234])?|[a-z0-9\-]+)|-mtune=[a-z0-9\-]+"
    r"|-m(?:avx|avx2|avx512f|fma|f16c|sse4\.2|bmi2)|-pthread"
    r")$"
)
# nvcc options that take a value in the next argument, and what that value may be.
_PTXAS_VALUE = (
    r"(?:-v|-O[0-3]|--allow-expensive-optimizations(?:=true|=false)?|--warn-on-spills"
    r"|-warn-spills|--warn-on-local-memory-usage|--maxrregcount=\d+|-maxrregcount=\d+)"
)
CUDA_FLAG = re.compile(
    r"^(?:" + _COMMON + r"|-lineinfo|--generate-line-info|-G|--?use_fast_math|--?use-fast-math"
    r"|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda"
    r"|-maxrregcount=\d+|--maxrregcount=\d+|-ftz=(?:true|false)|-prec-div=(?:true|false)"
    r"|-prec-sqrt=(?:true|false)|-fmad=(?:true|false)|--extra-device-vectorization"
    r"|-restrict|--restrict|--disable-warnings|--diag-suppress=[\d,]+|-DCUTLASS_\w+(?:=\w+)?"
    r"|-arch=(?:sm|compute)_\d+[af]?|--gpu-architecture=(?:sm|compute)_\d+[af]?"
    r"|-gencode=arch=compute_\d+[af]?,code=(?:sm|compute)_\d+[af]?"
    r"|--threads=\d+|-t\d+|--resource-usage|-res-usage"
    r"|-Xptxas=" + _PTXAS_VALUE + r"(?:," + _PTXAS_VALUE + r")*"
    r"|--ptxas-options=" + _PTXAS_VALUE + r"(?:," + _PTXAS_VALUE + r")*"
    r"|-Xcompiler=(?:-O[0-3]|-fopenmp|-fno-strict-aliasing|-w|-Wall)"
    r")$"
)
# An option given as two arguments (`"-Xptxas", "-v"`): its value's pattern.
CUDA_PAIRS = {
    "-Xptxas": re.compile(r"^" + _PTXAS_VALUE + r"(?:," + _PTXAS_VALUE + r")*$"),
    "--ptxas-options": re.compile(r"^" + _PTXAS_VALUE + r"(?:," + _PTXAS_VALUE + r")*$"),
    "-Xcompiler": re.compile(r"^(?:-O[0-3]|-fopenmp|-fno-strict-aliasing|-w|-Wall)$"),
    "-maxrregcount": re.compile(r"^\d+$"),
}
# Libraries a kernel may link: CUDA's own and the C runtime's.
LIBRARIES = frozenset(
    {
        "cuda",
        "cudart",
        "cublas",
        "cublasLt",
        "curand",
        "cusparse",
        "cufft",
        "cusolver",
        "nvrtc",
        "nvToolsExt",
        "cudnn",
        "m",
        "gomp",
        "pthread",
        "dl",
        "stdc++",
    }
)

WHY = (
    "torch writes these flags unquoted into build.ninja, which a shell runs; only "
    "optimisation, code-generation, warning and -DNAME=value flags, absolute include and "
    "library paths of plain characters, and -l of CUDA's libraries are allowed"
)


def _refuse(flag: Any, origin: str) -> CacheableBuildError:
    return CacheableBuildError(
        f"compiler flag {flag!r} in {origin} is not allowed ({WHY}); remove it from the "
        "load_inline call"
    )


def _as_list(value: Any, origin: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise CacheableBuildError(
        f"{origin} must be a list of strings, got {type(value).__name__}: {value!r:.200}"
    )


def check_host_flags(flags: Any, origin: str = "extra_cflags") -> list[str]:
    """`flags` for the host compiler, or `CacheableBuildError` naming the first refused."""
    out = _as_list(flags, origin)
    for flag in out:
        if not isinstance(flag, str) or not HOST_FLAG.match(flag):
            raise _refuse(flag, origin)
    return out


def check_cuda_flags(flags: Any, origin: str = "extra_cuda_cflags") -> list[str]:
    """`flags` for nvcc (pairs such as `-Xptxas -v` included), or the refusal."""
    out = _as_list(flags, origin)
    i = 0
    while i < len(out):
        flag = out[i]
        if not isinstance(flag, str):
            raise _refuse(flag, origin)
        if flag in CUDA_PAIRS:
            value = out[i + 1] if i + 1 < len(out) else None
            if not isinstance(value, str) or not CUDA_PAIRS[flag].match(value):
                raise _refuse(f"{flag} {value}" if value is not None else flag, origin)
            i += 2
            continue
        if not CUDA_FLAG.match(flag):
            raise _refuse(flag, origin)
        i += 1
    return out


def check_include_paths(paths: Any, origin: str = "extra_include_paths") -> list[str]:
    """Absolute paths of plain characters, without `..`; or the refusal."""
    out = _as_list(paths, origin)
    for path in out:
        if (
            not isinstance(path, str)
            or not _PLAIN_PATH.match(path)
            or "/../" in path + "/"
            or "//" in path
        ):
            raise _refuse(path, origin)
    return out


def check_ldflags(flags: Any, origin: str = "extra_ldflags") -> list[str]:
    """`-lNAME` of `LIBRARIES` and `-L/absolute/path`; or the refusal."""
    out = _as_list(flags, origin)
    for flag in out:
        if not isinstance(flag, str):
            raise _refuse(flag, origin)
        if flag.startswith("-l") and flag[2:] in LIBRARIES:
            continue
        if flag.startswith("-L") and _PLAIN_PATH.match(flag[2:]) and "/../" not in flag + "/":
            continue
        raise _refuse(flag, origin)
    return out


CHECKS = {
    "extra_cflags": check_host_flags,
    "extra_cuda_cflags": check_cuda_flags,
    "extra_include_paths": check_include_paths,
    "extra_ldflags": check_ldflags,
}


def check_extension_flags(options: dict[str, Any] | Any) -> None:
    """Check every flag keyword of a `load_inline`/`load` call's `options` (a mapping):
    `CacheableBuildError` naming the first refused flag."""
    for key, check in CHECKS.items():
        if key in options:
            check(options[key], key)


def check_flag_lists(
    *,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
) -> None:
    """`check_extension_flags` with keywords."""
    check_extension_flags(
        {
            "extra_cflags": extra_cflags,
            "extra_cuda_cflags": extra_cuda_cflags,
            "extra_include_paths": extra_include_paths,
            "extra_ldflags": extra_ldflags,
        }
    )
