"""Build flags for CUTLASS/CuTe code, per GPU architecture.

Hopper's wgmma, TMA and setmaxnreg, and Blackwell's tcgen05, exist only in the
architecture-specific targets (`sm_90a`, `sm_100a`): compiled for plain `sm_90`, CUTLASS
quietly builds the SM80 fallback paths or traps at run time (`fence_barrier_init` becomes
`brkpt`). So those architectures get the `a` target.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kernelpro.errors import KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.cutlass.locate import CutlassInstall

# Architectures whose tensor-core/TMA instructions need the arch-specific ("a") target.
ARCH_SPECIFIC = frozenset({90, 100, 101, 103, 110, 120, 121})
_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d+)([af]?)$")
_CC_RE = re.compile(r"^(\d+)\.(\d+)$")

BASE_CUDA_FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "--expt-relaxed-constexpr",  # CuTe calls constexpr host functions from device code
    "--expt-extended-lambda",
    "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
)
BASE_HOST_FLAGS: tuple[str, ...] = ("-std=c++17",)


def parse_arch(arch: str | int | tuple[int, int]) -> tuple[int, str]:
    """(number, suffix) of "sm_90a", "sm_90", "90", "9.0", 90 or (9, 0): (90, "a"), (90, "")."""
    if isinstance(arch, tuple):
        return arch[0] * 10 + arch[1], ""
    if isinstance(arch, int):
        return arch, ""
    text = str(arch).strip().lower()
    match = _CC_RE.match(text)
    if match:
        return int(match.group(1)) * 10 + int(match.group(2)), ""
    match = _ARCH_RE.match(text)
    if not match:
        raise KernelproError(
            f"GPU architecture {arch!r} is not like 'sm_90', 'sm_90a', '90' or '9.0'"
        )
    return int(match.group(1)), match.group(2)


def target_arch(arch: str | int | tuple[int, int]) -> str:
    """The compile target: "sm_90" -> "sm_90a" (wgmma/TMA), "sm_80" -> "sm_80"."""
    number, suffix = parse_arch(arch)
    if not suffix and number in ARCH_SPECIFIC:
        suffix = "a"
    return f"sm_{number}{suffix}"


def gencode_flag(arch: str | int | tuple[int, int]) -> str:
    """`-gencode=arch=compute_90a,code=sm_90a` for the target of `arch`."""
    target = target_arch(arch)
    return f"-gencode=arch=compute_{target[3:]},code={target}"


@dataclass(frozen=True)
class BuildFlags:
    """Compiler flags for one architecture, with or without CUTLASS include paths."""

    arch: str  # the compile target, e.g. "sm_90a"
    cuda_flags: tuple[str, ...]
    host_flags: tuple[str, ...]
    include_dirs: tuple[str, ...]

    def describe(self) -> str:
        """Prompt text: the load_inline arguments to use."""
        lines = [
            f"- compile target: `{self.arch}`",
            f"- extra_cuda_cflags={list(self.cuda_flags)!r}",
            f"- extra_cflags={list(self.host_flags)!r}",
        ]
        if self.include_dirs:
            lines.append(f"- extra_include_paths={list(self.include_dirs)!r}")
        return "\n".join(lines)


def build_flags(
    arch: str | int | tuple[int, int],
    install: CutlassInstall | None = None,
    extra_cuda_flags: Sequence[str] = (),
) -> BuildFlags:
    """Flags to compile CUDA (and CUTLASS, when `install` is given) for `arch`."""
    target = target_arch(arch)
    includes = tuple(str(d) for d in install.include_dirs) if install is not None else ()
    return BuildFlags(
        arch=target,
        cuda_flags=(*BASE_CUDA_FLAGS, gencode_flag(target), *extra_cuda_flags),
        host_flags=BASE_HOST_FLAGS,
        include_dirs=includes,
    )
