"""Candidate builds: a content-addressed cache, a fast path to a cubin, and the loader.

Fast path (device code without torch headers)
---------------------------------------------
The source holds device code only; each kernel that Python launches is declared
`extern "C" __global__`. It is compiled with `nvcc -cubin` (no host compiler, no torch
headers: about a second instead of the tens of seconds of `load_inline`), cached, loaded
through the CUDA driver API (`cuda-bindings`) and called with torch tensors::

    from pytest_kernelpro.optimize.build import load_cuda

    kernels = load_cuda(r'''
    extern "C" __global__ void add(const float* a, const float* b, float* out, long long n) {
        long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
        if (i < n) out[i] = a[i] + b[i];
    }
    ''')

    out = torch.empty_like(a)
    kernels.add(a, b, out, a.numel(), grid=(a.numel() + 255) // 256, block=256)

`load_cuda(source, *, name=None, arch=None, flags=(), cutlass=False, cache=None)`:
- `source`: the CUDA text, or a path to a `.cu` file (a `pathlib.Path`, or a str ending in
  `.cu` that names a file) - a patched user module can keep its kernel in a file beside it:
  `load_cuda(Path(__file__).with_name("my_kernel.cu"))`;
- `arch`: the compile target ("sm_90a"); default `$KERNELPRO_CUDA_ARCH`, else the current
  GPU's (sm_90 and sm_100 get their "a" target, needed for wgmma/TMA/tcgen05);
- `flags`: extra nvcc flags, optimization and code generation only (see `nvcc.check_flags`);
- `cutlass=True`: CUTLASS/CuTe include paths and flags (the nvidia-cutlass wheel or
  $CUTLASS_PATH);
- `cache`: a directory or `BuildCache`; default `$KERNELPRO_BUILD_CACHE`, else
  `~/.cache/kernelpro/build`.
The result's kernels take their arguments in declaration order (a pointer: a tensor or an
int address; a scalar: a Python number, converted to the declared C type) and the launch as
keywords: `grid`, `block` (an int or a 1 to 3-tuple), `shared_mem` (dynamic bytes; above
48 KiB the opt-in is set for you), `stream` (default: torch's current stream).
`module.cubin_path` is the cubin (for `cuobjdump --dump-sass`, `profile.sass`, ncu);
`module.build` says how it was built (cache key, hit, seconds, ptxas log).

The same call builds the same cubin in the search's sandbox and in the user's repository:
same source, flags, target and nvcc give the same cache key and the same binary.

Includes are limited to `#include <header>` from the toolkit (and CUTLASS with
`cutlass=True`); see `source.check_includes`.

Full path (device code that needs torch headers)
------------------------------------------------
`extension.build_extension(name, cpp_sources, cuda_sources, functions, extra_cflags=...,
extra_cuda_cflags=..., extra_include_paths=...)` takes what `load_inline` takes, and
`extension.import_extension` returns the same module, built through the cache: an identical extension is never rebuilt, and the
compiled host binding (`cpp_sources` + the generated pybind11 module, the torch/extension.h
half of a build) is reused when only the CUDA code changes. torch's headers go in front of
the CUDA code only when it uses torch. In the sandbox, a candidate's own `load_inline` calls
are routed there (`search.harness.cached_extension_builds`) when they use only the keywords
in `extension.SUPPORTED_KEYWORDS`; others go to torch unchanged.

Modules: `cache` (the cache: key, lock, atomic rename), `nvcc` (compiler, flags, trimmed
errors), `source` (include rule, kernel signatures), `launch` (driver API loading and
launches), `api` (`build_cuda`, `load_cuda`), `extension` (the full path), `prebuild` (static
extraction of a candidate's builds and the parallel builder the evaluator uses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_kernelpro.optimize.build.cache import BuildCache, BuildError, default_cache_dir

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.build.api import CudaBuild, build_cuda, load_cuda
    from pytest_kernelpro.optimize.build.launch import CudaKernel, CudaModule

__all__ = [
    "BuildCache",
    "BuildError",
    "CudaBuild",
    "CudaKernel",
    "CudaModule",
    "build_cuda",
    "default_cache_dir",
    "load_cuda",
]

_LAZY = {
    "CudaBuild": "pytest_kernelpro.optimize.build.api",
    "build_cuda": "pytest_kernelpro.optimize.build.api",
    "load_cuda": "pytest_kernelpro.optimize.build.api",
    "CudaKernel": "pytest_kernelpro.optimize.build.launch",
    "CudaModule": "pytest_kernelpro.optimize.build.launch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_kernelpro.optimize.build' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
