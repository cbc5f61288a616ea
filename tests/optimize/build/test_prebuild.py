"""Builds read from a candidate without running it, built ahead in parallel, and the
sandboxed evaluator using them (build time and the trimmed compiler error in its result)."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildkit import ADD_SOURCE, ARCH, CANDIDATE

from pytest_kernelpro.optimize.build import BuildCache, build_cuda
from pytest_kernelpro.optimize.build.prebuild import Prebuilder, find_builds


def test_literal_sources_and_options_are_found_without_running_the_code() -> None:
    (request,) = find_builds(CANDIDATE)
    assert request.source.startswith("\n#include <cuda_fp16.h>")
    assert "OFFSET" in request.source
    assert request.options == {"name": "add", "flags": ["-DOFFSET=0.0f"]}
    assert CANDIDATE.splitlines()[request.line - 1].startswith("kernels = load_cuda(")


def test_unresolvable_builds_are_left_to_the_worker() -> None:
    code = '''
from pytest_kernelpro import build
src = make_source()
a = build.load_cuda(src)
b = build.load_cuda(f"{src}")
c = build.load_cuda("kernels/add.cu")
d = build.load_cuda(r"""extern "C" __global__ void k() {}""", flags=compute_flags())
e = build.load_cuda(source="""extern "C" __global__ void k2() {}""", cutlass=True)
'''
    found = find_builds(code)
    assert [r.source for r in found] == ['extern "C" __global__ void k2() {}']
    assert found[0].options == {"cutlass": True}
    assert find_builds("this is ( not python") == []


def test_an_expansion_builds_in_parallel_and_the_worker_key_matches(
    nvcc: str, cache: BuildCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_HOME", str(Path(nvcc).resolve().parent.parent))
    other = CANDIDATE.replace("OFFSET=0.0f", "OFFSET=1.0f")
    builder = Prebuilder(cache, arch=ARCH, jobs=2)
    try:
        builder.submit_many([CANDIDATE, other, "class ModelNew: pass"])
        first, second = builder.wait(CANDIDATE), builder.wait(other)
        assert builder.wait("class ModelNew: pass") is None
    finally:
        builder.close()
    assert first is not None
    assert second is not None
    assert first.errors == []
    assert len(first.builds) == 1
    assert not first.builds[0]["hit"]
    assert first.builds[0]["key"] != second.builds[0]["key"]
    assert first.build_s > 0
    assert first.compile_s > 0
    # What the candidate's own load_cuda computes in the worker: a hit, read-only.
    (request,) = find_builds(CANDIDATE)
    reader = BuildCache(cache.root, writable=False)
    again = build_cuda(request.source, arch=ARCH, cache=reader, **request.options)
    assert again.hit
    assert again.key == first.builds[0]["key"]


def test_a_compile_error_found_ahead_is_cached_for_the_worker(nvcc: str, cache: BuildCache) -> None:
    broken = CANDIDATE.replace("a[i] + b[i]", "a[i] + c[i]")
    builder = Prebuilder(cache, arch=ARCH, jobs=1)
    try:
        result = builder.wait(broken)
    finally:
        builder.close()
    assert result is not None
    assert result.builds == []
    assert len(result.errors) == 1
    assert 'identifier "c" is undefined' in result.errors[0]


def test_source_in_a_build_is_the_same_as_the_conftest_kernel() -> None:
    # Guard for the constant above: the kernel the tests build is the shared one plus OFFSET.
    assert "a[i] + b[i]" in ADD_SOURCE
    assert "a[i] + b[i] + OFFSET" in CANDIDATE


def test_the_prompt_example_is_a_fast_path_candidate(nvcc: str, cache: BuildCache) -> None:
    """The build form the Programmer is shown resolves ahead and compiles."""
    from pytest_kernelpro.optimize.agents.prompts.builder import PARTS_DIR

    text = (PARTS_DIR / "build_form.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    (request,) = find_builds(code)
    build = build_cuda(request.source, arch=ARCH, cache=cache, nvcc=nvcc, **request.options)
    assert [p.kind for p in build.kernels["scale_add"].params] == [
        "pointer", "pointer", "pointer", "float", "int",
    ]  # fmt: skip
    assert "kernels.scale_add(x, y, out, 2.0, n, grid=" in code
