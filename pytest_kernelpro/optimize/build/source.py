"""Reading fast-path CUDA source: the include rule and the `extern "C"` kernel signatures.

A fast-path source is device code only: it is compiled to a cubin with `nvcc -cubin` (no
host compiler pass, no torch headers) and its kernels are called from Python by name, so
each kernel it exports is declared `extern "C" __global__ void name(...)` (or sits inside an
`extern "C" { ... }` block). Their parameter lists are parsed here to pack the launch
arguments: a pointer takes a tensor's data pointer (or an int address), a scalar its C type.

Includes: only `#include <header>` of the toolkit and library headers on the include path.
A quoted, absolute or `..` include, or one computed from a macro, is refused before the
compiler runs: generated code must not read files of the machine that builds it (the
compiler would echo their lines into the build log that goes back into a prompt).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from pytest_kernelpro.errors import KernelproError


class SourceError(KernelproError):
    """The source breaks a fast-path rule (an include, a kernel signature)."""


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b[ \t]*(?P<rest>[^\n]*)$", re.MULTILINE)
_ANGLE = re.compile(r"^<(?P<path>[^<>\s]+)>\s*$")
_IDENT = re.compile(r"[A-Za-z_]\w*")
# Attributes that may stand between `__global__` and the kernel's name.
_ATTRIBUTE = re.compile(r"\s*(__launch_bounds__|__cluster_dims__|__maxnreg__)\s*\(")
_QUALIFIERS = frozenset(
    {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__",
     "struct", "class"}
)  # fmt: skip


def strip_comments(source: str) -> str:
    """`source` with comments replaced by spaces (line numbers kept)."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


def check_includes(source: str) -> list[str]:
    """The headers a source includes; `SourceError` for an include that may read a file
    outside the include path (quoted, absolute, `..`, or computed from a macro)."""
    headers = []
    for match in _INCLUDE.finditer(strip_comments(source)):
        rest = match.group("rest").strip()
        line = source.count("\n", 0, match.start()) + 1
        angle = _ANGLE.match(rest)
        path = angle.group("path") if angle else None
        if path is None or path.startswith("/") or ".." in path.split("/"):
            raise SourceError(
                f"line {line}: `#include {rest}` is not allowed in fast-path CUDA source: "
                "include toolkit or library headers as `#include <name.h>` (no quoted, "
                "absolute, '..' or macro-computed includes); put your own code in the source."
            )
        headers.append(path)
    return headers


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its C type as written, its name and how it is packed."""

    ctype: str
    name: str
    kind: str  # "pointer", "int", "float", "half", "bfloat16", "bool", "opaque"
    code: str  # struct format code ("Q", "i", "f", ...; "" for opaque)
    size: int

    def pack_value(self, value: object) -> object:
        """The value `struct` packs for this parameter, from a Python argument."""
        if self.kind == "pointer":
            ptr = getattr(value, "data_ptr", None)
            if callable(ptr):
                return int(ptr())
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise TypeError(f"expects a tensor (or an int address), got {type(value).__name__}")
        if self.kind == "opaque":
            if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == self.size:
                return bytes(value)
            raise TypeError(
                f"has type {self.ctype!r}, which is passed as {self.size} raw bytes; got "
                f"{type(value).__name__}"
            )
        if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
            value = value.item()  # a 0-d tensor or numpy scalar
        if self.kind == "bool":
            return bool(value)
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"has integer type {self.ctype!r}; got {value!r}")
            return value
        if not isinstance(value, (int, float)):
            raise TypeError(f"has floating type {self.ctype!r}; got {value!r}")
        if self.kind == "bfloat16":
            bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even
        return float(value)


# Normalized scalar type -> (kind, struct code); sizes follow the LP64 ABI that nvcc uses.
_SCALARS: dict[str, tuple[str, str]] = {}
for _names, _kind, _code in (
    (("int", "signed", "signed int", "int32_t"), "int", "i"),
    (("unsigned", "unsigned int", "uint32_t"), "int", "I"),
    (("long", "long int", "long long", "long long int", "int64_t", "ptrdiff_t", "intptr_t",
      "signed long", "signed long long", "index_t"), "int", "q"),
    (("unsigned long", "unsigned long long", "unsigned long long int", "uint64_t", "size_t",
      "uintptr_t"), "int", "Q"),
    (("short", "short int", "int16_t"), "int", "h"),
    (("unsigned short", "uint16_t"), "int", "H"),
    (("char", "signed char", "int8_t"), "int", "b"),
    (("unsigned char", "uint8_t"), "int", "B"),
    (("bool",), "bool", "?"),
    (("float",), "float", "f"),
    (("double",), "float", "d"),
    (("__half", "half"), "half", "e"),
    (("__nv_bfloat16", "nv_bfloat16"), "bfloat16", "H"),
):  # fmt: skip
    for _name in _names:
        _SCALARS[_name] = (_kind, _code)


def parse_param(text: str) -> Param:
    """A `Param` from one declaration of a parameter list ("const float* __restrict__ x")."""
    decl = text.split("=", 1)[0].strip()
    decl = re.sub(r"\[\s*\d*\s*\]", "*", decl)  # float x[] is a pointer
    pointer = "*" in decl or "&" in decl
    words = [w for w in re.split(r"[\s*&]+", decl) if w]
    words = [w for w in words if w not in _QUALIFIERS]
    name = ""
    if len(words) >= 2 and _IDENT.fullmatch(words[-1]):
        name = words.pop()
    ctype = " ".join(words)
    base = ctype.replace("std::", "")
    if pointer:
        return Param(decl, name, "pointer", "Q", 8)
    if base in _SCALARS:
        kind, code = _SCALARS[base]
        return Param(decl, name, kind, code, struct.calcsize("<" + code))
    return Param(decl, name, "opaque", "", 0)  # size from the driver (cuFuncGetParamInfo)


@dataclass(frozen=True)
class KernelSignature:
    """An exported kernel: its name and parameters, in order."""

    name: str
    params: tuple[Param, ...]

    def describe(self) -> str:
        """`name(type a, type b)` for error messages."""
        return f"{self.name}({', '.join(p.ctype for p in self.params)})"


def _matching(text: str, open_at: int, open_char: str = "(", close_char: str = ")") -> int:
    """Index of the bracket closing the one at `open_at` (-1 when unbalanced)."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p and p != "void"]


def _extern_c_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for match in re.finditer(r'extern\s+"C"\s*\{', text):
        end = _matching(text, match.end() - 1, "{", "}")
        spans.append((match.end(), end if end >= 0 else len(text)))
    return spans


def parse_kernels(source: str) -> dict[str, KernelSignature]:
    """The `extern "C"` kernels a source defines or declares, by name.

    A `__global__` function without C linkage has a mangled name that Python cannot look up,
    so it is not listed (it may still be a kernel that another one launches).
    """
    text = strip_comments(source)
    blocks = _extern_c_spans(text)
    kernels: dict[str, KernelSignature] = {}
    for match in re.finditer(r"\b__global__\b", text):
        before = text[max(0, match.start() - 200) : match.start()]
        linkage_c = bool(re.search(r'extern\s+"C"\s*(?:__\w+\s*(?:\([^)]*\))?\s*)*$', before))
        linkage_c = linkage_c or any(a <= match.start() < b for a, b in blocks)
        if re.search(r"template\s*<[^;{}]*>\s*$", before):
            continue  # a template kernel has no C name
        pos = match.end()
        while True:  # skip `__launch_bounds__(...)` and friends
            attr = _ATTRIBUTE.match(text, pos)
            if attr is None:
                break
            close = _matching(text, attr.end() - 1)
            if close < 0:
                break
            pos = close + 1
        head = re.compile(r"\s*void\s+(?:__\w+\s*(?:\([^)]*\))?\s*)*(?P<name>[A-Za-z_]\w*)\s*\(")
        found = head.match(text, pos)
        if found is None or not linkage_c:
            continue
        open_at = found.end() - 1
        close = _matching(text, open_at)
        if close < 0:
            continue
        params = tuple(parse_param(p) for p in _split_params(text[open_at + 1 : close]))
        kernels[found.group("name")] = KernelSignature(found.group("name"), params)
    return kernels


def natural_layout(params: tuple[Param, ...]) -> tuple[list[int], int] | None:
    """Offsets and total size of the parameter buffer under natural alignment (each
    parameter aligned to its size), or None when a parameter's size is not known here."""
    offsets, offset = [], 0
    for param in params:
        if param.size <= 0:
            return None
        align = min(param.size, 8)
        offset = (offset + align - 1) // align * align
        offsets.append(offset)
        offset += param.size
    return offsets, offset
