"""The fast path on the CPU: nvcc to a cubin through the cache, errors, SASS, packing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from buildkit import ADD_SOURCE, ARCH, require_tool

from pytest_kernelpro.optimize.build import BuildCache, BuildError, build_cuda, load_cuda
from pytest_kernelpro.optimize.build.source import SourceError

MMA_SOURCE = r"""
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;
// One warp computes a 16x16 tile of C = A (16x16, row-major) * B (16x16, col-major).
extern "C" __global__ void wmma_tile(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""


def test_miss_then_hit_with_the_same_cubin(nvcc: str, cache: BuildCache) -> None:
    first = build_cuda(ADD_SOURCE, arch=ARCH, cache=cache, nvcc=nvcc)
    second = build_cuda(ADD_SOURCE, arch=ARCH, cache=cache, nvcc=nvcc)
    assert (first.hit, second.hit) == (False, True)
    assert first.key == second.key
    assert first.cubin_path == second.cubin_path
    assert first.cubin_path.read_bytes()[:4] == b"\x7fELF"
    assert first.compile_s > 0
    assert "Used" in first.log
    assert "registers" in first.log
    assert sorted(first.kernels) == ["add"]
    # Another flag is another build.
    fast_math = build_cuda(ADD_SOURCE, arch=ARCH, cache=cache, nvcc=nvcc, flags=["--use_fast_math"])
    assert not fast_math.hit
    assert fast_math.key != first.key


def test_two_processes_building_one_source_compile_once(nvcc: str, tmp_path: Path) -> None:
    """Both start together; one compiles, the other waits on the lock and gets the entry."""
    source = tmp_path / "add.cu"
    source.write_text(ADD_SOURCE)
    script = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        from pytest_kernelpro.optimize.build import build_cuda
        sys.stdin.readline()  # both processes are up: start together
        b = build_cuda(Path({str(source)!r}), arch={ARCH!r}, cache={str(tmp_path / "c")!r},
                       nvcc={nvcc!r})
        print(json.dumps({{"hit": b.hit, "cubin": str(b.cubin_path), "waited": b.seconds}}))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        for _ in range(2)
    ]  # fmt: skip
    outs = [p.communicate("go\n", timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert sorted(r["hit"] for r in results) == [False, True]
    assert results[0]["cubin"] == results[1]["cubin"]
    assert Path(results[0]["cubin"]).is_file()


def test_compile_error_is_trimmed_and_cached(nvcc: str, cache: BuildCache) -> None:
    broken = ADD_SOURCE.replace("a[i] + b[i]", "a[i] + bogus[i]")
    with pytest.raises(BuildError) as first:
        build_cuda(broken, arch=ARCH, cache=cache, nvcc=nvcc)
    message = first.value.message
    assert 'kernel.cu(5): error: identifier "bogus" is undefined' in message
    assert "a[i] + bogus[i]" in message
    assert "^" in message
    assert "1 error detected" in message
    assert str(cache.root) not in message
    assert "/tmp" not in message
    with pytest.raises(BuildError) as again:
        build_cuda(broken, arch=ARCH, cache=cache, nvcc=nvcc)
    assert again.value.cached
    assert again.value.message == message


def test_many_errors_are_cut_to_what_a_prompt_needs(nvcc: str, cache: BuildCache) -> None:
    lines = "\n".join(f"    out[{i}] = undefined_{i};" for i in range(30))
    source = f'extern "C" __global__ void k(float* out) {{\n{lines}\n}}\n'
    with pytest.raises(BuildError) as caught:
        build_cuda(source, arch=ARCH, cache=cache, nvcc=nvcc)
    message = caught.value.message
    assert message.count("error:") <= 8
    assert "more error(s)]" in message
    assert len(message) <= 2200
    assert "undefined_0" in message
    assert "30 errors detected" in message
    assert len(caught.value.log) > len(message)


def test_fast_path_cubin_is_read_by_the_sass_analysis(nvcc: str, cache: BuildCache) -> None:
    require_tool("cuobjdump")
    from pytest_kernelpro.profile.sass import sass_of_module

    module = load_cuda(MMA_SOURCE, arch=ARCH, cache=cache, nvcc=nvcc)  # no GPU needed to build
    summaries = sass_of_module(str(module.cubin_path), arch="sm_90a")
    assert not hasattr(summaries, "reason"), summaries
    assert set(summaries) == {"wmma_tile"}  # extern "C": the name is not mangled
    counts = summaries["wmma_tile"]
    assert counts.counts.get("MMA_SYNC", 0) >= 1, counts.counts  # the WMMA became HMMA


def test_include_rule_refuses_reading_other_files(cache: BuildCache) -> None:
    for include in ('"/etc/passwd"', "</etc/passwd>", "<../../etc/passwd>", "SECRET_FILE"):
        source = f"#include {include}\n" + ADD_SOURCE
        with pytest.raises(SourceError, match="is not allowed"):
            build_cuda(source, arch=ARCH, cache=cache)


def test_flags_that_name_files_are_refused(cache: BuildCache) -> None:
    for flag in ("-I/etc", "-include=/etc/passwd", "-Xcompiler=-fplugin=x.so", "-o/tmp/x"):
        with pytest.raises(BuildError, match="not allowed"):
            build_cuda(ADD_SOURCE, arch=ARCH, cache=cache, flags=[flag])


def test_source_without_c_kernels_says_how_to_declare_them(cache: BuildCache) -> None:
    with pytest.raises(SourceError, match='extern "C" __global__'):
        build_cuda("__global__ void k(float* x) { x[0] = 1; }", arch=ARCH, cache=cache)


def test_loading_from_a_file_path(nvcc: str, cache: BuildCache, tmp_path: Path) -> None:
    path = tmp_path / "my_kernel.cu"
    path.write_text(ADD_SOURCE)
    from_file = load_cuda(path, arch=ARCH, cache=cache, nvcc=nvcc)
    from_str = load_cuda(str(path), arch=ARCH, cache=cache, nvcc=nvcc)
    from_text = load_cuda(ADD_SOURCE, arch=ARCH, cache=cache, nvcc=nvcc)
    assert from_file.build["key"] == from_str.build["key"] == from_text.build["key"]
    assert from_file.build["name"] == "my_kernel"
    assert from_str.build["hit"]
    with pytest.raises(AttributeError, match="kernels: add"):
        _ = from_file.sub


# The end of a failed load_inline build as torch reports it (ninja's lines, the compiler
# command lines, then gcc's diagnostic); paths shortened.
NINJA_LOG = """Error building extension 'kp_ext_d4541fd65bb5b250': [1/3] /usr/local/cuda/bin/nvcc \
-DTORCH_EXTENSION_NAME=kp_ext_d4541fd65bb5b250 -isystem /torch/include -O3 -c cuda.cu -o cuda.cuda.o
[2/3] c++ -MMD -MF main.o.d -isystem /torch/include -fPIC -std=c++20 -c main.cpp -o main.o
FAILED: [code=1] main.o
c++ -MMD -MF main.o.d -isystem /torch/include -fPIC -std=c++20 -c main.cpp -o main.o
In file included from main.cpp:2:
main.cpp:7:5: error: 'launch_scal' was not declared in this scope; did you mean 'launch_scale'?
    7 |     launch_scal(x.data_ptr<float>(), (float)s, x.numel());
      |     ^~~~~~~~~~~
ninja: build stopped: subcommand failed.
"""


def test_ninja_output_is_trimmed_to_the_diagnostics() -> None:
    from pytest_kernelpro.optimize.build.nvcc import trim_compiler_log

    trimmed = trim_compiler_log(NINJA_LOG)
    assert trimmed.splitlines()[0].startswith("main.cpp:7:5: error: 'launch_scal' was not")
    assert "^~~~" in trimmed
    assert "-isystem" not in trimmed
    assert "ninja:" not in trimmed
