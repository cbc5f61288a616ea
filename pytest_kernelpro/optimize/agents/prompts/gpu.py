"""GPU-aware prompt injection: the target's architecture, limits and tensor-core instruction
shapes (`gpu_facts.py`) and, where CUTLASS is found, its include paths, build flags and hard
constraints.

Built once per agent (`gpu_context(device_name)`), so the model does not have to remember
which MMA instruction shapes and compile target a given GPU needs.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pytest_kernelpro.measure.devices import find_device_spec
from pytest_kernelpro.optimize.agents.prompts.gpu_facts import ARCH_FACTS, L2_BYTES

if TYPE_CHECKING:
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.optimize.cutlass.constraints import Constraint
    from pytest_kernelpro.optimize.cutlass.flags import BuildFlags
    from pytest_kernelpro.optimize.cutlass.locate import CutlassInstall

CutlassOption = Literal["auto", "off"]
_PEAK_LABELS = {
    "fp64": "FP64",
    "fp32": "FP32",
    "tf32_tensor": "TF32 tensor",
    "bf16_tensor": "BF16 tensor",
    "fp16_tensor": "FP16 tensor",
    "fp8_tensor": "FP8 tensor",
    "int8_tensor": "INT8 tensor (ops/s)",
}


@dataclass(frozen=True)
class GpuContext:
    """What the prompt says about the target device."""

    device_name: str
    text: str
    spec: DeviceSpec | None = None
    target: str | None = None  # compile target, e.g. "sm_90a"; None on the CPU
    flags: BuildFlags | None = None
    cutlass: CutlassInstall | None = None
    cutlass_note: str = ""
    constraints: tuple[Constraint, ...] = field(default_factory=tuple)

    @property
    def is_cpu(self) -> bool:
        """True when there is no CUDA target."""
        return self.target is None


def _is_cpu(name: str | None) -> bool:
    return name is None or name.strip().lower() in ("", "cpu") or name.lower().startswith("cpu")


def _kib(n: float) -> str:
    return f"{n / 1024:.0f} KB"


def _spec_lines(spec: DeviceSpec, target: str) -> list[str]:
    # "sm_90a" names the arch-specific target of sm_90's hardware: the same facts.
    facts = ARCH_FACTS.get(spec.arch.rstrip(string.ascii_lowercase))
    l2_bytes = L2_BYTES.get(spec.name)
    limits = [f"{spec.sms} SMs"]
    if facts is not None:
        limits += [
            f"shared memory {_kib(facts.smem_per_sm_bytes)} per SM, at most "
            f"{_kib(facts.max_smem_per_block_bytes)} per block (opt in above 48 KB with "
            "cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))",
            f"{facts.regs_per_sm} registers and {facts.max_threads_per_sm} threads per SM",
        ]
    if l2_bytes is not None:
        limits.append(f"L2 {l2_bytes / 2**20:.0f} MB")
    limits.append(f"DRAM {spec.dram_bandwidth_Bps / 1e12:.2f} TB/s")
    lines = [
        f"## Target GPU: {spec.name} ({spec.arch}; compile for `{target}`)",
        "- " + "; ".join(limits) + ".",
    ]
    peaks = [
        f"{_PEAK_LABELS.get(k, k)} {v / 1e12:.0f} T"
        for k, v in spec.peak_flops.items()
        if k in _PEAK_LABELS
    ]
    if peaks:
        lines.append("- Dense peak FLOP/s: " + ", ".join(peaks) + ".")
    if facts is None:
        lines.append(
            "- The shared-memory, register and thread limits and the tensor-core instructions "
            f"of {spec.arch} are not known here: read them from "
            "`torch.cuda.get_device_properties()` and the PTX ISA before relying on them."
        )
    else:
        lines.append("- Tensor-core instructions of this architecture (use exactly these shapes):")
        lines += [f"  - `{shape}`" for shape in facts.mma_shapes]
    return lines


def gpu_context(
    device_name: str | None,
    *,
    cutlass: CutlassOption | CutlassInstall = "auto",
    extra_specs: tuple[DeviceSpec, ...] = (),
) -> GpuContext:
    """The GPU injection for `device_name` ("NVIDIA H200", "cpu", None = CPU).

    `cutlass="auto"` looks for CUTLASS (CUTLASS_PATH or the nvidia-cutlass wheel) and, when
    found, adds its include paths, flags and the mined hard constraints; "off" leaves it out.
    """
    from pytest_kernelpro.optimize.cutlass.constraints import mine_constraints, render_constraints
    from pytest_kernelpro.optimize.cutlass.flags import build_flags, target_arch
    from pytest_kernelpro.optimize.cutlass.locate import CutlassInstall, locate_cutlass

    if _is_cpu(device_name):
        text = (
            "## Target device: CPU (no CUDA GPU)\n"
            "Candidates are built and timed on the CPU: CUDA kernels cannot run here. Write "
            "C++ through `load_inline(cpp_sources=..., functions=[...])` without CUDA sources, "
            "or restructured PyTorch; vectorize and use all cores (OpenMP via "
            "`extra_cflags=['-O3', '-fopenmp']`, `extra_ldflags=['-fopenmp']`).\n"
        )
        return GpuContext(device_name or "cpu", text)
    name = str(device_name)
    spec = find_device_spec(name, extra_specs)
    if spec is None:
        text = (
            f"## Target GPU: {name} (not in the device table)\n"
            "Its architecture is unknown here: use instructions every sm_80+ GPU has "
            "(`mma.sync m16n8k16` for bf16/fp16, cp.async) and read "
            "`torch.cuda.get_device_capability()` if you specialize.\n"
        )
        return GpuContext(name, text)
    target = target_arch(spec.arch)
    lines = _spec_lines(spec, target)
    install: CutlassInstall | None = None
    note = ""
    if isinstance(cutlass, CutlassInstall):
        install = cutlass
    elif cutlass == "auto":
        lookup = locate_cutlass()
        install, note = lookup.install, lookup.reason
    flags = build_flags(target, install)
    lines += ["", "### Build flags for `load_inline`", flags.describe()]
    if install is not None:
        lines += [
            "",
            f"### CUTLASS/CuTe available: {install.describe()}",
            "You may `#include <cute/tensor.hpp>` and `<cutlass/...>` headers; pass the include "
            "paths and flags above to load_inline. Prefer CuTe atoms matching the instruction "
            "shapes above (e.g. `SM90_64x128x16_F32BF16BF16_SS` on Hopper).",
        ]
    elif cutlass == "auto":
        lines += ["", "CUTLASS headers are not available here: write CUDA C++/PTX directly."]
    # The hard constraints hold for raw PTX as much as for CUTLASS; with a CUTLASS tree they
    # also cite the source that enforces them.
    constraints = tuple(mine_constraints(install, arch=target))
    rendered = render_constraints(constraints)
    if rendered:
        lines += ["", rendered.rstrip()]
    return GpuContext(
        name,
        "\n".join(lines) + "\n",
        spec=spec,
        target=target,
        flags=flags,
        cutlass=install,
        cutlass_note=note,
        constraints=constraints,
    )
