"""`cuobjdump -symbols` parsing and name demangling: the kernels a compiled module defines.

A kernel (`__global__` function) is an `STT_FUNC STB_GLOBAL` symbol with `STO_ENTRY`
(`STT_FUNC STB_GLOBAL STV_DEFAULT U vprintf` is an undefined device function, not a kernel).
Names are demangled with `cu++filt` when it exists, else binutils' `c++filt`, else a small
fallback that recovers the function's own name (enough to match ncu and kineto names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_kernelpro.profile.binaries import find_tool, run_tool, where_looked
from pytest_kernelpro.profile.model import NotCollected


@dataclass(frozen=True)
class DeviceSymbol:
    """One symbol of one embedded device ELF."""

    name: str  # mangled
    arch: str  # e.g. "sm_90a"; "" when the dump did not say
    kind: str  # FUNC, OBJECT, NOTYPE, ... (without the STT_ prefix)
    binding: str  # GLOBAL, LOCAL, WEAK (without the STB_ prefix)
    entry: bool  # STO_ENTRY: a __global__ function
    undefined: bool


_ARCH = re.compile(r"^\s*arch\s*=\s*(\S+)")


_SYMBOL_TYPES = frozenset({"FUNC", "OBJECT", "NOTYPE", "SECTION", "FILE", "?", "TLS", "COMMON"})
_BINDINGS = frozenset({"GLOBAL", "LOCAL", "WEAK"})


def parse_cuobjdump_symbols(text: str) -> list[DeviceSymbol]:
    """Every named symbol line of `cuobjdump -symbols` output, with the arch of its ELF.

    Two layouts exist: CUDA 13.0 prints `STT_FUNC STB_GLOBAL STO_ENTRY <name>`; 13.5 prints
    `FUNC GLOBAL DEFAULT ENTRY <name>`. Both are read; `kind` and `binding` are stored without
    the `STT_`/`STB_` prefixes ("FUNC", "GLOBAL").
    """
    symbols: list[DeviceSymbol] = []
    arch = ""
    for line in text.splitlines():
        match = _ARCH.match(line)
        if match:
            arch = match.group(1)
            continue
        tokens = line.split()
        if len(tokens) < 3:
            continue
        kind = tokens[0].removeprefix("STT_")
        binding = tokens[1].removeprefix("STB_")
        if kind not in _SYMBOL_TYPES or binding not in _BINDINGS:
            continue
        if tokens[-1] in {"U", "-"} or len(tokens) < 4:
            continue  # a nameless symbol such as "STT_? STB_LOCAL STV_DEFAULT U"
        middle = tokens[2:-1]
        symbols.append(
            DeviceSymbol(
                name=tokens[-1],
                arch=arch,
                kind=kind,
                binding=binding,
                entry="STO_ENTRY" in middle or "ENTRY" in middle,
                undefined="U" in middle,
            )
        )
    return symbols


def entry_points(symbols: Iterable[DeviceSymbol]) -> list[str]:
    """Mangled names of the kernels, once each, in the order the dump lists them."""
    names: dict[str, None] = {}
    for symbol in symbols:
        if (
            symbol.kind == "FUNC"
            and symbol.binding == "GLOBAL"
            and symbol.entry
            and not symbol.undefined
        ):
            names.setdefault(symbol.name, None)
    return list(names)


def read_module_symbols(
    module_path: str, *, cuobjdump: str | None = None, timeout_s: float = 120.0
) -> list[DeviceSymbol] | NotCollected:
    """`cuobjdump -symbols` of a `.so`, `.cubin` or executable, parsed."""
    tool = cuobjdump or find_tool("cuobjdump")
    if tool is None:
        return NotCollected(
            "symbols", f"cuobjdump not found (looked in {where_looked('cuobjdump')})"
        )
    run = run_tool("symbols", [tool, "-symbols", module_path], timeout_s=timeout_s)
    if isinstance(run, NotCollected):
        return run
    symbols = parse_cuobjdump_symbols(run.stdout)
    if not symbols:
        return NotCollected("symbols", f"{module_path} embeds no device code (no ELF symbols)")
    return symbols


# --- demangling -------------------------------------------------------------------------


def demangle(names: Iterable[str], *, timeout_s: float = 30.0) -> dict[str, str]:
    """Demangled form of each name (unmangled names map to themselves).

    One `cu++filt` or `c++filt` process for the whole batch; without either, the fallback
    gives the function's qualified name without parameters.
    """
    unique = list(dict.fromkeys(names))
    mangled = [n for n in unique if n.startswith("_Z")]
    result = {n: n for n in unique}
    if not mangled:
        return result
    for tool_name in ("cu++filt", "c++filt"):
        tool = find_tool(tool_name)
        if tool is None:
            continue
        run = run_tool("demangle", [tool], stdin="\n".join(mangled) + "\n", timeout_s=timeout_s)
        if isinstance(run, NotCollected):
            continue
        lines = run.stdout.splitlines()
        if len(lines) == len(mangled):
            result.update(zip(mangled, lines, strict=True))
            return result
    result.update({n: fallback_demangle(n) for n in mangled})
    return result


_SOURCE_NAME = re.compile(r"(\d+)")


def fallback_demangle(name: str) -> str:
    """The (possibly nested) function name of an Itanium-mangled symbol, without parameters.

    `_Z20naive_softmax_kernelPKfPfii` -> `naive_softmax_kernel`;
    `_ZN2at6native4gemmEv` -> `at::native::gemm`. Anything it cannot read comes back as is.
    """
    if not name.startswith("_Z"):
        return name
    pos = 2
    nested = name.startswith("_ZN")
    if nested:
        pos = 3
        while pos < len(name) and name[pos] in "rVKL":
            pos += 1  # cv-qualifiers of a nested member function
    parts: list[str] = []
    while pos < len(name):
        match = _SOURCE_NAME.match(name, pos)
        if not match:
            break
        length = int(match.group(1))
        start = match.end()
        parts.append(name[start : start + length])
        pos = start + length
        if not nested:
            break
        if pos < len(name) and name[pos] == "E":
            break
    return "::".join(parts) if parts else name


def kernel_base_name(name: str) -> str:
    """The kernel's own identifier, without namespaces, template arguments or parameters.

    Joins names across tools that print them differently: ncu's
    `void at::<unnamed>::cunn_SoftMaxForwardReg<float, ...>(T3 *, ...)`, c++filt's
    `naive_softmax_kernel(float const*, float*, int, int)`, a mangled symbol, or Triton's
    plain `softmax_kernel` all reduce to the identifier.
    """
    text = fallback_demangle(name) if name.startswith("_Z") else name
    text = text.replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            if ch == "(":
                break
            out.append(ch)
    core = "".join(out).strip()
    core = core.split()[-1] if core.split() else core
    return core.rsplit("::", 1)[-1]
