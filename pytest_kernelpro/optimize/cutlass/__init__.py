"""CUTLASS/CuTe support: find the headers, build flags per architecture, code-search tools
for the Programmer Agent, a shared-memory layout probe compiled with nvcc, and the hard
architectural constraints (mined from the CUTLASS source, checked before compilation).

Nothing here imports torch or runs a GPU; `check_smem_layout` needs only nvcc.
"""

from __future__ import annotations

from pytest_kernelpro.optimize.cutlass.constraints import (
    CONSTRAINTS,
    Constraint,
    Violation,
    check_source,
    mine_constraints,
    render_constraints,
)
from pytest_kernelpro.optimize.cutlass.flags import (
    BuildFlags,
    build_flags,
    gencode_flag,
    target_arch,
)
from pytest_kernelpro.optimize.cutlass.locate import CutlassInstall, CutlassLookup, locate_cutlass
from pytest_kernelpro.optimize.cutlass.search_tools import CutlassSearchTools, CutlassToolError
from pytest_kernelpro.optimize.cutlass.smem_check import (
    SmemCheckResult,
    check_smem_layout,
    compile_probe,
    find_nvcc,
)

__all__ = [
    "CONSTRAINTS",
    "BuildFlags",
    "Constraint",
    "CutlassInstall",
    "CutlassLookup",
    "CutlassSearchTools",
    "CutlassToolError",
    "SmemCheckResult",
    "Violation",
    "build_flags",
    "check_smem_layout",
    "check_source",
    "compile_probe",
    "find_nvcc",
    "gencode_flag",
    "locate_cutlass",
    "mine_constraints",
    "render_constraints",
    "target_arch",
]
