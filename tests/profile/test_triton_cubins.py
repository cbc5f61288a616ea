"""SASS of Triton kernels from the cubins of a Triton cache: a real sm_90a cubin compiled here
with nvcc, laid out as Triton lays out a cache entry, read with cuobjdump."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from pytest_kernelpro.analysis.core import RooflineFacts, analyze_report
from pytest_kernelpro.profile.model import KernelMetrics, KernelProfile, ProfileReport
from pytest_kernelpro.profile.render import render_profile_section
from pytest_kernelpro.profile.triton_cubins import (
    attach_triton_sass,
    fresh_triton_cubins,
    triton_cache_dir,
)

# A Triton kernel's symbol is its plain (extern "C") function name.
KERNEL_SOURCE = r"""
extern "C" __global__ void add_vec4(const float4* __restrict__ x, const float4* __restrict__ y,
                                    float4* __restrict__ out, int n4) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 a = x[i], b = y[i];
    out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}
"""


@pytest.fixture(scope="module")
def add_cubin(tmp_path_factory: pytest.TempPathFactory, tool_or_skip) -> bytes:
    nvcc = tool_or_skip("nvcc")
    tool_or_skip("cuobjdump")
    tool_or_skip("nvdisasm")
    work = tmp_path_factory.mktemp("triton-src")
    source = work / "add_vec4.cu"
    source.write_text(KERNEL_SOURCE, encoding="utf-8")
    out = work / "add_vec4.cubin"
    completed = subprocess.run(
        [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return out.read_bytes()


def cache_entry(
    cache: Path,
    digest: str,
    name: str,
    cubin: bytes,
    mtime: float | None = None,
    num_warps: int = 4,
) -> Path:
    """`<cache>/<digest>/<name>.cubin` + `<name>.json`, as Triton's cache writes them."""
    entry = cache / digest
    entry.mkdir(parents=True)
    (entry / f"{name}.json").write_text(
        json.dumps({"name": name, "num_warps": num_warps, "shared": 0}), encoding="utf-8"
    )
    (entry / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {}}), encoding="utf-8")
    path = entry / f"{name}.cubin"
    path.write_bytes(cubin)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def report_of(*names: str) -> ProfileReport:
    return ProfileReport(
        arch="sm_90",
        kernels=[KernelProfile(name=n, metrics=KernelMetrics(kernel_name=n)) for n in names],
    )


def test_matching_kernel_gets_the_sass_of_its_fresh_cubin(tmp_path: Path, add_cubin) -> None:
    cache = tmp_path / "cache"
    since = time.time() - 5
    cubin = cache_entry(cache, "a1b2", "add_vec4", add_cubin)
    report = report_of("add_vec4", "void at::native::vectorized_elementwise_kernel<4>(int)")

    attach_triton_sass(report, since=since, cache_dir=cache)

    triton, torch_kernel = report.kernels
    assert triton.sass is not None
    assert triton.sass_source == str(cubin)
    assert triton.sass.function == "add_vec4"
    # Real cuobjdump counts: two 128-bit loads and one 128-bit store per thread.
    assert dict(triton.sass.global_load_widths) == {128: 2}
    assert dict(triton.sass.global_store_widths) == {128: 1}
    assert triton.sass.count("FADD") == 4
    assert triton.sass.total_instructions > 0
    # The PyTorch kernel has no cubin: it keeps a note naming what was looked for.
    assert torch_kernel.sass is None
    notes = [n.why for n in report.not_collected if n.what == "sass"]
    assert len(notes) == 1
    assert "vectorized_elementwise_kernel" in notes[0]
    assert str(cache) in notes[0]
    assert "1 fresh cubins" in notes[0]
    assert f"sass read from {cubin}" in render_profile_section(report)


def test_sass_of_a_triton_kernel_reaches_the_guidance(tmp_path: Path, add_cubin) -> None:
    cache = tmp_path / "cache"
    cache_entry(cache, "a1b2", "add_vec4", add_cubin)
    report = report_of("add_vec4")
    attach_triton_sass(report, since=time.time() - 5, cache_dir=cache)
    analysis = analyze_report(report, RooflineFacts(bound="memory"))
    section = analysis.guidance_md.split("### SASS summary", 1)[1].split("###", 1)[0]
    assert "`add_vec4` (sm_90):" in section
    assert "not collected" not in section
    restored = ProfileReport.from_dict(report.to_dict())
    assert restored.kernels[0].sass == report.kernels[0].sass
    assert restored.kernels[0].sass_source == report.kernels[0].sass_source


def test_cubin_older_than_the_run_is_ignored(tmp_path: Path, add_cubin) -> None:
    cache = tmp_path / "cache"
    since = time.time()
    cache_entry(cache, "old0", "add_vec4", add_cubin, mtime=since - 3600)
    report = report_of("add_vec4")

    attach_triton_sass(report, since=since, cache_dir=cache)

    assert report.kernels[0].sass is None
    assert fresh_triton_cubins(cache, since) == []
    (note,) = [n.why for n in report.not_collected if n.what == "sass"]
    assert "looked for add_vec4" in note
    assert "0 fresh cubins" in note


def test_newest_fresh_cubin_of_a_name_wins(tmp_path: Path, add_cubin) -> None:
    cache = tmp_path / "cache"
    since = time.time() - 100
    cache_entry(cache, "older", "add_vec4", add_cubin, mtime=since + 10)
    newer = cache_entry(cache, "newer", "add_vec4", add_cubin, mtime=since + 20)
    report = report_of("add_vec4")
    attach_triton_sass(report, since=since, cache_dir=cache)
    assert report.kernels[0].sass_source == str(newer)
    assert not [n for n in report.not_collected if n.what == "sass"]


def test_autotuned_configs_pick_the_cubin_whose_warps_fit_the_block(
    tmp_path: Path, add_cubin
) -> None:
    cache = tmp_path / "cache"
    since = time.time() - 100
    four = cache_entry(cache, "w4", "add_vec4", add_cubin, mtime=since + 10, num_warps=4)
    cache_entry(cache, "w8", "add_vec4", add_cubin, mtime=since + 20, num_warps=8)
    report = ProfileReport(
        kernels=[
            KernelProfile(
                name="add_vec4",
                metrics=KernelMetrics(kernel_name="add_vec4", block_size=(128, 1, 1)),
            )
        ]
    )
    attach_triton_sass(report, since=since, cache_dir=cache)
    assert report.kernels[0].sass_source == str(four)  # 4 warps = 128 threads, not the newest


def test_entry_without_readable_metadata_is_skipped(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "x").mkdir(parents=True)
    (cache / "x" / "k.json").write_text("{not json", encoding="utf-8")
    (cache / "x" / "k.cubin").write_bytes(b"\0")
    assert fresh_triton_cubins(cache, 0.0) == []
    assert fresh_triton_cubins(tmp_path / "absent", 0.0) == []


def test_cache_directory_follows_triton_environment(tmp_path: Path) -> None:
    assert triton_cache_dir({"TRITON_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert triton_cache_dir({"TRITON_HOME": "/th", "HOME": "/h"}) == Path("/th/.triton/cache")
    assert triton_cache_dir({"HOME": "/h"}) == Path("/h/.triton/cache")


# --- A profile's own Triton cache -----------------------------------------------------------


def fake_profile_runs(
    monkeypatch: pytest.MonkeyPatch, cubin: bytes, digest: str, seen: dict[str, object]
) -> None:
    """The profile's children as on the GPU, without one: the ncu run 'compiles' the Triton
    kernel into the cache its spec names, as Triton does on a cache miss, and reports one
    launch of it; the timeline run records which cache it was given and what was in it."""
    from pytest_kernelpro.profile import collect
    from pytest_kernelpro.profile.model import NotCollected
    from pytest_kernelpro.profile.ncu import NcuResult

    monkeypatch.setattr(collect, "_gpu_problem", lambda device: None)

    def timeline(python: str, spec_path: str, output: str, timeout_s: float) -> NotCollected:
        spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
        seen["timeline_cache"] = spec.get("triton_cache_dir")
        if spec.get("triton_cache_dir"):
            seen["linked"] = sorted(p.name for p in Path(spec["triton_cache_dir"]).iterdir())
        return NotCollected("timeline", "not run here")

    def ncu(request, **_: object) -> NcuResult:
        spec = json.loads(Path(request.target_command[-1]).read_text(encoding="utf-8"))
        seen["ncu_cache"] = spec.get("triton_cache_dir")
        cache_entry(Path(spec["triton_cache_dir"]), digest, "add_vec4", cubin)
        return NcuResult(kernels=[KernelMetrics(kernel_name="add_vec4", block_size=(128, 1, 1))])

    monkeypatch.setattr(collect, "_run_timeline_child", timeline)
    monkeypatch.setattr(collect, "run_ncu", ncu)
    monkeypatch.setattr(collect, "nsys_status", lambda: "nsys not here")


def test_a_kernel_cached_by_an_earlier_session_gets_the_sass_its_profile_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, add_cubin
) -> None:
    """The user's cache already holds the kernel (an hour old: a cache hit, nothing fresh)
    and another entry of the same name (another shape's specialization). The profile's runs
    compile into their own cache; its cubin is read, and named by the user's entry of the
    same key, which outlives the profile."""
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.profile import collect

    user_cache = tmp_path / "user-cache"
    hour_ago = time.time() - 3600
    same_key = cache_entry(user_cache, "samekey", "add_vec4", add_cubin, mtime=hour_ago)
    cache_entry(user_cache, "othershape", "add_vec4", add_cubin, mtime=hour_ago + 60)
    launcher = user_cache / "launcher0"
    launcher.mkdir()
    (launcher / "__triton_launcher.so").write_bytes(b"\x7fELF")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(user_cache))
    seen: dict[str, object] = {}
    fake_profile_runs(monkeypatch, add_cubin, "samekey", seen)

    report = collect.profile_kernel_item(ProblemLocator(str(tmp_path / "k.py"), "kernel"))

    private = seen["ncu_cache"]
    assert isinstance(private, str)
    assert private == seen["timeline_cache"]
    assert not private.startswith(str(user_cache))
    # Only the host-compiled module is linked in: the kernels are compiled anew.
    assert seen["linked"] == ["launcher0"]
    (kernel,) = report.kernels
    assert kernel.sass is not None
    assert kernel.sass.function == "add_vec4"
    assert kernel.sass_source == str(same_key)
    assert not Path(private).exists()  # the private cache went with the profile
    assert not [n for n in report.not_collected if n.what == "sass"]


def test_a_kernel_only_the_profile_compiled_names_its_private_cubin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, add_cubin
) -> None:
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.profile import collect

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "empty-user-cache"))
    seen: dict[str, object] = {}
    fake_profile_runs(monkeypatch, add_cubin, "fresh", seen)

    report = collect.profile_kernel_item(ProblemLocator(str(tmp_path / "k.py"), "kernel"))

    (kernel,) = report.kernels
    assert kernel.sass is not None
    assert kernel.sass_source == str(Path(str(seen["ncu_cache"])) / "fresh" / "add_vec4.cubin")


def test_a_caller_with_its_own_cache_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, add_cubin
) -> None:
    """The candidate profiler's child: its scratch cache is private already (cubins_since
    0), so the runs get no other and every cubin there counts, whatever its age."""
    from pytest_kernelpro.problem import ProblemLocator
    from pytest_kernelpro.profile import collect

    scratch_cache = tmp_path / "scratch-cache"
    seeded = cache_entry(scratch_cache, "seed", "add_vec4", add_cubin, mtime=time.time() - 600)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(scratch_cache))
    seen: dict[str, object] = {}
    fake_profile_runs(monkeypatch, add_cubin, "seed2", seen)
    from pytest_kernelpro.profile.ncu import NcuResult

    def ncu(request, **_: object) -> NcuResult:  # a cache hit: nothing compiled
        spec = json.loads(Path(request.target_command[-1]).read_text(encoding="utf-8"))
        seen["ncu_cache"] = spec.get("triton_cache_dir")
        return NcuResult(kernels=[KernelMetrics(kernel_name="add_vec4")])

    monkeypatch.setattr(collect, "run_ncu", ncu)

    report = collect.profile_kernel_item(
        ProblemLocator(str(tmp_path / "k.py"), "kernel"), cubins_since=0.0
    )

    assert seen["timeline_cache"] is None
    assert seen["ncu_cache"] is None
    assert report.kernels[0].sass_source == str(seeded)


def test_the_profile_target_uses_the_cache_its_spec_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_kernelpro.profile import target

    monkeypatch.setenv("TRITON_CACHE_DIR", "/before")
    seen: list[str | None] = []
    monkeypatch.setattr(
        target, "run_spec", lambda spec: seen.append(os.environ.get("TRITON_CACHE_DIR"))
    )
    spec = {"problem_file": "p.py", "qualname": "k", "triton_cache_dir": str(tmp_path / "c")}
    assert target.main([json.dumps(spec)]) == 0
    assert seen == [str(tmp_path / "c")]


def test_a_candidates_profile_summary_names_each_kernels_sass_and_its_cubin(
    tmp_path: Path, add_cubin
) -> None:
    """What a search's trajectory keeps per candidate (`metrics["profile"]`)."""
    from pytest_kernelpro.optimize.candidate_profile.evaluator import _attach
    from pytest_kernelpro.optimize.search import Evaluation

    cubin = cache_entry(tmp_path / "cache", "a1b2", "add_vec4", add_cubin)
    report = report_of("add_vec4", "at::native::elementwise_kernel")
    attach_triton_sass(report, since=0.0, cache_dir=tmp_path / "cache")
    analysis = analyze_report(report, RooflineFacts(bound="memory"))
    evaluation = Evaluation(status="correct")
    _attach(evaluation, analysis.to_dict(), 1.5)
    summary = evaluation.metrics["profile"]
    assert summary["sass"] is True
    (kernel,) = summary["sass_kernels"]
    assert kernel == {
        "kernel": "add_vec4",
        "instructions": report.kernels[0].sass.total_instructions,
        "source": str(cubin),
    }
    assert kernel["instructions"] > 0
    # The SASS-reading tools ran on the Triton kernel; on the kernel without SASS they are
    # skipped for the missing input.
    assert {"vectorization", "async_copy"} <= set(summary["tools_ran"])
    lacking = summary["tools_lacking_inputs"]
    assert "vectorization on at::native::elementwise_kernel: sass" in lacking
    assert not [
        t for t in lacking if t.startswith(("vectorization on add_vec4", "async_copy on add_vec4"))
    ]
