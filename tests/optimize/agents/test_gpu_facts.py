"""The GPU facts only a prompt states (per-SM limits, tensor-core shapes, L2): every built-in
GPU has them, its prompt part is the golden one, and a team's spec of an architecture the
table lacks gets no guessed facts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kernelpro.measure.devices import DeviceSpec, builtin_device_specs
from pytest_kernelpro.optimize.agents.prompts import gpu_context
from pytest_kernelpro.optimize.agents.prompts.gpu_facts import ARCH_FACTS, L2_BYTES

SPECS = builtin_device_specs()
GOLDEN = Path(__file__).parents[2] / "data" / "agents" / "golden" / "gpu_targets.md"


def target_part(name: str, extra: tuple[DeviceSpec, ...] = ()) -> str:
    """The prompt's part about the GPU itself (before its build flags)."""
    text = gpu_context(name, cutlass="off", extra_specs=extra).text
    return text.split("\n### Build flags")[0].rstrip("\n")


def team_spec(arch: str) -> DeviceSpec:
    return DeviceSpec(
        name="Team GPU",
        aliases=(),
        arch=arch,
        sms=40,
        dram_bandwidth_Bps=448e9,
        peak_flops={"fp32": 8.1e12},
        source="datasheet",
    )


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_builtin_gpu_has_its_prompt_facts(spec: DeviceSpec) -> None:
    facts = ARCH_FACTS[spec.arch]
    assert facts.max_smem_per_block_bytes < facts.smem_per_sm_bytes
    assert facts.regs_per_sm > 0
    assert facts.max_threads_per_sm > 0
    assert facts.mma_shapes
    assert L2_BYTES[spec.name] > 0


def test_the_l2_table_names_only_builtin_gpus() -> None:
    """A renamed built-in spec would silently lose its L2 line: the names must agree."""
    assert set(L2_BYTES) == {spec.name for spec in SPECS}


def test_builtin_gpu_prompts_are_the_golden_ones() -> None:
    """The text for every built-in GPU; KERNELPRO_UPDATE_GOLDEN=1 rewrites it (review it)."""
    text = "\n\n".join(target_part(spec.name) for spec in SPECS) + "\n"
    if os.environ.get("KERNELPRO_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8"), f"{GOLDEN} differs"
    assert text.count("## Target GPU:") == len(SPECS)


def test_a_team_spec_of_an_unknown_arch_gets_no_guessed_facts() -> None:
    part = target_part("Team GPU", (team_spec("sm_75"),))
    assert "- 40 SMs; DRAM 0.45 TB/s." in part
    assert "sm_75 are not known here" in part
    for guessed in ("KB per SM", "threads per SM", "L2 ", "mma.sync", "wgmma"):
        assert guessed not in part


@pytest.mark.parametrize(
    ("arch", "shape"), [("sm_89", "mma.sync m16n8k32 (int8; fp8"), ("sm_90a", "wgmma")]
)
def test_a_team_spec_of_a_known_arch_gets_its_facts(arch: str, shape: str) -> None:
    """By its arch ("sm_90a" is sm_90's hardware); its L2 is not known, so not stated."""
    part = target_part("Team GPU", (team_spec(arch),))
    facts = ARCH_FACTS[arch.rstrip("a")]
    assert f"{facts.smem_per_sm_bytes // 1024} KB per SM" in part
    assert f"{facts.max_threads_per_sm} threads per SM" in part
    assert shape in part
    assert "not known here" not in part
    assert "L2 " not in part
