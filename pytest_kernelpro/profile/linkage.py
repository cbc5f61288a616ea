"""Which vendor libraries a compiled module uses: `readelf -d` NEEDED entries and `nm -D`
undefined symbols, plus kernel names for library calls that go through libtorch.

A torch extension that calls `at::matmul` links libtorch, not cuBLAS; its GEMMs still run
cuBLAS kernels (`nvjet_*`, `sm90_xmma_gemm_*`, `cutlass_80_simt_sgemm_*` inside cuBLAS), so
`linkage_from_kernel_names` reads the kernel names of a trace as a second signal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pytest_kernelpro.profile.binaries import find_tool, run_tool
from pytest_kernelpro.profile.model import LibraryLinkage, NotCollected

_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library:\s*\[([^\]]+)\]")


def parse_readelf_needed(text: str) -> list[str]:
    """The NEEDED shared libraries of `readelf -d` output."""
    return _NEEDED.findall(text)


def parse_nm_undefined(text: str) -> list[str]:
    """Undefined dynamic symbols (`U name@version`) of `nm -D` output."""
    names: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-2] == "U":
            names.append(parts[-1])
    return names


def classify_linkage(needed: Iterable[str], undefined: Iterable[str]) -> LibraryLinkage:
    """cuBLAS / cuBLASLt / cuDNN use from NEEDED libraries and undefined symbols."""
    libs = tuple(dict.fromkeys(needed))
    symbols = [s.split("@", 1)[0] for s in undefined]
    lower_libs = [lib.lower() for lib in libs]
    cublaslt = any(lib.startswith("libcublaslt") for lib in lower_libs) or any(
        s.startswith("cublasLt") for s in symbols
    )
    cublas = any(
        lib.startswith("libcublas") and not lib.startswith("libcublaslt") for lib in lower_libs
    ) or any(s.startswith("cublas") and not s.startswith("cublasLt") for s in symbols)
    cudnn = any(lib.startswith("libcudnn") for lib in lower_libs) or any(
        s.startswith("cudnn") for s in symbols
    )
    return LibraryLinkage(cublas=cublas, cublaslt=cublaslt, cudnn=cudnn, libraries=libs)


def read_linkage(module_path: str, *, timeout_s: float = 60.0) -> LibraryLinkage | NotCollected:
    """Run `readelf -d` and `nm -D --undefined-only` on a module and classify the result."""
    readelf = find_tool("readelf")
    nm = find_tool("nm")
    if readelf is None and nm is None:
        return NotCollected("linkage", "neither readelf nor nm found on PATH (install binutils)")
    needed: list[str] = []
    undefined: list[str] = []
    problems: list[str] = []
    if readelf is not None:
        run = run_tool("linkage", [readelf, "-d", module_path], timeout_s=timeout_s)
        if isinstance(run, NotCollected):
            problems.append(run.why)
        else:
            needed = parse_readelf_needed(run.stdout)
    if nm is not None:
        run = run_tool("linkage", [nm, "-D", "--undefined-only", module_path], timeout_s=timeout_s)
        if isinstance(run, NotCollected):
            problems.append(run.why)
        else:
            undefined = parse_nm_undefined(run.stdout)
    if problems and not needed and not undefined:
        return NotCollected("linkage", "; ".join(problems))
    return classify_linkage(needed, undefined)


# Kernel-name patterns of vendor libraries (heuristic; names seen in real traces).
_CUBLAS_KERNELS = re.compile(
    r"(^|[^a-z])(nvjet_|sm\d+_xmma_gemm|cutlass_\d+_\w*gemm|ampere_\w*gemm|volta_\w*gemm|"
    r"turing_\w*gemm|hopper_\w*gemm|gemv2?[tn]?_kernel|gemmSN|splitKreduce_kernel|cublas)",
    re.IGNORECASE,
)
_CUDNN_KERNELS = re.compile(r"(cudnn|xmma_fprop|xmma_dgrad|xmma_wgrad|_fprop_|implicit_gemm)", re.I)


def linkage_from_kernel_names(names: Iterable[str]) -> LibraryLinkage:
    """cuBLAS / cuDNN use guessed from the kernel names of a trace (libtorch-routed calls)."""
    names = list(names)
    cublas_hits = [n for n in names if _CUBLAS_KERNELS.search(n)]
    cudnn_hits = [n for n in names if _CUDNN_KERNELS.search(n)]
    libraries: list[str] = []
    if cublas_hits:
        libraries.append("cuBLAS (kernel names)")
    if cudnn_hits:
        libraries.append("cuDNN (kernel names)")
    return LibraryLinkage(
        cublas=bool(cublas_hits), cudnn=bool(cudnn_hits), libraries=tuple(libraries)
    )


def merge_linkage(*parts: LibraryLinkage | None) -> LibraryLinkage | None:
    """Union of several linkage findings; None when all are None."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return LibraryLinkage(
        cublas=any(p.cublas for p in present),
        cublaslt=any(p.cublaslt for p in present),
        cudnn=any(p.cudnn for p in present),
        libraries=tuple(dict.fromkeys(lib for p in present for lib in p.libraries)),
    )
