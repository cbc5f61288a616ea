"""The GPU facts a kernel prompt states and the gate never reads: per architecture, the shared
memory, register and thread limits and the tensor-core instruction shapes; per built-in GPU,
its L2 size.

The gate's device table (`measure/device_table.py`) holds the rest of a GPU's datasheet. A
team's spec (the `pytest_kernelpro_device_specs` hook) of an architecture missing here, or of
a GPU missing from `L2_BYTES`, gets a prompt without those facts, never a guessed one.
"""

from __future__ import annotations

from dataclasses import dataclass

_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class ArchFacts:
    """One architecture's per-SM limits and its tensor-core instruction shapes."""

    smem_per_sm_bytes: int
    max_smem_per_block_bytes: int
    regs_per_sm: int
    max_threads_per_sm: int
    mma_shapes: tuple[str, ...]


# Tensor-core instruction shapes per architecture (PTX ISA; "sm_90a"/"sm_100a" name the
# arch-specific targets these instructions need).
_AMPERE_MMA = (
    "mma.sync m16n8k16 (bf16/fp16)",
    "mma.sync m16n8k8 (bf16/fp16, tf32)",
    "mma.sync m16n8k32 (int8)",
    "mma.sync m8n8k4 (fp64 DMMA)",
)
_ADA_MMA = (
    "mma.sync m16n8k16 (bf16/fp16)",
    "mma.sync m16n8k8 (bf16/fp16, tf32)",
    "mma.sync m16n8k32 (int8; fp8 e4m3/e5m2)",
)
_HOPPER_MMA = (
    "wgmma.mma_async m64nNk16 (bf16/fp16, N=8..256 step 8; sm_90a)",
    "wgmma.mma_async m64nNk8 (tf32; sm_90a)",
    "wgmma.mma_async m64nNk32 (fp8 e4m3/e5m2, int8; sm_90a)",
    "mma.sync m16n8k16 (bf16/fp16)",
    "mma.sync m16n8k8 (tf32)",
    "mma.sync m16n8k32 (int8)",
    "mma.sync m8n8k4, m16n8k{4,8,16} (fp64 DMMA)",
)
_BLACKWELL_MMA = (
    "tcgen05.mma cta_group::1 M=64/128 N=8..256 K=16 (bf16/fp16; accumulator in tensor memory; sm_100a)",
    "tcgen05.mma cta_group::2 M=128/256 N=8..256 K=16 (bf16/fp16; CTA pair; sm_100a)",
    "tcgen05.mma kind::tf32 K=8 (sm_100a)",
    "tcgen05.mma kind::f8f6f4 K=32 (fp8/fp6/fp4; sm_100a)",
    "mma.sync m16n8k16 (bf16/fp16)",
    "mma.sync m8n8k4, m16n8k{4,8,16} (fp64 DMMA)",
)

# By the spec's `arch` ("sm_90"); Blackwell (B200) keeps Hopper's shared memory, registers
# and threads per SM.
ARCH_FACTS: dict[str, ArchFacts] = {
    "sm_80": ArchFacts(164 * _KIB, 163 * _KIB, 65536, 2048, _AMPERE_MMA),
    "sm_89": ArchFacts(100 * _KIB, 99 * _KIB, 65536, 1536, _ADA_MMA),
    "sm_90": ArchFacts(228 * _KIB, 227 * _KIB, 65536, 2048, _HOPPER_MMA),
    "sm_100": ArchFacts(228 * _KIB, 227 * _KIB, 65536, 2048, _BLACKWELL_MMA),
}

# By the built-in spec's `name`: the datasheets' L2, except the H200's (as
# torch.cuda.get_device_properties reported it on an H200; the H200 NVL's is assumed equal)
# and the B200's (as the CUDA driver reports it).
L2_BYTES: dict[str, int] = {
    "NVIDIA H100 SXM5 80GB": 50 * _MIB,
    "NVIDIA H100 PCIe": 50 * _MIB,
    "NVIDIA H100 NVL": 50 * _MIB,
    "NVIDIA H200 SXM": 60 * _MIB,
    "NVIDIA H200 NVL": 60 * _MIB,
    "NVIDIA A100 SXM4 80GB": 40 * _MIB,
    "NVIDIA A100 SXM4 40GB": 40 * _MIB,
    "NVIDIA A100 PCIe 80GB": 40 * _MIB,
    "NVIDIA A100 PCIe 40GB": 40 * _MIB,
    "NVIDIA L4": 48 * _MIB,
    "NVIDIA L40S": 96 * _MIB,
    "NVIDIA B200": int(126.5 * _MIB),
}
