"""The built-in GPU table: datacenter GPUs and their datasheet ceilings (`devices.DeviceSpec`'s
fields; every tensor-core rate dense, as `devices.py` states). Read by
`devices.builtin_device_specs` on first use (a CPU session never needs it).
"""

from __future__ import annotations

from typing import Any

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
        arch="sm_80",
        sms=108,
        dram_bandwidth_Bps=bandwidth,
        peak_flops=_A100_PEAKS,
        source=f"NVIDIA A100 Tensor Core GPU datasheet ({form} column); {_SPARSE_NOTE}",
    )


# Each row the keyword arguments of one `devices.DeviceSpec` (no import of it here: `devices`
# reads this module on first use).
BUILTIN: tuple[dict[str, Any], ...] = (
    dict(
        name="NVIDIA H100 SXM5 80GB",
        aliases=("NVIDIA H100 80GB HBM3", "H100 SXM", "H100 SXM5"),
        arch="sm_90",
        sms=132,
        dram_bandwidth_Bps=3.35e12,
        peak_flops=_HOPPER_SXM_PEAKS,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column); {_SPARSE_NOTE}",
    ),
    dict(
        name="NVIDIA H100 PCIe",
        aliases=("NVIDIA H100 PCIe 80GB", "H100 PCIe"),
        arch="sm_90",
        sms=114,
        dram_bandwidth_Bps=2.0e12,
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
    ),
    dict(
        name="NVIDIA H100 NVL",
        aliases=("H100 NVL",),
        arch="sm_90",
        sms=132,
        dram_bandwidth_Bps=3.9e12,
        peak_flops=_HOPPER_NVL_PEAKS,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column); {_SPARSE_NOTE}",
    ),
    dict(
        name="NVIDIA H200 SXM",
        aliases=("NVIDIA H200", "NVIDIA H200 141GB HBM3e", "H200 SXM", "H200"),
        arch="sm_90",
        sms=132,
        dram_bandwidth_Bps=4.8e12,
        peak_flops=_HOPPER_SXM_PEAKS,
        source=f"NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); {_SPARSE_NOTE}",
        notes="torch names the SXM part plainly 'NVIDIA H200'",
    ),
    dict(
        name="NVIDIA H200 NVL",
        aliases=("H200 NVL",),
        arch="sm_90",
        sms=132,
        dram_bandwidth_Bps=4.8e12,
        peak_flops=_HOPPER_NVL_PEAKS,
        source=f"NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column); {_SPARSE_NOTE}",
    ),
    _a100("NVIDIA A100 SXM4 80GB", "NVIDIA A100-SXM4-80GB", 2.039e12, "A100 80GB SXM"),
    _a100("NVIDIA A100 SXM4 40GB", "NVIDIA A100-SXM4-40GB", 1.555e12, "A100 40GB SXM"),
    _a100("NVIDIA A100 PCIe 80GB", "NVIDIA A100 80GB PCIe", 1.935e12, "A100 80GB PCIe"),
    _a100("NVIDIA A100 PCIe 40GB", "NVIDIA A100-PCIE-40GB", 1.555e12, "A100 40GB PCIe"),
    dict(
        name="NVIDIA L4",
        aliases=("L4",),
        arch="sm_89",
        sms=58,
        dram_bandwidth_Bps=300e9,
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
    ),
    dict(
        name="NVIDIA L40S",
        aliases=("L40S",),
        arch="sm_89",
        sms=142,
        dram_bandwidth_Bps=864e9,
        peak_flops={
            "fp32": 91.6e12,
            "tf32_tensor": 183e12,
            "bf16_tensor": 362.05e12,
            "fp16_tensor": 362.05e12,
            "fp8_tensor": 733e12,
            "int8_tensor": 733e12,
        },
        source="NVIDIA L40S datasheet (dense column; it also lists the sparse figures)",
    ),
    dict(
        name="NVIDIA B200",
        aliases=("B200", "NVIDIA B200 SXM"),
        arch="sm_100",
        sms=148,
        dram_bandwidth_Bps=8.0e12,
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
            "SMs as the CUDA driver reports them"
        ),
        notes="the driver reports a 7680-bit bus: about 7.7 TB/s, below the datasheet's 8",
    ),
)
