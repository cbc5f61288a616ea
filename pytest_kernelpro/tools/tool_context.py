"""What a tool reads: `ToolContext` (one kernel's metrics, SASS, ptxas, the item's timeline,
linkage, Stage 1 and roofline facts) and `MetricRequest` (a metric with its alternatives).

The input half of the tool contract (`contract`); `finding` is the output half.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kernelpro.errors import KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import (
        KernelMetrics,
        KernelProfile,
        LibraryLinkage,
        PtxasReport,
        SassSummary,
        TimelineSummary,
    )
    from pytest_kernelpro.tools.stage1 import Stage1

# Inputs beyond ncu metrics that a tool may declare in `required_inputs`.
INPUTS: tuple[str, ...] = (
    "metrics",
    "sass",
    "ptxas",
    "timeline",
    "min_bytes",
    "flops",
    "kernels",
)

# Kernels that ship in a vendor or framework library: the user cannot edit them, so findings
# on them say "change the call", and the registry caps their severity.
# PyTorch's kernels also show up without their `at::native::` namespace (ncu prints e.g.
# "void reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<...>>>(T3)"), so its
# TensorIterator template arguments are markers too.
LIBRARY_KERNEL_RE = re.compile(
    r"(cublas|cutlass|nvjet|xmma|cudnn|cusparse|cufft|\bsm\d+_|ampere_|hopper_|volta_|"
    r"turing_|gemv2?T?_kernel|gemmSN|flash_fwd|flash_bwd|\bat::|cunn_|\bc10::|"
    r"TensorIterator|func_wrapper_t|gpu_kernel_impl)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class MetricRequest:
    """One ncu metric a tool reads: the name, a short alias for messages, whether the tool
    cannot run without it, and alternative names tried in order when `name` is absent."""

    name: str
    alias: str
    required: bool = True
    alternatives: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.alternatives)


@dataclass
class ToolContext:
    """Everything a tool may read about one kernel (or, for timeline tools, one item)."""

    kernel: KernelProfile | None = None
    arch: str | None = None  # "sm_90", "sm_90a", ...
    stage1: Stage1 | None = None
    op_category: str | None = None  # "gemm", "softmax", ... of the reference, if known
    timeline: TimelineSummary | None = None
    linkage: LibraryLinkage | None = None
    min_bytes: float | None = None  # minimal DRAM bytes of the reference (roofline)
    flops: float | None = None
    dtype: str | None = None  # "float32", "bfloat16", ...
    roofline_fraction: float | None = None  # measured efficiency vs the roofline, 0..1
    timed_median_s: float | None = None  # the item's timed median (calls back to back)
    # Every kernel of the item's profile (one call of the item), for item-scope tools that
    # compare kernels, e.g. several memory-bound kernels that could be one.
    kernels: tuple[KernelProfile, ...] = ()

    @property
    def kernel_name(self) -> str:
        if self.kernel is None:
            return "(item)"
        return self.kernel.name

    @property
    def metrics(self) -> KernelMetrics | None:
        return None if self.kernel is None else self.kernel.metrics

    @property
    def sass(self) -> SassSummary | None:
        return None if self.kernel is None else self.kernel.sass

    @property
    def ptxas(self) -> PtxasReport | None:
        return None if self.kernel is None else self.kernel.ptxas

    @property
    def bottleneck(self) -> str | None:
        """The Stage-1 class ("memory", "compute", "mixed", "latency") or None."""
        return None if self.stage1 is None else self.stage1.cls

    def resolve(self, request: MetricRequest | str) -> tuple[str, float] | None:
        """(name, value) of the first present name of `request`, or None."""
        metrics = self.metrics
        if metrics is None:
            return None
        names = (request,) if isinstance(request, str) else request.names
        for name in names:
            value = metrics.get(name)
            if value is not None and not math.isnan(value):
                return name, value
        return None

    def value(self, request: MetricRequest | str, default: float | None = None) -> float | None:
        """The numeric value of the first present name of `request`, else `default`."""
        found = self.resolve(request)
        return default if found is None else found[1]

    def has_input(self, name: str) -> bool:
        """Whether a non-metric input ("sass", "ptxas", "timeline", "min_bytes", "flops",
        "kernels") is present."""
        if name == "metrics":
            return self.metrics is not None
        if name == "sass":
            return self.sass is not None
        if name == "ptxas":
            return self.ptxas is not None
        if name == "timeline":
            return self.timeline is not None
        if name == "min_bytes":
            return self.min_bytes is not None and self.min_bytes > 0
        if name == "flops":
            return self.flops is not None and self.flops > 0
        if name == "kernels":
            return any(k.metrics is not None for k in self.kernels)
        raise KernelproError(f"Unknown tool input {name!r}; use one of {', '.join(INPUTS)}")

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) from `arch` ("sm_90a" -> (9, 0)) or ncu's device attributes."""
        if self.arch:
            m = re.match(r"(?:sm_|compute_)?(\d+?)(\d)[a-z]?$", self.arch.strip().lower())
            if m:
                return int(m.group(1)), int(m.group(2))
        major = self.value("device__attribute_compute_capability_major")
        minor = self.value("device__attribute_compute_capability_minor")
        if major is not None and minor is not None:
            return int(major), int(minor)
        return None

    @property
    def is_hopper(self) -> bool:
        return self.compute_capability == (9, 0)

    @property
    def sm_count(self) -> int | None:
        value = self.value(
            MetricRequest(
                "launch__sm_count", "SMs", alternatives=("device__attribute_multiprocessor_count",)
            )
        )
        return None if value is None else int(value)

    @property
    def library_match(self) -> str | None:
        """The library marker in the kernel's name (e.g. "nvjet", "cutlass") or None.

        Only the kernel's name counts: a module that links cuBLAS may still launch its own
        hand-written kernels, which stay fully actionable.
        """
        m = LIBRARY_KERNEL_RE.search(self.kernel_name)
        return None if m is None else m.group(1)

    @property
    def links_blas(self) -> bool:
        """Whether the compiled module links cuBLAS/cuBLASLt (its GEMMs run as library calls)."""
        return bool(self.linkage and (self.linkage.cublas or self.linkage.cublaslt))
