"""The built-in tools: one list, which `ToolRegistry.builtin()` and the default registry hold.

Each tool module is a self-contained rule file (it imports `contract`, `signals`, `advice` and
`streaming`, never another tool module); this list is the only place that knows them all.
"""

from __future__ import annotations

from pytest_kernelpro.tools.contract import ProfilingTool
from pytest_kernelpro.tools.divergence import WarpDivergenceTool
from pytest_kernelpro.tools.dram import DramSaturationTool, L2LocalityTool
from pytest_kernelpro.tools.fusion import KernelFusionTool
from pytest_kernelpro.tools.instructions import InstructionOverheadTool
from pytest_kernelpro.tools.launch import LaunchConfigTool, SmallGridTool, TailEffectTool
from pytest_kernelpro.tools.memory import GlobalCoalescingTool, VectorizationTool
from pytest_kernelpro.tools.occupancy import OccupancyTool
from pytest_kernelpro.tools.pipes import FP64Tool, FusedFmaTool, PipeUtilizationTool
from pytest_kernelpro.tools.shared import AsyncCopyTool, SharedBankConflictTool
from pytest_kernelpro.tools.spills import RegisterSpillDetector
from pytest_kernelpro.tools.stalls import BarrierStallTool, WarpStallTool
from pytest_kernelpro.tools.tensorcore import TensorCoreUnderutilizationTool, WGMMAInstructionTool
from pytest_kernelpro.tools.timeline import LaunchOverheadTool, SynchronizationTool
from pytest_kernelpro.tools.work import FlopOverheadTool

BUILTIN_TOOLS: tuple[type[ProfilingTool], ...] = (
    DramSaturationTool,
    L2LocalityTool,
    KernelFusionTool,
    SmallGridTool,
    TailEffectTool,
    LaunchConfigTool,
    GlobalCoalescingTool,
    VectorizationTool,
    OccupancyTool,
    PipeUtilizationTool,
    FP64Tool,
    FusedFmaTool,
    WarpDivergenceTool,
    InstructionOverheadTool,
    SharedBankConflictTool,
    AsyncCopyTool,
    RegisterSpillDetector,
    WarpStallTool,
    BarrierStallTool,
    TensorCoreUnderutilizationTool,
    WGMMAInstructionTool,
    LaunchOverheadTool,
    SynchronizationTool,
    FlopOverheadTool,
)
