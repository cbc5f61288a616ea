"""The device model: a table of datacenter GPUs and their datasheet ceilings.

Numbers here are leads, not ceilings: the roofline uses the rates measured on the machine
(`ceilings.py`) and falls back to these only for what it did not measure. Every tensor-core
rate is DENSE: NVIDIA's datasheets quote tensor rates "with sparsity" (2:4 structured), which
is twice the dense rate, so those numbers are halved here and the `source` says so.

No torch import: the plugin reads this table at collection time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError

#: The peak keys a spec may carry (FLOP/s; "int8_tensor" is ops/s).
PEAK_KEYS: tuple[str, ...] = (
    "fp64",
    "fp64_tensor",
    "fp32",
    "tf32_tensor",
    "fp16_tensor",
    "bf16_tensor",
    "fp8_tensor",
    "int8_tensor",
)

_ARCH_RE = re.compile(r"^sm_\d+[a-z]?$")
_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model's datasheet numbers.

    `aliases` are compared with `torch.cuda.get_device_name()` after normalisation (case,
    `-`/`_` as spaces, a leading "NVIDIA" dropped), never by substring, so "NVIDIA H100 NVL"
    can never be mistaken for an H100 SXM.
    """

    name: str
    aliases: tuple[str, ...]
    arch: str
    sms: int
    dram_bandwidth_Bps: float
    l2_bytes: int
    smem_per_sm_bytes: int
    max_smem_per_block_bytes: int
    regs_per_sm: int
    max_threads_per_sm: int
    peak_flops: Mapping[str, float]
    mma_shapes: tuple[str, ...]
    source: str
    memory_bytes: int = 0
    notes: str = ""

    def __post_init__(self) -> None:
        where = f"device spec {self.name!r}"
        if not self.name:
            raise KernelproConfigError("device spec has an empty name; give it the GPU's name")
        if not _ARCH_RE.match(self.arch):
            raise KernelproConfigError(
                f"{where}: arch {self.arch!r} is not like 'sm_90'; use the sm_XY form"
            )
        for attr in (
            "sms",
            "dram_bandwidth_Bps",
            "l2_bytes",
            "smem_per_sm_bytes",
            "max_smem_per_block_bytes",
            "regs_per_sm",
            "max_threads_per_sm",
        ):
            value = getattr(self, attr)
            if not isinstance(value, (int, float)) or value <= 0:
                raise KernelproConfigError(f"{where}: {attr}={value!r} must be a positive number")
        unknown = sorted(set(self.peak_flops) - set(PEAK_KEYS))
        if unknown:
            raise KernelproConfigError(
                f"{where}: unknown peak_flops keys {unknown}; use only {list(PEAK_KEYS)}"
            )
        for key, value in self.peak_flops.items():
            if not isinstance(value, (int, float)) or value <= 0:
                raise KernelproConfigError(
                    f"{where}: peak_flops[{key!r}]={value!r} must be a positive FLOP/s number"
                )
        # A private copy of plain floats, so a caller's later edit of its dict cannot change us.
        object.__setattr__(self, "peak_flops", {k: float(v) for k, v in self.peak_flops.items()})
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "mma_shapes", tuple(self.mma_shapes))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "arch": self.arch,
            "sms": self.sms,
            "dram_bandwidth_Bps": self.dram_bandwidth_Bps,
            "l2_bytes": self.l2_bytes,
            "smem_per_sm_bytes": self.smem_per_sm_bytes,
            "max_smem_per_block_bytes": self.max_smem_per_block_bytes,
            "regs_per_sm": self.regs_per_sm,
            "max_threads_per_sm": self.max_threads_per_sm,
            "peak_flops": dict(self.peak_flops),
            "mma_shapes": list(self.mma_shapes),
            "source": self.source,
            "memory_bytes": self.memory_bytes,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceSpec:
        """Build a spec from `to_dict()` output (or a team's YAML/JSON of the same keys)."""
        known = {
            "name",
            "aliases",
            "arch",
            "sms",
            "dram_bandwidth_Bps",
            "l2_bytes",
            "smem_per_sm_bytes",
            "max_smem_per_block_bytes",
            "regs_per_sm",
            "max_threads_per_sm",
            "peak_flops",
            "mma_shapes",
            "source",
            "memory_bytes",
            "notes",
        }
        extra = sorted(set(data) - known)
        if extra:
            raise KernelproConfigError(
                f"device spec {data.get('name')!r}: unknown keys {extra}; use only {sorted(known)}"
            )
        try:
            return cls(
                name=str(data["name"]),
                aliases=tuple(data.get("aliases", ())),
                arch=str(data["arch"]),
                sms=int(data["sms"]),
                dram_bandwidth_Bps=float(data["dram_bandwidth_Bps"]),
                l2_bytes=int(data["l2_bytes"]),
                smem_per_sm_bytes=int(data["smem_per_sm_bytes"]),
                max_smem_per_block_bytes=int(data["max_smem_per_block_bytes"]),
                regs_per_sm=int(data["regs_per_sm"]),
                max_threads_per_sm=int(data["max_threads_per_sm"]),
                peak_flops=dict(data["peak_flops"]),
                mma_shapes=tuple(data.get("mma_shapes", ())),
                source=str(data.get("source", "")),
                memory_bytes=int(data.get("memory_bytes", 0)),
                notes=str(data.get("notes", "")),
            )
        except KeyError as exc:
            raise KernelproConfigError(
                f"device spec {data.get('name')!r} lacks key {exc.args[0]!r}; add it"
            ) from None

    def matches(self, device_name: str) -> bool:
        """Whether `device_name` (as torch reports it) is this spec's name or an alias."""
        wanted = normalize_device_name(device_name)
        return any(normalize_device_name(n) == wanted for n in (self.name, *self.aliases))


def normalize_device_name(name: str) -> str:
    """Lower-case, `-`/`_` as spaces, single spaces, a leading "nvidia " dropped."""
    text = re.sub(r"[-_\s]+", " ", name.strip().lower())
    return text.removeprefix("nvidia ").strip()


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


def _a100(name: str, alias: str, bandwidth: float, memory_gb: int, form: str) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        aliases=(alias,),
        dram_bandwidth_Bps=bandwidth,
        peak_flops=_A100_PEAKS,
        memory_bytes=memory_gb * 10**9,
        source=f"NVIDIA A100 Tensor Core GPU datasheet ({form} column); {_SPARSE_NOTE}",
        **_AMPERE_SM,  # type: ignore[arg-type]
    )


_BUILTIN: tuple[DeviceSpec, ...] = (
    DeviceSpec(
        name="NVIDIA H100 SXM5 80GB",
        aliases=("NVIDIA H100 80GB HBM3", "H100 SXM", "H100 SXM5"),
        sms=132,
        dram_bandwidth_Bps=3.35e12,
        l2_bytes=50 * _MIB,
        peak_flops=_HOPPER_SXM_PEAKS,
        memory_bytes=80 * 10**9,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column); {_SPARSE_NOTE}",
        **_HOPPER_SM,  # type: ignore[arg-type]
    ),
    DeviceSpec(
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
        memory_bytes=80 * 10**9,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column); {_SPARSE_NOTE}",
        **_HOPPER_SM,  # type: ignore[arg-type]
    ),
    DeviceSpec(
        name="NVIDIA H100 NVL",
        aliases=("H100 NVL",),
        sms=132,
        dram_bandwidth_Bps=3.9e12,
        l2_bytes=50 * _MIB,
        peak_flops=_HOPPER_NVL_PEAKS,
        memory_bytes=94 * 10**9,
        source=f"NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column); {_SPARSE_NOTE}",
        **_HOPPER_SM,  # type: ignore[arg-type]
    ),
    DeviceSpec(
        name="NVIDIA H200 SXM",
        aliases=("NVIDIA H200", "NVIDIA H200 141GB HBM3e", "H200 SXM", "H200"),
        sms=132,
        dram_bandwidth_Bps=4.8e12,
        l2_bytes=60 * _MIB,
        peak_flops=_HOPPER_SXM_PEAKS,
        memory_bytes=141 * 10**9,
        source=(
            f"NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); {_SPARSE_NOTE}; "
            "L2 as torch.cuda.get_device_properties reported it on an H200"
        ),
        notes="torch names the SXM part plainly 'NVIDIA H200'",
        **_HOPPER_SM,  # type: ignore[arg-type]
    ),
    DeviceSpec(
        name="NVIDIA H200 NVL",
        aliases=("H200 NVL",),
        sms=132,
        dram_bandwidth_Bps=4.8e12,
        l2_bytes=60 * _MIB,
        peak_flops=_HOPPER_NVL_PEAKS,
        memory_bytes=141 * 10**9,
        source=(
            f"NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column); {_SPARSE_NOTE}; "
            "L2 assumed equal to the H200 SXM's"
        ),
        **_HOPPER_SM,  # type: ignore[arg-type]
    ),
    _a100("NVIDIA A100 SXM4 80GB", "NVIDIA A100-SXM4-80GB", 2.039e12, 80, "A100 80GB SXM"),
    _a100("NVIDIA A100 SXM4 40GB", "NVIDIA A100-SXM4-40GB", 1.555e12, 40, "A100 40GB SXM"),
    _a100("NVIDIA A100 PCIe 80GB", "NVIDIA A100 80GB PCIe", 1.935e12, 80, "A100 80GB PCIe"),
    _a100("NVIDIA A100 PCIe 40GB", "NVIDIA A100-PCIE-40GB", 1.555e12, 40, "A100 40GB PCIe"),
    DeviceSpec(
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
        memory_bytes=24 * 10**9,
        source=f"NVIDIA L4 Tensor Core GPU datasheet; {_SPARSE_NOTE}",
        **_ADA_SM,  # type: ignore[arg-type]
    ),
    DeviceSpec(
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
        memory_bytes=48 * 10**9,
        source="NVIDIA L40S datasheet (dense column; it also lists the sparse figures)",
        **_ADA_SM,  # type: ignore[arg-type]
    ),
    DeviceSpec(
        name="NVIDIA B200",
        aliases=("B200", "NVIDIA B200 SXM"),
        arch="sm_100",
        sms=148,
        dram_bandwidth_Bps=8.0e12,
        l2_bytes=int(126.5 * _MIB),
        smem_per_sm_bytes=228 * _KIB,
        max_smem_per_block_bytes=227 * _KIB,
        regs_per_sm=65536,
        max_threads_per_sm=2048,
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
        mma_shapes=_BLACKWELL_MMA,
        memory_bytes=180 * 10**9,
        source=(
            f"NVIDIA HGX B200 datasheet, per GPU (platform figures / 8); {_SPARSE_NOTE}; "
            "SMs and L2 as the CUDA driver reports them"
        ),
        notes="the driver reports a 7680-bit bus: about 7.7 TB/s, below the datasheet's 8",
    ),
)


def builtin_device_specs() -> tuple[DeviceSpec, ...]:
    """The built-in GPU table (datasheet numbers, dense tensor rates)."""
    return _BUILTIN


def find_device_spec(device_name: str, extra: Iterable[DeviceSpec] = ()) -> DeviceSpec | None:
    """The spec whose name or alias equals `device_name` (normalised), or None.

    `extra` (specs a team adds through the `pytest_kernelpro_device_specs` hook) is searched
    first, so a team's entry overrides a built-in one of the same name.
    """
    for spec in (*tuple(extra), *_BUILTIN):
        if spec.matches(device_name):
            return spec
    return None
