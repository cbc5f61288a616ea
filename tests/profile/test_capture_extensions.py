"""load_inline capture with real builds: nvcc compiles and links here (no GPU needed)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from pytest_kernelpro.profile.capture import BUILD_LOG_NAME, capture_extensions
from pytest_kernelpro.profile.model import NotCollected
from pytest_kernelpro.profile.sass import sass_of_module
from pytest_kernelpro.profile.symbols import entry_points, read_module_symbols


def test_build_is_recorded_and_the_return_value_untouched(built_extension) -> None:
    (build,) = built_extension.capture.builds
    assert built_extension.result == build.so_path  # is_python_module=False returns the path
    assert Path(build.so_path).name == "kp_scale_ext.so"
    assert build.build_directory == str(built_extension.build_directory)
    assert build.error is None
    assert build.log_source == "ninja"
    # the user's flag first, the profiling flags appended once
    assert build.extra_cuda_cflags == (
        "-gencode=arch=compute_90a,code=sm_90a",
        "-lineinfo",
        "-Xptxas=-v",
    )
    assert "nvcc" in build.build_log
    assert "ptxas info" in build.build_log
    (ptxas,) = build.ptxas
    assert ptxas.function == "_Z12scale_kernelPffi"
    assert ptxas.arch == "sm_90a"
    assert 0 < ptxas.registers <= 32
    assert ptxas.spill_store_bytes == 0
    assert build.build_seconds > 0
    assert (built_extension.build_directory / BUILD_LOG_NAME).exists()
    assert built_extension.capture.so_paths == [build.so_path]


def test_captured_module_gives_entry_points_and_sass(built_extension, tool_or_skip) -> None:
    tool_or_skip("cuobjdump")
    tool_or_skip("nvdisasm")
    so = built_extension.capture.so_paths[0]
    symbols = read_module_symbols(so)
    assert not isinstance(symbols, NotCollected), symbols
    assert entry_points(symbols) == ["_Z12scale_kernelPffi"]
    sass = sass_of_module(so)
    assert not isinstance(sass, NotCollected), sass
    summary = sass["_Z12scale_kernelPffi"]
    assert summary.function.startswith("scale_kernel(")
    assert summary.count("FMUL") == 1
    assert dict(summary.global_load_widths) == {32: 1}


def test_patch_is_restored(cuda_extension_env) -> None:
    original = cuda_extension_env._jit_compile
    with capture_extensions():
        assert cuda_extension_env._jit_compile is not original
        assert cuda_extension_env.subprocess is not subprocess
        with capture_extensions():
            pass
        assert cuda_extension_env._jit_compile is not original  # the outer block still open
    assert cuda_extension_env._jit_compile is original
    assert cuda_extension_env.subprocess is subprocess


def test_cached_build_reads_the_saved_ptxas_log(built_extension, cuda_extension_env) -> None:
    """A second load in the same process runs no ninja; the record still has the report."""
    with capture_extensions() as outer, capture_extensions() as inner:
        result = cuda_extension_env.load_inline("kp_scale_ext", "", **built_extension.kwargs())
    assert result == built_extension.result
    for capture in (outer, inner):
        (build,) = capture.builds
        assert build.log_source == "cached"
        assert [r.function for r in build.ptxas] == ["_Z12scale_kernelPffi"]


def test_failed_build_is_recorded_and_the_error_unchanged(
    cuda_extension_env, built_extension, tmp_path: Path
) -> None:
    kwargs = built_extension.kwargs(build_directory=str(tmp_path))
    kwargs["cuda_sources"] = "__global__ void broken(float* x) { x[0] = undefined_name; }\n"
    kwargs["extra_cuda_cflags"] = ["-gencode=arch=compute_90a,code=sm_90a", "-lineinfo"]
    with capture_extensions() as capture, pytest.raises(RuntimeError) as raised:
        cuda_extension_env.load_inline("kp_broken_ext", "", **kwargs)
    message = str(raised.value)
    assert message.startswith("Error building extension 'kp_broken_ext'")
    assert "undefined_name" in message  # ninja's output, as torch reports it without capture
    (build,) = capture.builds
    assert build.so_path is None
    assert build.error is not None
    assert build.error.startswith("RuntimeError: Error building")
    assert "undefined_name" in build.build_log
    assert build.extra_cuda_cflags.count("-lineinfo") == 1  # not added twice


def test_verbose_output_still_reaches_stdout(
    built_extension, cuda_extension_env, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    kwargs = built_extension.kwargs(build_directory=str(tmp_path))  # a new directory: rebuilt
    with capture_extensions() as capture:
        cuda_extension_env.load_inline("kp_scale_ext", "", verbose=True, **kwargs)
    out = capfd.readouterr().out
    assert "ptxas info" in out
    assert "Compiling entry function '_Z12scale_kernelPffi'" in out
    (build,) = capture.builds
    assert build.log_source == "ninja"
    assert len(build.ptxas) == 1


def test_captures_open_in_other_threads_all_see_a_build(
    built_extension, cuda_extension_env
) -> None:
    opened = threading.Barrier(4)
    built = threading.Event()
    counts: dict[int, int] = {}

    def holder(index: int) -> None:
        with capture_extensions() as capture:
            opened.wait(timeout=60)
            built.wait(timeout=120)
        counts[index] = len(capture.builds)

    threads = [threading.Thread(target=holder, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    opened.wait(timeout=60)
    try:
        cuda_extension_env.load_inline("kp_scale_ext", "", **built_extension.kwargs())
    finally:
        built.set()
        for thread in threads:
            thread.join(timeout=120)
    assert counts == {0: 1, 1: 1, 2: 1}
    assert not hasattr(cuda_extension_env._jit_compile, "__wrapped__")  # all closed: restored
