"""`cuobjdump --dump-sass` parsing: static instruction counts per kernel function.

Counts are keyed by the opcode's root (`HMMA.16816.F32` -> `HMMA`; `HFMA2.MMA` is an FMA
move, root `HFMA2`, not a tensor instruction) plus aggregate classes that tools ask for:

    WGMMA     HGMMA + IGMMA + QGMMA + BGMMA (Hopper warpgroup MMA, sm_90a)
    MMA_SYNC  HMMA + IMMA + DMMA + BMMA (mma.sync / WMMA)
    TMA       UTMALDG + UTMASTG + UTMAREDG + UTMAPF + UBLKCP + UBLKRED + UBLKPF
    CP_ASYNC  LDGSTS
    LOCAL     LDL + STL (local memory: spills or runtime-indexed arrays)
    SHARED_LD LDS + LDSM;  SHARED_ST STS + STSM
    BARRIER   BAR + SYNCS (+ WARPGROUP arrive/wait)

Global load/store widths come from the size token (`LDG.E.128` = 128 bits, `.64`, `.U8`,
`.S16`, ...; none = 32 bits). The counts are static (instructions in the binary), not
executed counts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pytest_kernelpro.profile.binaries import cuobjdump_env, find_tool, run_tool, where_looked
from pytest_kernelpro.profile.model import NotCollected, SassSummary
from pytest_kernelpro.profile.symbols import demangle

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_CODE_FOR = re.compile(r"^\s*code for\s+(sm_\w+)")
_ARCH = re.compile(r"^\s*arch\s*=\s*(sm_\w+)")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")

AGGREGATES: Mapping[str, tuple[str, ...]] = {
    "WGMMA": ("HGMMA", "IGMMA", "QGMMA", "BGMMA"),
    "MMA_SYNC": ("HMMA", "IMMA", "DMMA", "BMMA"),
    "TMA": ("UTMALDG", "UTMASTG", "UTMAREDG", "UTMAPF", "UBLKCP", "UBLKRED", "UBLKPF"),
    "CP_ASYNC": ("LDGSTS",),
    "LOCAL": ("LDL", "STL"),
    "SHARED_LD": ("LDS", "LDSM"),
    "SHARED_ST": ("STS", "STSM"),
    "BARRIER": ("BAR", "SYNCS", "WARPGROUP"),
}

_WIDTH_TOKENS: Mapping[str, int] = {
    "U8": 8,
    "S8": 8,
    "U16": 16,
    "S16": 16,
    "32": 32,
    "64": 64,
    "128": 128,
    "256": 256,
}


def access_width_bits(opcode: str) -> int:
    """Bits per thread of an LDG/STG opcode: `LDG.E.128` -> 128, `LDG.E` -> 32."""
    for token in opcode.split(".")[1:]:
        if token in _WIDTH_TOKENS:
            return _WIDTH_TOKENS[token]
    return 32


@dataclass
class SassFunction:
    """The raw opcode list of one function in one arch's code."""

    mangled: str
    arch: str
    opcodes: list[str] = field(default_factory=list)


def parse_sass(text: str) -> list[SassFunction]:
    """Split a `cuobjdump --dump-sass` listing into functions with their opcodes."""
    functions: list[SassFunction] = []
    arch = ""
    current: SassFunction | None = None
    for line in text.splitlines():
        match = _CODE_FOR.match(line) or _ARCH.match(line)
        if match:
            arch = match.group(1)
            current = None
            continue
        match = _FUNCTION.match(line)
        if match:
            current = SassFunction(match.group(1), arch)
            functions.append(current)
            continue
        if current is None:
            continue
        match = _INSTRUCTION.match(line)
        if match:
            current.opcodes.append(match.group(1))
    return functions


def summarize_function(function: SassFunction, demangled: str | None = None) -> SassSummary:
    """Counts per opcode root and per aggregate class, and global access widths."""
    roots: Counter[str] = Counter()
    loads: Counter[int] = Counter()
    stores: Counter[int] = Counter()
    for opcode in function.opcodes:
        root = opcode.split(".", 1)[0]
        roots[root] += 1
        if root == "LDG":
            loads[access_width_bits(opcode)] += 1
        elif root == "STG":
            stores[access_width_bits(opcode)] += 1
    counts: dict[str, int] = dict(roots)
    for name, members in AGGREGATES.items():
        counts[name] = sum(roots.get(m, 0) for m in members)
    return SassSummary(
        function=demangled or function.mangled,
        mangled=function.mangled,
        counts=counts,
        total_instructions=len(function.opcodes),
        global_load_widths=dict(sorted(loads.items())),
        global_store_widths=dict(sorted(stores.items())),
    )


def summarize_sass(
    text: str, *, arch: str | None = None, demangled: Mapping[str, str] | None = None
) -> dict[str, SassSummary]:
    """`SassSummary` per mangled function name.

    With several archs in one binary, `arch` picks one; otherwise the last listed wins.
    `demangled` maps mangled to display names (see `symbols.demangle`).
    """
    names = demangled or {}
    result: dict[str, SassSummary] = {}
    for function in parse_sass(text):
        if arch is not None and function.arch != arch:
            continue
        result[function.mangled] = summarize_function(function, names.get(function.mangled))
    return result


def dump_sass(
    module_path: str,
    *,
    functions: Iterable[str] | None = None,
    cuobjdump: str | None = None,
    timeout_s: float = 180.0,
) -> str | NotCollected:
    """The text of `cuobjdump --dump-sass [--function f1,f2] <module>`."""
    tool = cuobjdump or find_tool("cuobjdump")
    if tool is None:
        return NotCollected("sass", f"cuobjdump not found (looked in {where_looked('cuobjdump')})")
    command = [tool, "--dump-sass"]
    wanted = list(functions or [])
    if wanted:
        command += ["--function", ",".join(wanted)]
    run = run_tool("sass", [*command, module_path], timeout_s=timeout_s, env=cuobjdump_env())
    if isinstance(run, NotCollected):
        return run
    return run.stdout


def sass_of_module(
    module_path: str,
    *,
    functions: Iterable[str] | None = None,
    arch: str | None = None,
    cuobjdump: str | None = None,
) -> dict[str, SassSummary] | NotCollected:
    """Dump, parse and summarize the SASS of a module's kernels, with demangled names."""
    text = dump_sass(module_path, functions=functions, cuobjdump=cuobjdump)
    if isinstance(text, NotCollected):
        return text
    parsed = parse_sass(text)
    if not parsed:
        return NotCollected("sass", f"{module_path} has no SASS (PTX only, or no device code)")
    names = demangle(f.mangled for f in parsed)
    return summarize_sass(text, arch=arch, demangled=names)
