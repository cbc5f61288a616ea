"""Constraint mining (on a fake CUTLASS tree) and the static pre-compile checker."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.optimize.cutlass.constraints import (
    CONSTRAINTS,
    check_source,
    mine_constraints,
    render_constraints,
)
from pytest_kernelpro.optimize.cutlass.locate import install_from_root
from pytest_kernelpro.optimize.cutlass.precheck import PrecheckEvaluator
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

GOOD_PIPELINE = r"""
__global__ void __launch_bounds__(384) gemm(...) {
  __shared__ uint64_t full[4];
  if (threadIdx.x == 0) { ClusterTransactionBarrier::init(&full[0], 1); }
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  constexpr int kStages = 4;
  if (warp_group_idx == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    full_barrier.arrive_and_expect_tx(kTmaBytes);
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes ...");
  } else {
    cutlass::arch::warpgroup_reg_alloc<232>();
    warpgroup_arrive();
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 ...");
    warpgroup_commit_batch();
    warpgroup_wait<0>();
  }
}
"""


def _ids(violations) -> list[tuple[str, str]]:
    return [(v.constraint, v.severity) for v in violations]


def test_correct_pipeline_passes() -> None:
    assert check_source(GOOD_PIPELINE, arch="sm_90a") == []


def test_each_rule_fires_on_its_defect() -> None:
    cases = {
        "__syncthreads();": ("barrier-init", "error"),
        "cutlass::arch::fence_barrier_init();": ("barrier-init", "error"),  # TMA present
        "full_barrier.arrive_and_expect_tx(kTmaBytes);": ("barrier-expect-tx", "error"),
        "warpgroup_commit_batch();": ("wgmma-fence", "error"),
        "warpgroup_wait<0>();": ("wgmma-fence", "error"),
        "warpgroup_arrive();": ("wgmma-fence", "error"),
    }
    for removed, expected in cases.items():
        assert removed in GOOD_PIPELINE
        found = _ids(check_source(GOOD_PIPELINE.replace(removed, ""), arch="sm_90a"))
        assert found == [expected], removed
    bad_regs = GOOD_PIPELINE.replace("reg_alloc<232>", "reg_alloc<230>")
    assert _ids(check_source(bad_regs)) == [("warpgroup-registers", "error")]
    one_sided = GOOD_PIPELINE.replace("cutlass::arch::warpgroup_reg_dealloc<40>();", "")
    assert _ids(check_source(one_sided)) == [("warpgroup-registers", "warning")]
    one_stage = GOOD_PIPELINE.replace("kStages = 4", "kStages = 1")
    assert _ids(check_source(one_stage)) == [("tma-pipeline-depth", "error")]
    odd_block = GOOD_PIPELINE.replace("__launch_bounds__(384)", "__launch_bounds__(320)")
    assert _ids(check_source(odd_block)) == [("warpgroup-shape", "error")]


def test_arch_target_rules() -> None:
    assert _ids(check_source(GOOD_PIPELINE, arch="sm_90")) == [("arch-target", "error")]
    assert _ids(check_source(GOOD_PIPELINE, arch="sm_80")) == [("arch-target", "error")]
    flags = GOOD_PIPELINE + '\nflags = ["-gencode=arch=compute_90,code=sm_90"]\n'
    found = check_source(flags, arch="sm_90a")
    assert _ids(found) == [("arch-target", "error")]
    assert "compute_90" in found[0].message
    assert check_source(GOOD_PIPELINE + '\n# "-gencode=arch=compute_90a,code=sm_90a"\n') == []


def test_comments_do_not_count_and_lines_are_right() -> None:
    commented = GOOD_PIPELINE.replace("__syncthreads();", "// __syncthreads();")
    found = check_source(commented)
    assert _ids(found) == [("barrier-init", "error")]
    init_line = (
        GOOD_PIPELINE.splitlines().index(
            "  if (threadIdx.x == 0) { ClusterTransactionBarrier::init(&full[0], 1); }"
        )
        + 1
    )
    assert found[0].line == init_line
    assert found[0].render() == (
        f"error [barrier-init] line {init_line}: mbarrier initialized but no __syncthreads()/"
        "cluster sync makes the init visible"
    )


def test_epilogue_vectorization_guard() -> None:
    store = "reinterpret_cast<float4*>(out)[i] = v;"
    assert _ids(check_source(store)) == [("epilogue-vector", "warning")]
    guarded = "if (n % 4 == 0) { reinterpret_cast<float4*>(out)[i] = v; }"
    assert check_source(guarded) == []
    assert check_source("out[i] = a[i] + b[i];  // plain CUDA, nothing to check") == []


def _fake_cutlass(root: Path) -> Path:
    inc = root / "include"
    files = {
        "cutlass/cutlass.h": "static const int NumThreadsPerWarpGroup = 128;\n",
        "cutlass/arch/barrier.h": "// x\nvoid fence_barrier_init() {\n}\n",
        "cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp": (
            "  static constexpr uint32_t LoadRegisterRequirement = !Heavy ? 56 : 24;\n"
            "  static constexpr uint32_t MmaRegisterRequirement = !Heavy ? 216 : 240;\n"
        ),
    }
    for rel, text in files.items():
        (inc / rel).parent.mkdir(parents=True, exist_ok=True)
        (inc / rel).write_text(text)
    (inc / "cute").mkdir()
    return root


def test_mining_takes_numbers_and_citations_from_the_tree(tmp_path: Path) -> None:
    install = install_from_root(_fake_cutlass(tmp_path), "CUTLASS_PATH")
    mined = {c.id: c for c in mine_constraints(install, arch="sm_90a")}
    assert len(mined) == len(CONSTRAINTS)
    regs = mined["warpgroup-registers"]
    assert "CUTLASS uses 56 (producer) and 216 (consumer)" in regs.text
    assert regs.evidence == (
        "include/cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp:1",
        "include/cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp:2",
    )
    assert mined["barrier-init"].evidence == ("include/cutlass/arch/barrier.h:2",)
    assert mined["warpgroup-shape"].evidence == ("include/cutlass/cutlass.h:1",)
    assert mined["tma-alignment"].evidence == ()  # not in the fake tree: text only
    text = render_constraints(list(mined.values()))
    assert text.startswith("## Hard constraints")
    assert "(CUTLASS: include/cutlass/arch/barrier.h:2)" in text
    # Without a tree: the defaults, no citations; before Hopper: nothing applies.
    plain = {c.id: c for c in mine_constraints(None, arch="sm_90a")}
    assert "CUTLASS uses 40 (producer) and 232 (consumer)" in plain["warpgroup-registers"].text
    assert mine_constraints(None, arch="sm_80") == []
    assert render_constraints([]) == ""


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def evaluate(self, candidate: Candidate) -> Evaluation:
        self.seen.append(candidate.code)
        return Evaluation(status="correct", speedup=1.3)


def test_precheck_evaluator_rejects_before_compiling() -> None:
    inner = _Recorder()
    evaluator = PrecheckEvaluator(inner, arch="sm_90a")
    broken = evaluator.evaluate(Candidate(code=GOOD_PIPELINE.replace("__syncthreads();", "")))
    assert broken.status == "build_error"
    assert inner.seen == []
    assert "hard-constraint violation" in broken.reason
    assert "[barrier-init]" in broken.build_log
    ok = evaluator.evaluate(Candidate(code="reinterpret_cast<float4*>(o)[i] = v;"))
    assert ok.status == "correct"
    assert len(inner.seen) == 1
    assert ok.findings[0]["title"] == "constraint warning [epilogue-vector]"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_rules_for_newer_archs(arch: str) -> None:
    assert check_source(GOOD_PIPELINE, arch=arch) == []
