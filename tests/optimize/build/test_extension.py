"""The full path: load_inline-style extensions through the cache, the binding reused when
only the device code changes, and load_inline calls of a candidate routed there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.build import BuildCache
from pytest_kernelpro.optimize.build.extension import SUPPORTED_KEYWORDS, cached_load_inline
from pytest_kernelpro.optimize.build.prebuild import find_builds

CPP = (
    "void launch_scale(float* x, float s, int n);\n"
    "void scale(torch::Tensor x, double s) { launch_scale(x.data_ptr<float>(), (float)s, "
    "x.numel()); }"
)
CUDA = r"""
__global__ void scale_kernel(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
void launch_scale(float* x, float s, int n) { scale_kernel<<<(n + 255) / 256, 256>>>(x, s, n); }
"""
FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]

CANDIDATE = f'''
import torch
from torch.utils.cpp_extension import load_inline
CPP = {CPP!r}
ext = load_inline("scale_ext", cpp_sources=CPP, cuda_sources=r"""{CUDA}""", functions=["scale"],
                  extra_cuda_cflags={FLAGS!r}, verbose=False)
'''


def test_literal_load_inline_calls_are_found_for_building_ahead() -> None:
    (request,) = find_builds(CANDIDATE)
    assert request.kind == "extension"
    assert request.options["name"] == "scale_ext"
    assert request.options["cpp_sources"] == CPP
    assert "scale_kernel" in request.options["cuda_sources"]
    assert request.options["functions"] == ["scale"]
    assert "verbose" not in request.options
    # A keyword the cached path does not reproduce: left to torch, not built ahead.
    assert find_builds(CANDIDATE.replace("verbose=False", "extra_ldflags=['-lcublas']")) == []
    assert "extra_ldflags" not in SUPPORTED_KEYWORDS


def test_unsupported_load_inline_calls_go_to_torch_unchanged() -> None:
    seen = []

    def original(*args, **kwargs):
        seen.append((args, kwargs))
        return "torch's"

    patched = cached_load_inline(original)
    assert patched("x", "int f();", None, extra_ldflags=["-lcublas"]) == "torch's"
    assert patched("x", "int f();", None, with_cuda=False) == "torch's"
    assert seen[0][1] == {"extra_ldflags": ["-lcublas"]}
    assert patched.__wrapped__ is original


@pytest.fixture
def cuda_torch_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc, ninja and (on a CPU-only torch) empty libc10_cuda/libtorch_cuda to link with."""
    if shutil.which("nvcc") is None or shutil.which("ninja") is None:
        pytest.skip("needs nvcc and ninja (pip install ninja)")
    from pytest_kernelpro.optimize.build.nvcc import find_nvcc

    root = Path(find_nvcc()).parent.parent  # $CUDA_HOME, PATH, /usr/local/cuda
    if not (root / "lib64" / "libcudart.so").exists():
        root = Path("/usr/local/cuda")
    if not (root / "lib64" / "libcudart.so").exists():
        pytest.skip("no CUDA toolkit root with lib64/libcudart.so (set CUDA_HOME)")
    import torch

    monkeypatch.setenv("CUDA_HOME", str(root))
    lib_dirs = [str(root / "lib64")]
    if not (Path(torch.__file__).parent / "lib" / "libc10_cuda.so").exists():
        cc = shutil.which("cc") or pytest.skip("no C compiler for the stand-in libraries")
        stubs = tmp_path / "stubs"
        stubs.mkdir()
        for name in ("c10_cuda", "torch_cuda"):
            subprocess.run([cc, "-shared", "-x", "c", "-", "-o", str(stubs / f"lib{name}.so")],
                           input="", text=True, check=True, timeout=60)  # fmt: skip
        lib_dirs.insert(0, str(stubs))
    monkeypatch.setenv("LIBRARY_PATH", ":".join(lib_dirs))
    monkeypatch.setenv("LD_LIBRARY_PATH", ":".join(lib_dirs))


@pytest.mark.slow
def test_device_change_reuses_the_binding_and_identical_builds_hit(
    cuda_torch_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_kernelpro.optimize.build.extension import build_extension, import_extension

    # Another copy of the package in the caller's directory must not shadow this one in the
    # build's child process (a repository checkout next to an installed plugin).
    decoy = tmp_path / "cwd" / "pytest_kernelpro"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    monkeypatch.chdir(decoy.parent)
    cache = BuildCache(tmp_path / "cache")
    first = build_extension("scale", CPP, CUDA, ["scale"], extra_cuda_cflags=FLAGS, cache=cache)
    binding_object = cache.root / "ext-build" / first.binding_key / "main.o"
    compiled_at = binding_object.stat().st_mtime_ns
    changed = CUDA.replace("x[i] *= s", "x[i] = x[i] * s + 0.0f")
    second = build_extension("scale", CPP, changed, ["scale"], extra_cuda_cflags=FLAGS, cache=cache)
    again = build_extension("scale", CPP, CUDA, ["scale"], extra_cuda_cflags=FLAGS, cache=cache)
    assert (first.hit, second.hit, again.hit) == (False, False, True)
    assert first.binding_key == second.binding_key
    assert first.key != second.key
    assert not first.binding_reused
    assert second.binding_reused  # main.o was kept: only cuda.cu was compiled
    assert binding_object.stat().st_mtime_ns == compiled_at  # ninja did not recompile it
    assert first.path.is_file()
    assert second.path.is_file()
    assert first.path != second.path
    module = import_extension(again)
    assert callable(module.scale)

    # A candidate's own load_inline under the profiler's capture: routed through the cache
    # (the binding is reused), reported to the capture with the profiler's flags and ptxas.
    import torch.utils.cpp_extension as cpp_extension

    from pytest_kernelpro.optimize.build.extension import cached_extension_builds
    from pytest_kernelpro.profile.capture import capture_extensions

    with capture_extensions(("-lineinfo", "-Xptxas=-v")) as capture, cached_extension_builds(cache):
        routed = cpp_extension.load_inline(
            "scale_ext", cpp_sources=CPP, cuda_sources=CUDA, functions=["scale"],
            extra_cuda_cflags=FLAGS,
        )  # fmt: skip
    assert callable(routed.scale)
    (seen,) = capture.builds
    assert seen.error is None
    assert seen.so_path is not None
    assert Path(seen.so_path).is_file()
    assert str(cache.root) in seen.so_path
    assert {"-lineinfo", "-Xptxas=-v"} <= set(seen.extra_cuda_cflags)
    assert any(report.registers for report in seen.ptxas), seen.build_log[-2000:]
