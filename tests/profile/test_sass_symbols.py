"""SASS instruction classes and kernel symbols: the H200 module's dump, and kernels compiled
here with nvcc for sm_90a and read with the PyPI cuobjdump."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.profile.model import NotCollected
from pytest_kernelpro.profile.sass import access_width_bits, sass_of_module, summarize_sass
from pytest_kernelpro.profile.symbols import (
    demangle,
    entry_points,
    fallback_demangle,
    kernel_base_name,
    parse_cuobjdump_symbols,
    read_module_symbols,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "profile"


@pytest.fixture(scope="module")
def probe_sass():
    return summarize_sass((DATA / "sass.txt").read_text())


def test_h200_wmma_kernel_has_hmma_and_no_hgmma(probe_sass) -> None:
    wmma = probe_sass["_Z18wmma_matmul_kernelPK6__halfS1_Pfi"]
    assert wmma.count("HMMA") == 10
    assert wmma.count("MMA_SYNC") == 10
    assert wmma.count("HGMMA") == 0
    assert wmma.count("WGMMA") == 0
    assert wmma.total_instructions == 256
    assert dict(wmma.global_load_widths) == {32: 40}
    assert dict(wmma.global_store_widths) == {64: 4}


def test_h200_spill_vector_and_tiled_kernels(probe_sass) -> None:
    spill = probe_sass["_Z12spill_kernelPKfPfPKii"]
    assert (spill.count("LDL"), spill.count("STL"), spill.count("LOCAL")) == (1, 1, 2)
    vec = probe_sass["_Z14vec_add_kernelPK6float4S1_PS_i"]
    assert dict(vec.global_load_widths) == {128: 2}
    assert dict(vec.global_store_widths) == {128: 1}
    tiled = probe_sass["_Z19tiled_matmul_kernelPKfS0_Pfi"]
    assert tiled.count("LDS") == 40
    assert tiled.count("SHARED_LD") == 40
    assert tiled.count("BAR") == 2
    assert tiled.count("FFMA") == 32
    # HFMA2.MMA is an FMA-pipe move, not a tensor-core instruction
    naive = probe_sass["_Z19naive_matmul_kernelPKfS0_Pfi"]
    assert naive.count("HFMA2") == 1
    assert naive.count("HMMA") == 0
    assert probe_sass["_Z20naive_softmax_kernelPKfPfii"].count("MUFU") == 41


def test_h200_symbols_entry_points() -> None:
    symbols = parse_cuobjdump_symbols((DATA / "symbols.txt").read_text())
    entries = entry_points(symbols)
    assert entries == [
        "_Z18wmma_matmul_kernelPK6__halfS1_Pfi",
        "_Z12spill_kernelPKfPfPKii",
        "_Z14vec_add_kernelPK6float4S1_PS_i",
        "_Z20naive_softmax_kernelPKfPfii",
        "_Z19tiled_matmul_kernelPKfS0_Pfi",
        "_Z19naive_matmul_kernelPKfS0_Pfi",
    ]
    assert all(s.arch == "sm_90a" for s in symbols)
    weak = [s for s in symbols if s.name == "$__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath"]
    assert weak
    assert weak[0].binding == "WEAK"
    assert weak[0].name not in entries


def test_symbols_of_the_newer_cuobjdump_layout() -> None:
    text = """
symbols:
OBJECT        WEAK    DEFAULT    -                                 U  .nv.reservedSmem.offset0
NOTYPE        LOCAL   INTERNAL   -                                 U  
FUNC          GLOBAL  DEFAULT    -                                 U  vprintf
FUNC          GLOBAL  DEFAULT    ENTRY                                _Z9copy_vec4PK6float4PS_i
"""
    assert entry_points(parse_cuobjdump_symbols(text)) == ["_Z9copy_vec4PK6float4PS_i"]


@pytest.mark.parametrize(
    ("opcode", "bits"),
    [
        ("LDG.E", 32),
        ("LDG.E.64", 64),
        ("LDG.E.128.CONSTANT", 128),
        ("LDG.E.U8", 8),
        ("STG.E.S16", 16),
        ("LDG.E.LTC128B.128", 128),
        ("LDG.E.EF.LTC128B", 32),
    ],
)
def test_access_width(opcode: str, bits: int) -> None:
    assert access_width_bits(opcode) == bits


def test_predicated_and_uniform_predicated_lines() -> None:
    text = """
	code for sm_90a
		Function : _Z1kv
        /*0000*/              @P0 LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x0 */
        /*0010*/             @!UP1 HGMMA.64x8x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0020*/                   EXIT ;
		.......
"""
    summary = summarize_sass(text)["_Z1kv"]
    assert summary.total_instructions == 3
    assert summary.count("HGMMA") == 1
    assert summary.count("WGMMA") == 1
    assert dict(summary.global_load_widths) == {128: 1}


# --- kernels compiled here ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cubin_sass(sass_cubin, tool_or_skip):
    tool_or_skip("cuobjdump")
    tool_or_skip("nvdisasm")
    sass = sass_of_module(str(sass_cubin.path))
    assert not isinstance(sass, NotCollected), sass
    return {s.function.split("(")[0]: s for s in sass.values()}


def test_compiled_wgmma_kernel_emits_hgmma(cubin_sass) -> None:
    wgmma = cubin_sass["wgmma_tile"]
    assert wgmma.count("HGMMA") >= 1
    assert wgmma.count("WGMMA") == wgmma.count("HGMMA")
    assert wgmma.count("WARPGROUP") >= 1  # wgmma.fence / wait_group
    assert wgmma.count("HMMA") == 0


def test_compiled_wmma_kernel_emits_hmma_only(cubin_sass) -> None:
    wmma = cubin_sass["wmma_tile"]
    assert wmma.count("HMMA") >= 1
    assert wmma.count("HGMMA") == 0
    assert wmma.count("TMA") == 0


def test_compiled_vector_scalar_cp_async_and_spill_kernels(cubin_sass) -> None:
    vec, scalar = cubin_sass["copy_vec4"], cubin_sass["copy_scalar"]
    assert set(vec.global_load_widths) == {128}
    assert set(vec.global_store_widths) == {128}
    assert set(scalar.global_load_widths) == {32}
    assert set(scalar.global_store_widths) == {32}
    staged = cubin_sass["cp_async_stage"]
    assert staged.count("LDGSTS") >= 1
    assert staged.count("CP_ASYNC") == staged.count("LDGSTS")
    assert staged.count("BAR") >= 1
    assert not staged.global_load_widths  # the global reads are the cp.async itself
    spill = cubin_sass["spill_pressure"]
    assert spill.count("STL") > 0
    assert spill.count("LDL") > 0
    assert cubin_sass["copy_vec4"].count("LOCAL") == 0


def test_compiled_cubin_symbols_and_demangling(sass_cubin, tool_or_skip) -> None:
    tool_or_skip("cuobjdump")
    symbols = read_module_symbols(str(sass_cubin.path))
    assert not isinstance(symbols, NotCollected), symbols
    entries = entry_points(symbols)
    assert len(entries) == 6
    assert "_Z10wgmma_tilePfyy" in entries
    names = demangle(entries)
    assert kernel_base_name(names["_Z10wgmma_tilePfyy"]) == "wgmma_tile"
    assert names["_Z11copy_scalarPKfPfi"].startswith("copy_scalar(")


def test_missing_module_is_not_collected(tmp_path: Path, tool_or_skip) -> None:
    tool_or_skip("cuobjdump")
    result = read_module_symbols(str(tmp_path / "missing.so"))
    assert isinstance(result, NotCollected)
    assert result.what == "symbols"


@pytest.mark.parametrize(
    ("name", "demangled"),
    [
        ("_Z20naive_softmax_kernelPKfPfii", "naive_softmax_kernel"),
        ("_ZN2at6native4gemmEv", "at::native::gemm"),
        ("_ZNK3foo3barEv", "foo::bar"),
        ("_Z11good_kernelI4sm90Evv", "good_kernel"),
        ("softmax_kernel", "softmax_kernel"),
    ],
)
def test_fallback_demangle(name: str, demangled: str) -> None:
    assert fallback_demangle(name) == demangled


@pytest.mark.parametrize(
    ("name", "base"),
    [
        (
            "void at::<unnamed>::cunn_SoftMaxForwardReg<float, float, float, "
            "at::<unnamed>::SoftMaxForwardEpilogue, long, 4>(T3 *, const T1 *, T4)",
            "cunn_SoftMaxForwardReg",
        ),
        ("naive_softmax_kernel(const float *, float *, int, int)", "naive_softmax_kernel"),
        ("naive_softmax_kernel(float const*, float*, int, int)", "naive_softmax_kernel"),
        ("_Z20naive_softmax_kernelPKfPfii", "naive_softmax_kernel"),
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)",
            "Kernel2",
        ),
        ("(anonymous namespace)::tile_kernel(float*)", "tile_kernel"),
        (
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        ),
    ],
)
def test_kernel_base_name(name: str, base: str) -> None:
    assert kernel_base_name(name) == base
