"""ptxas -v resource reports: the H200 build log and fresh nvcc output."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelpro.profile.ptxas import parse_ptxas_output, ptxas_by_function

DATA = Path(__file__).resolve().parent.parent / "data" / "profile"


def test_h200_build_log() -> None:
    reports = ptxas_by_function(parse_ptxas_output((DATA / "run.log").read_text()))
    assert len(reports) == 6
    spill = reports["_Z12spill_kernelPKfPfPKii"]
    assert (spill.arch, spill.registers, spill.stack_frame_bytes) == ("sm_90a", 20, 256)
    # a runtime-indexed local array: stack frame, yet no register spill
    assert (spill.spill_store_bytes, spill.spill_load_bytes) == (0, 0)
    tiled = reports["_Z19tiled_matmul_kernelPKfS0_Pfi"]
    assert (tiled.registers, tiled.shared_bytes) == (32, 8192)
    assert reports["_Z14vec_add_kernelPK6float4S1_PS_i"].registers == 22


def test_fresh_nvcc_output_with_real_spills(sass_cubin) -> None:
    reports = ptxas_by_function(parse_ptxas_output(sass_cubin.ptxas_log))
    assert set(reports) == {
        "_Z9copy_vec4PK6float4PS_i",
        "_Z11copy_scalarPKfPfi",
        "_Z9wmma_tilePK6__halfS1_Pf",
        "_Z14cp_async_stagePK6float4PS_",
        "_Z10wgmma_tilePfyy",
        "_Z14spill_pressurePKfPfi",
    }
    spill = reports["_Z14spill_pressurePKfPfi"]
    # __launch_bounds__(1024, 2) caps registers at 32 and the 96 live floats spill
    assert spill.registers <= 32
    assert spill.spill_store_bytes > 0
    assert spill.spill_load_bytes > 0
    assert spill.stack_frame_bytes > 0  # spill bytes count stores in the code, not frame size
    staged = reports["_Z14cp_async_stagePK6float4PS_"]
    assert staged.shared_bytes == 128 * 16
    assert all(r.arch == "sm_90a" for r in reports.values())


def test_older_format_and_several_targets() -> None:
    log = """
ptxas info    : Compiling entry function '_Z4axpyfPfS_' for 'sm_80'
ptxas info    : Function properties for _Z4axpyfPfS_
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 24 registers, 4096 bytes smem, 376 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Function properties for __internal_trig_reduction_slowpathd
    40 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4axpyfPfS_' for 'sm_90a'
ptxas info    : Function properties for _Z4axpyfPfS_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 1024 bytes smem
"""
    reports = parse_ptxas_output(log)
    assert [(r.arch, r.registers) for r in reports] == [("sm_80", 24), ("sm_90a", 30)]
    old = reports[0]
    assert (old.stack_frame_bytes, old.spill_store_bytes, old.spill_load_bytes) == (8, 4, 4)
    assert (old.shared_bytes, old.constant_bytes) == (4096, 384)
    assert ptxas_by_function(reports)["_Z4axpyfPfS_"].arch == "sm_90a"
    assert ptxas_by_function(reports, arch="sm_80")["_Z4axpyfPfS_"].registers == 24


def test_no_report() -> None:
    assert parse_ptxas_output("ninja: no work to do.\n") == []
