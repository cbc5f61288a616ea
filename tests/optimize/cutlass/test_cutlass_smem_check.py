"""check_smem_layout and compile_probe: real nvcc compiles, clean skips without nvcc/CUTLASS.

The CuTe probes need the CUTLASS headers (CUTLASS_PATH or the nvidia-cutlass wheel) and skip
without them; the plain nvcc probe needs only nvcc.
"""

from __future__ import annotations

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.cutlass import smem_check
from pytest_kernelpro.optimize.cutlass.locate import CutlassLookup, locate_cutlass
from pytest_kernelpro.optimize.cutlass.smem_check import (
    check_smem_layout,
    compile_probe,
    find_nvcc,
    parse_compiler_errors,
    probe_source,
)

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
CUTLASS = locate_cutlass()
needs_cutlass = pytest.mark.skipif(CUTLASS.install is None, reason=CUTLASS.reason)
ATOM = "GMMA::Layout_K_SW128_Atom<cute::half_t>"


def test_parse_compiler_errors() -> None:
    log = (
        'probe.cu(2): error: static assertion failed with "kp probe"\n'
        "  static_assert(false);\n"
        "probe.cu:9:5: error: 'foo' was not declared in this scope\n"
        'probe.cu(2): error: static assertion failed with "kp probe"\n'
        "probe.cu:1:10: fatal error: cute/tensor.hpp: No such file or directory\n"
    )
    assert parse_compiler_errors(log) == [
        'static assertion failed with "kp probe"',
        "'foo' was not declared in this scope",
        "cute/tensor.hpp: No such file or directory",
    ]


@needs_nvcc
def test_compile_probe_with_nvcc() -> None:
    bad = compile_probe('static_assert(sizeof(int) == 8, "kp probe");\n', arch="sm_90a")
    assert bad.returncode != 0
    assert bad.errors == ['static assertion failed with "kp probe"']
    assert "-gencode=arch=compute_90a,code=sm_90a" in bad.command
    good = compile_probe('static_assert(sizeof(int) == 4, "kp probe");\n', arch="sm_80")
    assert good.returncode == 0
    assert good.errors == []


def test_skips_without_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smem_check, "find_nvcc", lambda: None)
    result = check_smem_layout(ATOM, (128, 64))
    assert result.status == "skipped"
    assert "nvcc not found" in result.reason
    assert result.render().startswith("check_smem_layout skipped: nvcc not found")


def test_skips_without_cutlass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smem_check, "find_nvcc", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(
        smem_check, "locate_cutlass", lambda: CutlassLookup(None, "CUTLASS not found: test")
    )
    result = check_smem_layout(ATOM, (128, 64))
    assert (result.status, result.reason) == ("skipped", "CUTLASS not found: test")


@pytest.mark.parametrize(
    ("atom", "shape"),
    [
        ('int; #include "/etc/passwd"', (8,)),
        ("A\nB", (8,)),
        ("", (8,)),
        (ATOM, (0, 64)),
        (ATOM, ()),
    ],
)
def test_unsafe_or_bad_arguments_are_refused(atom: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(KernelproError):
        check_smem_layout(atom, shape)


def test_probe_source_shape() -> None:
    text = probe_source(ATOM, (128, 64, 4), "cute::half_t", 1024)
    assert f"using KpAtom = decltype({ATOM}{{}});" in text
    assert "make_shape(cute::Int<128>{}, cute::Int<64>{}, cute::Int<4>{})" in text
    assert "static_assert(kernelpro_smem_fits<kp_smem_bytes, 1024LL>::value" in text
    expr = probe_source(
        "composition(Swizzle<3,4,3>{}, Layout<Shape<_8,_64>>{})", (8, 64), "float", None
    )
    assert "decltype(composition(Swizzle<3,4,3>{}, Layout<Shape<_8,_64>>{}));" in expr


@pytest.mark.slow
@needs_nvcc
@needs_cutlass
def test_layout_that_fits_reports_its_footprint() -> None:
    result = check_smem_layout(ATOM, (128, 64, 4), smem_limit_bytes=227 * 1024)
    assert result.status == "ok", result.log[-2000:]
    assert result.smem_bytes == 128 * 64 * 4 * 2  # half_t tile, 4 stages
    assert result.render() == "check_smem_layout ok: layout compiles; shared memory 65536 bytes"


@pytest.mark.slow
@needs_nvcc
@needs_cutlass
def test_indivisible_shape_and_smem_limit_fail() -> None:
    bad = check_smem_layout(ATOM, (100, 64, 4))
    assert bad.status == "error"
    assert any("block shape does not divide the target shape" in e for e in bad.errors)
    big = check_smem_layout(ATOM, (128, 64, 4), smem_limit_bytes=32 * 1024)
    assert big.status == "error"
    assert big.smem_bytes == 65536
    assert big.errors == [
        "the layout needs 65536 bytes of shared memory, more than the 32768 bytes a block may use"
    ]
