"""The built-in GPU table: datacenter GPUs and their datasheet ceilings (`devices.DeviceSpec`'s
fields; every tensor-core rate dense, as `devices.py` states). Read by
`devices.builtin_device_specs` on first use (a CPU session never needs it).
"""

from __future__ import annotations

from typing import Any

_KIB = 1024
_MIB = 1024 * 1024


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

_HOPPER_SM = dict(
    arch="sm_90",
    smem_per_sm_bytes=228 * _KIB,
    max_smem_per_block_bytes=227 * _KIB,
    regs_per_sm=65536,
    max_threads_per_sm=2048,
    mma_shapes=_HOPPER_MMA,
)
_AMPERE_SM = dict(
    arch="sm_80",
    sms=108,
    l2_bytes=40 * _MIB,
    smem_per_sm_bytes=164 * _KIB,
    max_smem_per_block_bytes=163 * _KIB,
    regs_per_sm=65536,
    max_threads_per_sm=2048,
    mma_shapes=_AMPERE_MMA,
)
# Blackwell (B200) keeps Hopper's shared memory, registers and threads per SM.
_BLACKWELL_SM = {**_HOPPER_SM, "arch": "sm_100", "mma_shapes": _BLACKWELL_MMA}
_ADA_SM = dict(
    arch="sm_89",
    smem_per_sm_bytes=100 * _KIB,
    max_smem_per_block_bytes=99 * _KIB,
    regs_per_sm=65536,
    max_threads_per_sm=1536,
    mma_shapes=_ADA_MMA,
)

_SPARSE_NOTE = "tensor rates are the datasheet's with-sparsity figures halved (dense)"

# H100/H200 SXM: FP64 34, FP64 TC 67, FP32 67 TFLOP/s; TF32 989*, BF16/FP16 1979*,
# FP8 3958*, INT8 3958* (* = with sparsity) -> halved below.
_HOPPER_SXM_PEAKS = {
    "fp64": 34e12,
    "fp64_tensor": 67e12,
    "fp32": 67e12,
    "tf32_tensor": 494.5e12,
    "bf16_tensor": 989.5e12,
    "fp16_tensor": 989.5e12,
    "fp8_tensor": 1979e12,
    "int8_tensor": 1979e12,
}
# H100 NVL / H200 NVL: FP64 30, FP64 TC 60, FP32 60; TF32 835*, BF16 1671*, FP8 3341*.
_HOPPER_NVL_PEAKS = {
    "fp64": 30e12,
    "fp64_tensor": 60e12,
    "fp32": 60e12,
    "tf32_tensor": 417.5e12,
    "bf16_tensor": 835.5e12,
    "fp16_tensor": 835.5e12,
    "fp8_tensor": 1670.5e12,
    "int8_tensor": 1670.5e12,
}
# A100 (SXM4 and PCIe): FP64 9.7, FP64 TC 19.5, FP32 19.5; TF32 156 (312*), BF16/FP16 312
# (624*), INT8 624 (1248*).
_A100_PEAKS = {
    "fp64": 9.7e12,
    "fp64_tensor": 19.5e12,
    "fp32": 19.5e12,
    "tf32_tensor": 156e12,
    "bf16_tensor": 312e12,
    "fp16_tensor": 312e12,
    "int8_tensor": 624e12,
}


def _a100(name: str, alias: str, bandwidth: float, form: str) -> dict[str, Any]:
    return dict(
        name=name,
        aliases=(alias,),
        dram_bandwidth_Bps=bandwidth,
        peak_flops=_A100_PEAKS,
        source=f"NVIDIA A100 Tensor Core GPU datasheet ({form} column); {_SPARSE_NOTE}",
        **_AMPERE_SM,
    )


# Each row the keyword arguments of one `devices.DeviceSpec` (no import of it here: `devices`
# reads this module on first use).
BUILTIN: tuple[dict[str, Any], ...] = (
    dict(
        name="NVIDIA H100 SXM5 80GB",
        aliases=("NVIDIA H100 80GB HBM3", "H100 SXM", "H100 SXM5"),
        sms=132,
        dram_bandwidth_Bps=3.35e12,
        l2_bytes=50 * _MIB,
        peak_flops=_HOPPER_SXM_PEAKS,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column); {_SPARSE_NOTE}",
        **_HOPPER_SM,
    ),
    dict(
        name="NVIDIA H100 PCIe",
        aliases=("NVIDIA H100 PCIe 80GB", "H100 PCIe"),
        sms=114,
        dram_bandwidth_Bps=2.0e12,
        l2_bytes=50 * _MIB,
        peak_flops={
            "fp64": 26e12,
            "fp64_tensor": 51e12,
            "fp32": 51e12,
            "tf32_tensor": 378e12,
            "bf16_tensor": 756.5e12,
            "fp16_tensor": 756.5e12,
            "fp8_tensor": 1513e12,
            "int8_tensor": 1513e12,
        },
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column); {_SPARSE_NOTE}",
        **_HOPPER_SM,
    ),
    dict(
        name="NVIDIA H100 NVL",
        aliases=("H100 NVL",),
        sms=132,
        dram_bandwidth_Bps=3.9e12,
        l2_bytes=50 * _MIB,
        peak_flops=_HOPPER_NVL_PEAKS,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column); {_SPARSE_NOTE}",
        **_HOPPER_SM,
    ),
    dict(
        name="NVIDIA H200 SXM",
        aliases=("NVIDIA H200", "NVIDIA H200 141GB HBM3e", "H200 SXM", "H200"),
        sms=132,
        dram_bandwidth_Bps=4.8e12,
        l2_bytes=60 * _MIB,
        peak_flops=_HOPPER_SXM_PEAKS,
        source=(
            f"NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); {_SPARSE_NOTE}; "
            "L2 as torch.cuda.get_device_properties reported it on an H200"
        ),
        notes="torch names the SXM part plainly 'NVIDIA H200'",
        **_HOPPER_SM,
    ),
    dict(
        name="NVIDIA H200 NVL",
        aliases=("H200 NVL",),
        sms=132,
        dram_bandwidth_Bps=4.8e12,
        l2_bytes=60 * _MIB,
        peak_flops=_HOPPER_NVL_PEAKS,
        source=(
            f"NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column); {_SPARSE_NOTE}; "
            "L2 assumed equal to the H200 SXM's"
        ),
        **_HOPPER_SM,
    ),
    _a100("NVIDIA A100 SXM4 80GB", "NVIDIA A100-SXM4-80GB", 2.039e12, "A100 80GB SXM"),
    _a100("NVIDIA A100 SXM4 40GB", "NVIDIA A100-SXM4-40GB", 1.555e12, "A100 40GB SXM"),
    _a100("NVIDIA A100 PCIe 80GB", "NVIDIA A100 80GB PCIe", 1.935e12, "A100 80GB PCIe"),
    _a100("NVIDIA A100 PCIe 40GB", "NVIDIA A100-PCIE-40GB", 1.555e12, "A100 40GB PCIe"),
    dict(
        name="NVIDIA L4",
        aliases=("L4",),
        sms=58,
        dram_bandwidth_Bps=300e9,
        l2_bytes=48 * _MIB,
        # The datasheet lists no FP64 rate (Ada runs FP64 at 1/64 of FP32): left out, so
        # fp64 work on an L4 uses the measured fp64 ceiling.
        peak_flops={
            "fp32": 30.3e12,
            "tf32_tensor": 60e12,
            "bf16_tensor": 121e12,
            "fp16_tensor": 121e12,
            "fp8_tensor": 242.5e12,
            "int8_tensor": 242.5e12,
        },
        source=f"NVIDIA L4 Tensor Core GPU datasheet; {_SPARSE_NOTE}",
        **_ADA_SM,
    ),
    dict(
        name="NVIDIA L40S",
        aliases=("L40S",),
        sms=142,
        dram_bandwidth_Bps=864e9,
        l2_bytes=96 * _MIB,
        peak_flops={
            "fp32": 91.6e12,
            "tf32_tensor": 183e12,
            "bf16_tensor": 362.05e12,
            "fp16_tensor": 362.05e12,
            "fp8_tensor": 733e12,
            "int8_tensor": 733e12,
        },
        source="NVIDIA L40S datasheet (dense column; it also lists the sparse figures)",
        **_ADA_SM,
    ),
    dict(
        name="NVIDIA B200",
        aliases=("B200", "NVIDIA B200 SXM"),
        sms=148,
        dram_bandwidth_Bps=8.0e12,
        l2_bytes=int(126.5 * _MIB),
        # HGX B200 (8 GPUs): FP64/FP64 TC 296, FP32 600 TFLOP/s; TF32 18*, BF16/FP16 36*,
        # FP8 72*, INT8 72* PFLOP/s (* = sparse) -> per GPU, dense.
        peak_flops={
            "fp64": 37e12,
            "fp64_tensor": 37e12,
            "fp32": 75e12,
            "tf32_tensor": 1.125e15,
            "bf16_tensor": 2.25e15,
            "fp16_tensor": 2.25e15,
            "fp8_tensor": 4.5e15,
            "int8_tensor": 4.5e15,
        },
        source=(
            f"NVIDIA HGX B200 datasheet, per GPU (platform figures / 8); {_SPARSE_NOTE}; "
            "SMs and L2 as the CUDA driver reports them"
        ),
        notes="the driver reports a 7680-bit bus: about 7.7 TB/s, below the datasheet's 8",
        **_BLACKWELL_SM,
    ),
)
