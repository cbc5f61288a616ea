"""Fixtures of the profile tests: the H200 capture files, an nvcc-built cubin, and a
load_inline extension built (compile and link only, no GPU) under capture_extensions."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_kernelpro.profile.binaries import find_tool

DATA = Path(__file__).resolve().parent.parent / "data" / "profile"


def data_text(name: str) -> str:
    """A file of tests/data/profile as text."""
    return (DATA / name).read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def probe_csv() -> str:
    return data_text("ncu_raw.csv")


@pytest.fixture(scope="session")
def probe_catalog() -> str:
    return data_text("ncu_query_metrics.txt")


@pytest.fixture(scope="session")
def tool_or_skip():
    """`tool_or_skip("nvcc")`: the tool's path, or a skip naming the missing tool."""
    return require_tool


def require_tool(name: str) -> str:
    """Path of a CUDA tool, or skip the test saying which tool is missing and how to get it."""
    path = find_tool(name)
    if path is None:
        hint = {
            "nvcc": "install the CUDA toolkit (nvcc) to compile the test kernels",
            "cuobjdump": "pip install nvidia-cuda-cuobjdump",
            "nvdisasm": "pip install nvidia-cuda-nvdisasm (cuobjdump --dump-sass runs it)",
        }.get(name, f"install {name}")
        pytest.skip(f"{name} not found: {hint}")
    return path


def cuda_root() -> str | None:
    """A CUDA toolkit root with nvcc and libcudart, for building torch extensions."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for root in candidates:
        if not root:
            continue
        base = Path(root)
        libs = [base / "lib64" / "libcudart.so", base / "lib" / "libcudart.so"]
        if (base / "bin" / "nvcc").exists() and any(p.exists() for p in libs):
            return str(base)
    return None


@dataclass(frozen=True)
class Cubin:
    path: Path
    ptxas_log: str


@pytest.fixture(scope="session")
def sass_cubin(tmp_path_factory: pytest.TempPathFactory) -> Cubin:
    """tests/data/profile/sass_kernels.cu compiled for sm_90a, with its ptxas report."""
    nvcc = require_tool("nvcc")
    out = tmp_path_factory.mktemp("cubin") / "sass_kernels.cubin"
    completed = subprocess.run(
        [
            nvcc,
            "-cubin",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-Xptxas=-v",
            "-lineinfo",
            "-o",
            str(out),
            str(DATA / "sass_kernels.cu"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return Cubin(out, completed.stdout + completed.stderr)


EXTENSION_SOURCE = r"""
__global__ void scale_kernel(float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
extern "C" void launch_scale(float* x, float s, int n) {
  scale_kernel<<<(n + 255) / 256, 256>>>(x, s, n);
}
"""


@dataclass
class BuiltExtension:
    capture: object  # ExtensionCapture
    result: object  # what load_inline returned
    build_directory: Path
    load_kwargs: dict

    def kwargs(self, **changes: object) -> dict:
        """A fresh copy of the load_inline keywords (torch mutates the lists it is given)."""
        return {**copy.deepcopy(self.load_kwargs), **changes}


def extension_kwargs(build_directory: Path, stubs: Path | None) -> dict:
    """load_inline keywords for a header-free CUDA extension that links on a CPU-only torch."""
    ldflags = []
    if stubs is not None:
        ldflags += [f"-L{stubs}", f"-Wl,-rpath,{stubs}"]
    root = cuda_root()
    if root is not None:
        ldflags.append(f"-Wl,-rpath,{Path(root) / 'lib64'}")
    return {
        "cuda_sources": EXTENSION_SOURCE,
        "extra_cuda_cflags": ["-gencode=arch=compute_90a,code=sm_90a"],
        "extra_ldflags": ldflags,
        "build_directory": str(build_directory),
        "no_implicit_headers": True,
        "is_python_module": False,
    }


def torch_stub_libraries(folder: Path) -> Path | None:
    """A CPU-only torch has no libc10_cuda/libtorch_cuda, which cpp_extension links for CUDA
    sources; empty stand-ins let the link finish (the test kernel uses neither)."""
    import torch

    lib = Path(torch.__file__).parent / "lib"
    if (lib / "libc10_cuda.so").exists():
        return None
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("c++")
    if cc is None:
        pytest.skip("no C compiler to build the libc10_cuda/libtorch_cuda stand-ins")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("c10_cuda", "torch_cuda"):
        subprocess.run(
            [cc, "-shared", "-x", "c", "-", "-o", str(folder / f"lib{name}.so")],
            input="",
            text=True,
            check=True,
            timeout=60,
        )
    return folder


@pytest.fixture(scope="session")
def cuda_extension_env():
    """Point cpp_extension at a CUDA toolkit (a CPU-only torch leaves CUDA_HOME unset)."""
    require_tool("nvcc")
    torch_ext = pytest.importorskip("torch.utils.cpp_extension")
    root = cuda_root()
    if root is None:
        pytest.skip("no CUDA toolkit root with bin/nvcc and libcudart (set CUDA_HOME)")
    if not shutil.which("ninja"):
        pytest.skip("ninja not found: pip install ninja (torch extensions build with it)")
    with pytest.MonkeyPatch.context() as mp:
        if torch_ext.CUDA_HOME is None:
            mp.setattr(torch_ext, "CUDA_HOME", root)
        yield torch_ext


@pytest.fixture(scope="session")
def built_extension(tmp_path_factory: pytest.TempPathFactory, cuda_extension_env) -> BuiltExtension:
    """A real load_inline build of EXTENSION_SOURCE inside capture_extensions."""
    from pytest_kernelpro.profile.capture import capture_extensions

    root = tmp_path_factory.mktemp("ext")
    stubs = torch_stub_libraries(root / "stubs")
    build = root / "build"
    build.mkdir()
    kwargs = extension_kwargs(build, stubs)
    # torch appends its own libraries to the extra_ldflags list it is given, so a reused
    # list changes the build arguments and bumps the module version: keep a pristine copy.
    with capture_extensions() as capture:
        result = cuda_extension_env.load_inline("kp_scale_ext", "", **copy.deepcopy(kwargs))
    return BuiltExtension(capture, result, build, kwargs)
