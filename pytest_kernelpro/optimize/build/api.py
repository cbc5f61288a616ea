"""`build_cuda` / `load_cuda`: fast-path CUDA source to a cached cubin and a callable module.

See the package docstring (`pytest_kernelpro.optimize.build`) for the candidate form and the use in
a patched user module.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_kernelpro.optimize.build.cache import BuildCache, BuildError, build_key
from pytest_kernelpro.optimize.build.launch import CudaModule
from pytest_kernelpro.optimize.build.nvcc import (
    CUBIN_NAME,
    DEFAULT_FLAGS,
    check_flags,
    compile_cubin,
    compiler_version,
    find_nvcc,
)
from pytest_kernelpro.optimize.build.source import (
    KernelSignature,
    SourceError,
    check_includes,
    parse_kernels,
)

ARCH_ENV = "KERNELPRO_CUDA_ARCH"
# CuTe calls constexpr host functions from device code; CUTLASS asks for these.
CUTLASS_FLAGS: tuple[str, ...] = (
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
)

_records: list[dict[str, Any]] = []  # every build_cuda call of this process (harness reads it)
_records_lock = threading.Lock()


@dataclass(frozen=True)
class CudaBuild:
    """The outcome of one `build_cuda` call."""

    key: str
    name: str
    cubin_path: Path
    kernels: dict[str, KernelSignature]
    hit: bool  # the entry existed (no compile in this call)
    seconds: float  # wall time of this call (lookup, wait, compile)
    compile_s: float  # what compiling took when the entry was built
    log: str  # compiler output (ptxas -v report) of the entry's build
    arch: str
    flags: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """A JSON-ready summary (for the trajectory)."""
        return {
            "path": "fast",
            "name": self.name,
            "key": self.key,
            "hit": self.hit,
            "seconds": round(self.seconds, 4),
            "compile_s": round(self.compile_s, 4),
            "arch": self.arch,
            "cubin": str(self.cubin_path),
            "kernels": sorted(self.kernels),
        }


def build_records(clear: bool = False) -> list[dict[str, Any]]:
    """The builds this process made through `build_cuda` (and `clear` them)."""
    with _records_lock:
        out = list(_records)
        if clear:
            _records.clear()
    return out


def _read_source(source: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, default name) of a source given as text or as a path to a .cu file."""
    if isinstance(source, os.PathLike) or (
        isinstance(source, str)
        and "\n" not in source
        and source.endswith((".cu", ".cuh"))
        and Path(source).is_file()
    ):
        path = Path(source)
        try:
            return path.read_text(encoding="utf-8"), path.stem
        except OSError as exc:
            raise BuildError(f"cannot read CUDA source {path}: {exc}") from exc
    if not isinstance(source, str):
        raise BuildError(f"CUDA source must be text or a path, got {type(source).__name__}")
    return source, "kernel"


def default_arch() -> str:
    """The compile target: $KERNELPRO_CUDA_ARCH, else the current GPU's ("sm_90" -> "sm_90a")."""
    from pytest_kernelpro.optimize.cutlass.flags import target_arch

    if os.environ.get(ARCH_ENV):
        return target_arch(os.environ[ARCH_ENV])
    try:
        import torch

        if torch.cuda.is_available():
            return target_arch(torch.cuda.get_device_capability())
    except ImportError:
        pass
    raise BuildError(
        f"no GPU to read the architecture from: pass arch='sm_90a' (or set {ARCH_ENV})"
    )


def build_inputs(
    source: str,
    *,
    arch: str,
    flags: Sequence[str] = (),
    cutlass: bool = False,
    nvcc: str | None = None,
) -> dict[str, Any]:
    """Everything that decides the cubin (the cache key's inputs), with the include dirs."""
    from pytest_kernelpro.optimize.cutlass.flags import target_arch

    target = target_arch(arch)
    all_flags = [*check_flags(list(flags))]
    include_dirs: list[str] = []
    cutlass_version = None
    if cutlass:
        from pytest_kernelpro.optimize.cutlass.locate import locate_cutlass

        lookup = locate_cutlass()
        if lookup.install is None:
            raise BuildError(lookup.reason)
        include_dirs = [str(d) for d in lookup.install.include_dirs]
        cutlass_version = lookup.install.version
        all_flags = [*CUTLASS_FLAGS, *all_flags]
    tool = nvcc or find_nvcc()
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "kind": "cubin",
        "source": source,
        "arch": target,
        "flags": [*DEFAULT_FLAGS, *all_flags],
        "extra_flags": all_flags,
        "include_dirs": include_dirs,
        "cutlass": cutlass_version,
        "compiler": compiler_version(tool),
        "nvcc": tool,
        "torch": torch_version,
    }


def build_cuda(
    source: str | os.PathLike[str],
    *,
    name: str | None = None,
    arch: str | None = None,
    flags: Sequence[str] = (),
    cutlass: bool = False,
    cache: BuildCache | str | os.PathLike[str] | None = None,
    nvcc: str | None = None,
    timeout_s: float = 300.0,
) -> CudaBuild:
    """Compile fast-path CUDA source to a cubin through the build cache (no GPU needed).

    Raises `BuildError` (trimmed compiler message in `.message`, full log in `.log`) for a
    source that does not compile, and `SourceError` for one that breaks the fast-path rules.
    """
    started = time.monotonic()
    text, default_name = _read_source(source)
    check_includes(text)
    kernels = parse_kernels(text)
    if not kernels:
        raise SourceError(
            'no extern "C" __global__ kernel in the source: declare each kernel that Python '
            'launches as `extern "C" __global__ void name(...)`'
        )
    store = cache if isinstance(cache, BuildCache) else BuildCache(cache)
    inputs = build_inputs(
        text, arch=arch or default_arch(), flags=flags, cutlass=cutlass, nvcc=nvcc
    )
    key = build_key({k: v for k, v in inputs.items() if k != "nvcc"})

    def produce(folder: Path) -> dict[str, Any]:
        began = time.monotonic()
        _, log = compile_cubin(
            text,
            folder,
            arch=inputs["arch"],
            flags=inputs["extra_flags"],
            include_dirs=inputs["include_dirs"],
            nvcc=inputs["nvcc"],
            timeout_s=timeout_s,
            confine=store.confine,
        )
        return {
            "kind": "cubin",
            "arch": inputs["arch"],
            "flags": inputs["flags"],
            "compiler": inputs["compiler"],
            "torch": inputs["torch"],
            "kernels": {n: [p.ctype for p in k.params] for n, k in kernels.items()},
            "log": log,
            "build_s": time.monotonic() - began,
        }

    entry = store.get_or_build(key, produce)
    build = CudaBuild(
        key=key,
        name=name or default_name,
        cubin_path=entry.path / CUBIN_NAME,
        kernels=kernels,
        hit=entry.hit,
        seconds=time.monotonic() - started,
        compile_s=float(entry.meta.get("build_s") or 0.0),
        log=str(entry.meta.get("log") or ""),
        arch=inputs["arch"],
        flags=tuple(inputs["flags"]),
    )
    with _records_lock:
        _records.append(build.record())
    return build


def load_cuda(
    source: str | os.PathLike[str],
    *,
    name: str | None = None,
    arch: str | None = None,
    flags: Sequence[str] = (),
    cutlass: bool = False,
    cache: BuildCache | str | os.PathLike[str] | None = None,
    nvcc: str | None = None,
) -> CudaModule:
    """`build_cuda`, then a `CudaModule` whose `extern "C"` kernels are called as
    `module.kernel_name(*args, grid=..., block=..., shared_mem=0)` (loaded on first call)."""
    build = build_cuda(
        source, name=name, arch=arch, flags=flags, cutlass=cutlass, cache=cache, nvcc=nvcc
    )
    meta = asdict(build)
    meta.pop("kernels")
    return CudaModule(build.cubin_path, build.kernels, meta)
