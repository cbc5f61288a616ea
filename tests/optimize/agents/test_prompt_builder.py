"""PromptBuilder composition per mode and language, GPU injection, prompt ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_kernelpro.errors import KernelproConfigError, KernelproError
from pytest_kernelpro.measure.devices import find_device_spec
from pytest_kernelpro.optimize.agents.prompts import (
    PARTS_DIR,
    PromptBuilder,
    code_block,
    gpu_context,
)
from pytest_kernelpro.optimize.agents.prompts.gpu_facts import ARCH_FACTS
from pytest_kernelpro.optimize.cutlass.locate import install_from_root

REFERENCE = (Path(__file__).parents[2] / "data" / "agents" / "reference.py").read_text()


@pytest.fixture(scope="module")
def h200():
    return gpu_context("NVIDIA H200", cutlass="off")


def test_h200_injection_has_wgmma_shapes_and_sm90a(h200) -> None:
    spec = find_device_spec("NVIDIA H200")
    assert h200.target == "sm_90a"
    assert h200.spec == spec
    for shape in ARCH_FACTS[spec.arch].mma_shapes:
        assert shape in h200.text
    assert "wgmma.mma_async m64nNk16" in h200.text
    assert "-gencode=arch=compute_90a,code=sm_90a" in h200.text
    assert "132 SMs" in h200.text
    assert "227 KB per block" in h200.text
    # Hopper constraints are injected even without CUTLASS (they hold for raw PTX too).
    assert "[wgmma-fence]" in h200.text
    assert h200.constraints
    assert all(not c.evidence for c in h200.constraints)
    assert "CUTLASS/CuTe available" not in h200.text


def test_cpu_and_other_gpus() -> None:
    cpu = gpu_context("cpu")
    assert cpu.is_cpu
    assert "CPU (no CUDA GPU)" in cpu.text
    assert "wgmma" not in cpu.text
    assert "mma.sync" not in cpu.text
    a100 = gpu_context("NVIDIA A100-SXM4-80GB", cutlass="off")
    assert a100.target == "sm_80"
    assert "mma.sync m16n8k16" in a100.text
    assert "wgmma" not in a100.text
    assert not a100.constraints
    unknown = gpu_context("Some Future GPU", cutlass="off")
    assert "not in the device table" in unknown.text
    assert unknown.target is None


def test_cutlass_injection_with_a_tree(tmp_path: Path) -> None:
    include = tmp_path / "include"
    (include / "cutlass").mkdir(parents=True)
    (include / "cute").mkdir()
    (include / "cutlass" / "cutlass.h").write_text("// fake\n")
    (include / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n"
    )
    install = install_from_root(tmp_path, "CUTLASS_PATH")
    ctx = gpu_context("NVIDIA H200", cutlass=install)
    assert "CUTLASS/CuTe available: CUTLASS 4.2.0" in ctx.text
    assert f"extra_include_paths=['{include.resolve()}']" in ctx.text
    assert ctx.flags is not None
    assert ctx.flags.include_dirs == (str(include.resolve()),)


@pytest.mark.parametrize("language", ["pytorch", "triton", "cuda"])
def test_initial_prompt_composition(h200, language: str) -> None:
    builder = PromptBuilder()
    prompt = builder.build(
        "initial", language=language, problem_source=REFERENCE, n_candidates=3, gpu=h200
    )
    assert prompt.parts == (
        "system", "strategies", f"format_{language}", "mode_initial", "example_load_inline",
        "build_form", "output_format",
    )  # fmt: skip
    assert prompt.template == f"initial.{language}"
    assert re.fullmatch(rf"initial\.{language}@[0-9a-f]{{10}}", prompt.prompt_id)
    assert builder.part(f"format_{language}").strip() in prompt.user
    assert "class Model(nn.Module)" in prompt.user
    assert "Return exactly 3 candidate solution(s)" in prompt.user
    assert 'add_ext = load_inline(\n    name="add_ext"' in prompt.user  # the curated example
    assert "wgmma.mma_async" in prompt.system
    assert "Optimization strategies" in prompt.system


def test_debug_and_optimize_parts(h200) -> None:
    builder = PromptBuilder()
    parent = "import torch\nclass ModelNew: ...\n"
    debug = builder.build(
        "debug", language="pytorch", problem_source=REFERENCE, n_candidates=1, gpu=h200,
        parent_code=parent, failure="It did not build: error: identifier 'foo' is undefined",
    )  # fmt: skip
    assert "## Task: fix this solution" in debug.user
    assert "identifier 'foo' is undefined" in debug.user
    assert parent.strip() in debug.user
    assert "example_load_inline" not in debug.parts
    # Every mode that writes code is told the fast-path build form.
    assert "build_form" in debug.parts
    assert "kernels = load_cuda(CUDA_SRC" in debug.user
    assert 'extern "C" __global__' in debug.user
    optimize = builder.build(
        "optimize", language="pytorch", problem_source=REFERENCE, n_candidates=2, gpu=h200,
        parent_code=parent, speedup="Its speedup over the reference is 1.5x.",
        feedback="## Automated Bottleneck Analysis\nuse tensor cores",
    )  # fmt: skip
    assert "Its speedup over the reference is 1.5x." in optimize.user
    assert "## Automated Bottleneck Analysis\nuse tensor cores" in optimize.user
    assert optimize.prompt_id.startswith("optimize.pytorch@")
    assert optimize.parts[-2:] == ("build_form", "output_format")
    with pytest.raises(KernelproError, match="debug mode needs the parent"):
        builder.build("debug", language="cuda", problem_source=REFERENCE, n_candidates=1)


def test_prompt_id_tracks_template_not_problem(h200) -> None:
    builder = PromptBuilder()

    def build(b: PromptBuilder, source: str, concise: bool = False) -> str:
        return b.build("initial", language="cuda", problem_source=source, n_candidates=1,
                       gpu=h200, concise=concise).prompt_id  # fmt: skip

    assert build(builder, REFERENCE) == build(builder, REFERENCE + "\n# another problem\n")
    edited = PromptBuilder(overrides={"strategies": "## Strategies\n1. Use tensor cores.\n"})
    assert build(edited, REFERENCE) != build(builder, REFERENCE)
    concise = builder.build("initial", language="cuda", problem_source=REFERENCE,
                            n_candidates=1, gpu=h200, concise=True)  # fmt: skip
    assert "Start over and be concise" in concise.user
    assert concise.parts[-1] == "concise"
    assert build(builder, REFERENCE, concise=True) != build(builder, REFERENCE)


def test_cpu_prompt_has_no_cuda_example() -> None:
    prompt = PromptBuilder().build(
        "initial", language="pytorch", problem_source=REFERENCE, n_candidates=1,
        gpu=gpu_context("cpu"),
    )  # fmt: skip
    assert "example_load_inline" not in prompt.parts
    assert "build_form" not in prompt.parts
    assert "__global__" not in prompt.user
    assert "CPU (no CUDA GPU)" in prompt.system


def test_bad_inputs_and_parts(tmp_path: Path) -> None:
    builder = PromptBuilder()
    with pytest.raises(KernelproConfigError, match="Unknown kernel language 'rust'"):
        builder.build("initial", language="rust", problem_source="x", n_candidates=1)
    with pytest.raises(KernelproError, match="Unknown Programmer mode"):
        builder.build("refactor", language="cuda", problem_source="x", n_candidates=1)
    with pytest.raises(KernelproError, match="prompt part 'system' not found"):
        PromptBuilder(tmp_path).build("initial", language="cuda", problem_source="x",
                                      n_candidates=1)  # fmt: skip
    assert sorted(p.stem for p in PARTS_DIR.glob("*.md")) == sorted([
        "system", "strategies", "format_pytorch", "format_triton", "format_cuda", "mode_initial",
        "mode_debug", "mode_optimize", "example_load_inline", "output_format", "concise",
        "profiling_system", "build_form",
    ])  # fmt: skip


def test_code_block_fence_outgrows_inner_fences() -> None:
    inner = 'doc = """\n```python\nx = 1\n```\n"""\n'
    block = code_block(inner)
    assert block.startswith("````python\n")
    assert block.endswith("\n````")
