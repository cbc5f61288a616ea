"""Hard architectural constraints for CUTLASS/CuTe (and raw PTX) Hopper code.

Two halves:

- `mine_constraints(install, arch)`: the constraint texts (barrier lifecycle, warp
  specialization, TMA pipeline depth and alignment, epilogue vectorization, smem swizzle),
  each anchored to the CUTLASS source that enforces it. With an installed CUTLASS tree the
  anchors are looked up there, numbers are taken from the source (the producer/consumer
  register counts of the warp-specialized kernels, for instance) and every constraint cites
  `file:line`; without one the texts stand alone. `render_constraints` makes them the
  "non-negotiable" prompt section.
- `check_source(source, arch)`: a static pre-compile check of a candidate's text against the
  same rules, returning `Violation`s (error or warning). It reads the code as text (comments
  stripped): it flags a rule when the code uses the feature but lacks what the rule requires,
  and never runs anything.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pytest_kernelpro.optimize.cutlass.flags import parse_arch

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.cutlass.locate import CutlassInstall

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Anchor:
    """Where a constraint lives in CUTLASS: a path glob (relative to the root) and a regex.
    `values` names the regex groups whose text fills `{name}` fields of the constraint."""

    glob: str
    pattern: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Constraint:
    """One hard requirement, as prompt text, with its evidence in the CUTLASS source."""

    id: str
    topic: str
    text: str
    min_arch: int = 90
    anchors: tuple[Anchor, ...] = ()
    evidence: tuple[str, ...] = ()

    def render(self) -> str:
        """One Markdown bullet (with its citations)."""
        cite = f" (CUTLASS: {'; '.join(self.evidence)})" if self.evidence else ""
        return f"- **[{self.id}]** {self.text}{cite}"


@dataclass(frozen=True)
class Violation:
    """A candidate line that breaks a constraint."""

    constraint: str
    severity: Severity
    message: str
    line: int | None = None

    def render(self) -> str:
        """`error [id] line N: message`."""
        where = f" line {self.line}" if self.line else ""
        return f"{self.severity} [{self.constraint}]{where}: {self.message}"


_DEFAULTS = {"load_regs": "40", "mma_regs": "232"}

CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        "barrier-init",
        "barrier_lifecycle",
        "Initialize each mbarrier once, from one thread, then make the init visible with "
        "`cutlass::arch::fence_barrier_init()` (PTX `fence.mbarrier_init.release.cluster`) AND "
        "a block or cluster sync (`__syncthreads()`, or cluster arrive+wait) before any thread "
        "arrives at or waits on it.",
        anchors=(Anchor("include/cutlass/arch/barrier.h", r"void fence_barrier_init\(\)"),),
    ),
    Constraint(
        "barrier-expect-tx",
        "barrier_lifecycle",
        "A TMA load signals its mbarrier with transaction bytes: the producer calls "
        "`arrive_and_expect_tx(bytes)` (PTX `mbarrier.arrive.expect_tx`) with exactly the bytes "
        "all TMA copies of that stage deliver, before consumers wait; a wrong count hangs.",
        anchors=(Anchor("include/cutlass/arch/barrier.h", r"void arrive_and_expect_tx\("),),
    ),
    Constraint(
        "barrier-phase",
        "barrier_lifecycle",
        "Wait on a stage's full barrier with its phase bit and flip the phase each time the "
        "stage index wraps; the producer refills a stage only after the consumers released it "
        "on the empty barrier (CUTLASS PipelineState / PipelineTmaAsync).",
        anchors=(
            Anchor("include/cutlass/pipeline/sm90_pipeline.hpp", r"struct PipelineState\b"),
            Anchor("include/cutlass/pipeline/sm90_pipeline.hpp", r"class PipelineTmaAsync\b"),
        ),
    ),
    Constraint(
        "warpgroup-shape",
        "warp_specialization",
        "wgmma is issued by a whole warpgroup: 4 consecutive warps (128 threads) starting at a "
        "warp index divisible by 4. Block sizes are multiples of 128 and roles are assigned per "
        "warpgroup (`threadIdx.x / 128`).",
        anchors=(Anchor("include/cutlass/cutlass.h", r"NumThreadsPerWarpGroup = 128"),),
    ),
    Constraint(
        "warpgroup-registers",
        "warp_specialization",
        "In producer/consumer (warp-specialized) kernels the TMA producer warpgroup lowers its "
        "registers with `cutlass::arch::warpgroup_reg_dealloc<N>()` and MMA consumers raise "
        "theirs with `warpgroup_reg_alloc<N>()`; N is a multiple of 8 in [24, 256] and the "
        "total must fit 64K registers per SM. CUTLASS uses {load_regs} (producer) and "
        "{mma_regs} (consumer).",
        anchors=(
            Anchor(
                "include/cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp",
                r"LoadRegisterRequirement = [^;\d]*(?P<load_regs>\d+)",
                ("load_regs",),
            ),
            Anchor(
                "include/cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp",
                r"MmaRegisterRequirement = [^;\d]*(?P<mma_regs>\d+)",
                ("mma_regs",),
            ),
        ),
    ),
    Constraint(
        "wgmma-fence",
        "warp_specialization",
        "Bracket every batch of wgmma: `warpgroup_fence_operand(accum)` and "
        "`warpgroup_arrive()` (wgmma.fence) before it, `warpgroup_commit_batch()` "
        "(wgmma.commit_group) after it, and `warpgroup_wait<N>()` (wgmma.wait_group) before "
        "the accumulators or the shared-memory stage are touched again.",
        anchors=(Anchor("include/cute/arch/mma_sm90_gmma.hpp", r"wgmma\.fence\.sync\.aligned"),),
    ),
    Constraint(
        "arch-target",
        "build",
        "wgmma, TMA and setmaxnreg exist only in the arch-specific target: compile with "
        "`-gencode=arch=compute_90a,code=sm_90a` (sm_100a on Blackwell). For plain sm_90 "
        "CUTLASS compiles these paths to traps.",
        anchors=(Anchor("include/cutlass/arch/barrier.h", r'asm volatile \("brkpt;\\n" ::\);'),),
    ),
    Constraint(
        "tma-pipeline-depth",
        "tma_pipeline",
        "TMA mainloops need at least 2 stages to overlap loads with MMA; stages x (A tile + B "
        "tile bytes) + epilogue shared memory must fit the 227 KB a block may use, so deeper "
        "pipelines need smaller tiles (3-5 stages are typical for 128x128x64 bf16 tiles).",
        anchors=(
            Anchor(
                "include/cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp",
                r"static_assert\(DispatchPolicy::Stages >= 2",
            ),
        ),
    ),
    Constraint(
        "tma-alignment",
        "tma_pipeline",
        "TMA needs 16-byte aligned global base addresses, every non-innermost global stride a "
        "multiple of 16 bytes, and a box whose innermost extent x element size is a multiple "
        "of 16 bytes (at most 256 elements per box dimension).",
        anchors=(
            Anchor("include/cute/atom/copy_traits_sm90_tma.hpp", r"Address must be 16B-aligned"),
        ),
    ),
    Constraint(
        "epilogue-vector",
        "epilogue_vectorization",
        "Vectorized epilogue stores move 128 bits (AlignmentC = 128 / sizeof_bits<ElementC>, "
        "e.g. 8 bf16): N must be a multiple of that alignment and the output pointer 16-byte "
        "aligned; otherwise store the tail with scalar stores or use a smaller alignment.",
        anchors=(
            Anchor(
                "examples/48_hopper_warp_specialized_gemm/*.cu",
                r"AlignmentC\s*=\s*128 / cutlass::sizeof_bits",
            ),
        ),
    ),
    Constraint(
        "smem-swizzle",
        "tile_swizzle",
        "Shared-memory tiles that TMA writes and wgmma reads use the GMMA layout atoms "
        "(`GMMA::Layout_K_SW128_Atom<T>`, SW64, SW32, INTER; MN variants for MN-major) tiled "
        "with `tile_to_shape` to a shape the atom divides (SW128: 8 rows x 128 bytes); the TMA "
        "descriptor must use the same swizzle. A shape the atom does not divide fails to compile "
        "with 'tile_to_shape: block shape does not divide the target shape'.",
        anchors=(
            Anchor("include/cute/atom/mma_traits_sm90_gmma.hpp", r"using Layout_K_SW128_Atom ="),
        ),
    ),
)


def _find_anchor(root: str, anchor: Anchor) -> tuple[str, dict[str, str]] | None:
    regex = re.compile(anchor.pattern)
    folder = os.path.join(root, os.path.dirname(anchor.glob))
    name_glob = os.path.basename(anchor.glob)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        if not fnmatch.fnmatch(name, name_glob):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for number, line in enumerate(handle, start=1):
                    match = regex.search(line)
                    if match:
                        rel = os.path.relpath(path, root).replace(os.sep, "/")
                        values = {k: v for k, v in match.groupdict().items() if v is not None}
                        return f"{rel}:{number}", values
        except OSError:
            continue
    return None


def mine_constraints(install: CutlassInstall | None, *, arch: str = "sm_90a") -> list[Constraint]:
    """The constraints that apply to `arch`, with evidence from `install` when given."""
    number, _ = parse_arch(arch)
    out: list[Constraint] = []
    for constraint in CONSTRAINTS:
        if number < constraint.min_arch:
            continue
        values = dict(_DEFAULTS)
        evidence: list[str] = []
        if install is not None:
            for anchor in constraint.anchors:
                found = _find_anchor(str(install.root), anchor)
                if found is not None:
                    evidence.append(found[0])
                    values.update(found[1])
        text = constraint.text.format(**values) if "{" in constraint.text else constraint.text
        out.append(replace(constraint, text=text, evidence=tuple(evidence)))
    return out


def render_constraints(constraints: Sequence[Constraint]) -> str:
    """The prompt section: "Hard constraints (non-negotiable)"."""
    if not constraints:
        return ""
    lines = [
        "## Hard constraints for CUTLASS/CuTe and Hopper code (non-negotiable)",
        "Code that uses these features and breaks a rule below is rejected before it is compiled.",
        *(c.render() for c in constraints),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ static pre-compile check

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_WGMMA = re.compile(r"wgmma\.mma_async|\bSM90_64x\d+x\d+_|GMMA::(?:ss|rs)_op_selector")
_TMA = re.compile(r"cp\.async\.bulk\.tensor|\bSM90_TMA_LOAD|\bmake_tma_copy\b|\bmake_tma_atom\b")
_SETMAXNREG = re.compile(
    r"warpgroup_reg_(alloc|dealloc)\s*<\s*(\d+)\s*>|setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)"
)
_BARRIER_INIT = re.compile(
    r"mbarrier\.init|(?:ClusterBarrier|ClusterTransactionBarrier)::init\s*\(|initialize_barrier\s*\("
)
_FENCE_INIT = re.compile(r"fence_barrier_init|fence\.mbarrier_init")
_BLOCK_SYNC = re.compile(
    r"__syncthreads\s*\(|cluster_sync\s*\(|cluster_wait\s*\(|barrier\.cluster\.wait|bar\.sync|\.sync\s*\(\s*\)"
)
_EXPECT_TX = re.compile(
    r"expect_tx|expect_transaction|set_barrier_transaction_bytes|arrive_and_expect_tx"
)
_WG_ARRIVE = re.compile(r"warpgroup_arrive\s*\(|wgmma\.fence")
_WG_COMMIT = re.compile(r"warpgroup_commit_batch\s*\(|wgmma\.commit_group")
_WG_WAIT = re.compile(r"warpgroup_wait\s*<|wgmma\.wait_group")
_PLAIN_SM90 = re.compile(r"(?:arch=|code=|-arch=|--gpu-architecture=)(?:compute|sm)_90(?![a-z0-9])")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\(\s*(\d+)")
_STAGES = re.compile(
    r"PipelineTmaAsync\s*<\s*(\d+)|\b(?:k|K|Num|num_|N|n)?_?[Ss]tages\s*=\s*(\d+)\s*[;,)]"
)
_VECTOR_CAST = re.compile(
    r"reinterpret_cast\s*<\s*(?:const\s+)?(?:float4|int4|uint4|double2|longlong2|float2|half2|__half2|__nv_bfloat162)\s*\*\s*>"
)
_ALIGN_GUARD = re.compile(
    r"%\s*(?:2|4|8|16)\b|&\s*(?:0x[0-9a-fA-F]+|15|7|3)\b|alignof|is_aligned|__builtin_assume_aligned|uintptr_t"
)


def _strip_comments(source: str) -> str:
    # Comment text becomes spaces (newlines kept) so that line numbers stay right.
    return _COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_source(source: str, *, arch: str = "sm_90a") -> list[Violation]:
    """Violations of the constraints in a candidate's source text (see the module doc)."""
    text = _strip_comments(source)
    number, suffix = parse_arch(arch)
    found: list[Violation] = []

    def first(regex: re.Pattern[str]) -> re.Match[str] | None:
        return regex.search(text)

    wgmma, tma, regs = first(_WGMMA), first(_TMA), list(_SETMAXNREG.finditer(text))
    hopper_feature = wgmma or tma or (regs[0] if regs else None)
    if hopper_feature is not None:
        line = _line(text, hopper_feature.start())
        if number < 90:
            found.append(
                Violation(
                    "arch-target",
                    "error",
                    f"uses Hopper instructions "
                    f"({hopper_feature.group(0)!r}) but the target is {arch}",
                    line,
                )
            )
        elif number in (90, 100) and suffix != "a":
            found.append(
                Violation(
                    "arch-target",
                    "error",
                    f"uses {hopper_feature.group(0)!r}, "
                    f"which needs sm_{number}a, but the target is {arch}",
                    line,
                )
            )
        plain = first(_PLAIN_SM90)
        if plain is not None:
            found.append(
                Violation(
                    "arch-target",
                    "error",
                    f"build flag {plain.group(0)!r} targets plain sm_90; use compute_90a/sm_90a",
                    _line(text, plain.start()),
                )
            )
    init = first(_BARRIER_INIT)
    if init is not None:
        line = _line(text, init.start())
        if first(_BLOCK_SYNC) is None:
            found.append(
                Violation(
                    "barrier-init",
                    "error",
                    "mbarrier initialized but no "
                    "__syncthreads()/cluster sync makes the init visible",
                    line,
                )
            )
        if first(_FENCE_INIT) is None:
            severity: Severity = "error" if tma else "warning"
            found.append(
                Violation(
                    "barrier-init",
                    severity,
                    "mbarrier initialized without fence_barrier_init() (fence.mbarrier_init)",
                    line,
                )
            )
    if tma is not None and first(_EXPECT_TX) is None:
        found.append(
            Violation(
                "barrier-expect-tx",
                "error",
                "TMA loads but no arrive_and_expect_tx/expect_tx: the barrier never completes",
                _line(text, tma.start()),
            )
        )
    if wgmma is not None:
        line = _line(text, wgmma.start())
        for regex, what in (
            (_WG_ARRIVE, "warpgroup_arrive() / wgmma.fence"),
            (_WG_COMMIT, "warpgroup_commit_batch() / wgmma.commit_group"),
            (_WG_WAIT, "warpgroup_wait<N>() / wgmma.wait_group"),
        ):
            if first(regex) is None:
                found.append(Violation("wgmma-fence", "error", f"wgmma without {what}", line))
        for bound in _LAUNCH_BOUNDS.finditer(text):
            if int(bound.group(1)) % 128:
                found.append(
                    Violation(
                        "warpgroup-shape",
                        "error",
                        f"__launch_bounds__("
                        f"{bound.group(1)}) is not a multiple of 128 threads "
                        "(one warpgroup)",
                        _line(text, bound.start()),
                    )
                )
    kinds = set()
    for reg in regs:
        kind = reg.group(1) or ("alloc" if reg.group(3) == "inc" else "dealloc")
        kinds.add(kind)
        count = int(reg.group(2) or reg.group(4))
        if count % 8 or not 24 <= count <= 256:
            found.append(
                Violation(
                    "warpgroup-registers",
                    "error",
                    f"register count {count} must be a multiple of 8 within [24, 256]",
                    _line(text, reg.start()),
                )
            )
    if len(kinds) == 1:
        only = kinds.pop()
        found.append(
            Violation(
                "warpgroup-registers",
                "warning",
                f"only warpgroup_reg_{only} is used; producers dealloc and consumers alloc",
                _line(text, regs[0].start()),
            )
        )
    for stage in _STAGES.finditer(text):
        value = int(stage.group(1) or stage.group(2))
        if value < 2 and (tma is not None or stage.group(1)):
            found.append(
                Violation(
                    "tma-pipeline-depth",
                    "error",
                    f"{value} pipeline stage(s): at least 2 are needed to overlap loads and MMA",
                    _line(text, stage.start()),
                )
            )
    cast = first(_VECTOR_CAST)
    if cast is not None and first(_ALIGN_GUARD) is None:
        found.append(
            Violation(
                "epilogue-vector",
                "warning",
                f"{cast.group(0)} without an "
                "alignment or divisibility guard; misaligned or tail elements "
                "fault or are skipped",
                _line(text, cast.start()),
            )
        )
    return found
