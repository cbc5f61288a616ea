"""check_smem_layout: compile a minimal CuTe `tile_to_shape` probe with nvcc (no GPU needed).

Shape/stride divisibility is the most common CuTe compile failure ("tile_to_shape: block
shape does not divide the target shape"); a probe of a few lines finds it in seconds instead
of after a full kernel build. The probe also reports the layout's shared-memory footprint:
a `[[deprecated]]` function template instantiated with the byte count makes the compiler
print it in a warning, so nothing has to run. With `smem_limit_bytes`, a footprint over the
limit is a compile error too.

No nvcc, or no CUTLASS: the result is "skipped" with the reason, never an exception.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.cutlass.flags import build_flags, gencode_flag
from pytest_kernelpro.optimize.cutlass.locate import CutlassInstall, locate_cutlass

# What the atom/element expressions may contain: C++ type expressions, no statements,
# preprocessor lines, strings or line breaks (the probe is built from them).
_SAFE_EXPR = re.compile(r"^[A-Za-z0-9_:<>,()\[\]{} +*.-]+$")
_ERROR_LINE = re.compile(r"(?:\((\d+)\):|:(\d+):\d+:)\s*(?:catastrophic |fatal )?error:\s*(.*)$")
_SMEM_REPORT = re.compile(
    r"kernelpro_smem_(?:bytes(?:<|\(\) \[with long long int Bytes = )|fits<)(\d+)"
)
_OVER_LIMIT = re.compile(r"kernelpro_smem_fits<(\d+)LL, (\d+)LL, false>")

PROBE_HEADERS = ("cute/tensor.hpp", "cute/atom/mma_traits_sm90_gmma.hpp")


@dataclass
class ProbeResult:
    """One nvcc compile of a probe."""

    returncode: int | None
    errors: list[str]
    log: str
    seconds: float
    command: list[str]


@dataclass
class SmemCheckResult:
    """The verdict of `check_smem_layout`."""

    status: Literal["ok", "error", "skipped"]
    reason: str = ""
    errors: list[str] = field(default_factory=list)
    smem_bytes: int | None = None
    log: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the probe compiled."""
        return self.status == "ok"

    def render(self) -> str:
        """Text for the model."""
        if self.status == "skipped":
            return f"check_smem_layout skipped: {self.reason}"
        if self.status == "ok":
            size = f"{self.smem_bytes} bytes" if self.smem_bytes is not None else "size unknown"
            return f"check_smem_layout ok: layout compiles; shared memory {size}"
        return "check_smem_layout failed:\n" + "\n".join(f"- {e}" for e in self.errors[:8])


def find_nvcc() -> str | None:
    """nvcc from PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def parse_compiler_errors(log: str) -> list[str]:
    """The `error:` messages of an nvcc/gcc log, without duplicates, in order."""
    seen: dict[str, None] = {}
    for line in log.splitlines():
        match = _ERROR_LINE.search(line)
        if match:
            seen.setdefault(match.group(3).strip(), None)
        elif line.strip().startswith(("error:", "nvcc fatal")):
            seen.setdefault(line.strip(), None)
    return list(seen)


def compile_probe(
    source: str,
    *,
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    arch: str = "sm_90a",
    flags: Sequence[str] | None = None,
    nvcc: str | None = None,
    timeout_s: float = 300.0,
) -> ProbeResult:
    """Compile `source` to an object file with nvcc (nothing runs); errors are parsed out."""
    compiler = nvcc or find_nvcc()
    if compiler is None:
        raise KernelproError("nvcc not found on PATH nor in CUDA_HOME; install the CUDA toolkit")
    cuda_flags = list(flags) if flags is not None else ["-std=c++17", "--expt-relaxed-constexpr"]
    with tempfile.TemporaryDirectory(prefix="kernelpro-probe-") as tmp:
        src = Path(tmp) / "probe.cu"
        src.write_text(source, encoding="utf-8")
        command = [
            compiler,
            *cuda_flags,
            gencode_flag(arch),
            *(f"-I{d}" for d in include_dirs),
            "-c",
            str(src),
            "-o",
            str(Path(tmp) / "probe.o"),
        ]
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, cwd=tmp, check=False
            )
        except subprocess.TimeoutExpired as exc:
            out = _text(exc.stdout) + _text(exc.stderr)
            return ProbeResult(
                None, [f"nvcc timed out after {timeout_s:g} s"], out, timeout_s, command
            )
        seconds = time.perf_counter() - start
    log = (done.stdout + done.stderr).replace(tmp, "<probe>")
    errors = parse_compiler_errors(log) if done.returncode != 0 else []
    if done.returncode != 0 and not errors:
        errors = [f"nvcc exited with {done.returncode}: {log.strip()[-400:]}"]
    return ProbeResult(done.returncode, errors, log, seconds, command)


def probe_source(
    atom: str, tile_shape: Sequence[int], element: str, smem_limit_bytes: int | None
) -> str:
    """The probe: tile `atom` to `tile_shape` and report the footprint of `element`s."""
    shape = ", ".join(f"cute::Int<{int(n)}>{{}}" for n in tile_shape)
    lines = [f"#include <{h}>" for h in PROBE_HEADERS]
    lines += [
        "using namespace cute;",
        f"using KpElement = {element};",
        # A type gets `{}` to become a value; an expression (a call, a braced value) is used as is.
        f"using KpAtom = decltype({atom});"
        if atom.rstrip().endswith((")", "}"))
        else f"using KpAtom = decltype({atom}{{}});",
        f"using KpLayout = decltype(tile_to_shape(KpAtom{{}}, make_shape({shape})));",
        "constexpr long long kp_smem_bytes ="
        " static_cast<long long>(cute::cosize_v<KpLayout>) * sizeof(KpElement);",
        'template <long long Bytes> [[deprecated("kernelpro smem report")]]',
        "constexpr bool kernelpro_smem_bytes() { return true; }",
        'static_assert(kernelpro_smem_bytes<kp_smem_bytes>(), "");',
    ]
    if smem_limit_bytes is not None:
        # Over the limit, the incomplete specialization is named in the error with both
        # numbers (a static_assert message cannot show a computed value in C++17).
        lines += [
            "template <long long Bytes, long long Limit, bool Fits = (Bytes <= Limit)>",
            "struct kernelpro_smem_fits { static constexpr bool value = true; };",
            "template <long long Bytes, long long Limit>",
            "struct kernelpro_smem_fits<Bytes, Limit, false>;",
            f"static_assert(kernelpro_smem_fits<kp_smem_bytes, {int(smem_limit_bytes)}LL>::value,"
            ' "kernelpro: shared memory over the limit");',
        ]
    return "\n".join(lines) + "\n"


def check_smem_layout(
    atom: str,
    tile_shape: Sequence[int],
    *,
    element: str = "cute::half_t",
    arch: str = "sm_90a",
    smem_limit_bytes: int | None = None,
    install: CutlassInstall | None = None,
    nvcc: str | None = None,
    timeout_s: float = 300.0,
) -> SmemCheckResult:
    """Compile a `tile_to_shape(atom, tile_shape)` probe against the CUTLASS headers.

    `atom` is a CuTe layout type or expression, e.g. "GMMA::Layout_K_SW128_Atom<cute::half_t>";
    `tile_shape` the (M, K[, stages]) tile; `element` the value type whose size the footprint
    is counted in. Skips (status "skipped") when nvcc or CUTLASS is missing.
    """
    for name, expr in (("atom", atom), ("element", element)):
        if not expr or not _SAFE_EXPR.match(expr):
            raise KernelproError(
                f"{name} expression {expr!r} is not a plain C++ type expression (no ';', '#', "
                "quotes or newlines); pass e.g. 'GMMA::Layout_K_SW128_Atom<cute::half_t>'"
            )
    if not tile_shape or any(int(n) <= 0 for n in tile_shape):
        raise KernelproError(f"tile_shape {tuple(tile_shape)!r} must be positive integers")
    compiler = nvcc or find_nvcc()
    if compiler is None:
        return SmemCheckResult("skipped", "nvcc not found (install the CUDA toolkit)")
    if install is None:
        lookup = locate_cutlass()
        if lookup.install is None:
            return SmemCheckResult("skipped", lookup.reason)
        install = lookup.install
    flags = build_flags(arch, install)
    probe = compile_probe(
        probe_source(atom, tile_shape, element, smem_limit_bytes),
        include_dirs=flags.include_dirs,
        arch=flags.arch,
        flags=[f for f in flags.cuda_flags if not f.startswith("-gencode")],
        nvcc=compiler,
        timeout_s=timeout_s,
    )
    report = _SMEM_REPORT.search(probe.log)
    smem = int(report.group(1)) if report else None
    if probe.returncode == 0:
        return SmemCheckResult("ok", "", [], smem, probe.log, probe.seconds)
    errors = list(probe.errors)
    over = _OVER_LIMIT.search(probe.log)
    if over is not None:
        errors = [e for e in errors if "kernelpro_smem_fits" not in e]
        errors.insert(0, f"the layout needs {over.group(1)} bytes of shared memory, more than "
                         f"the {over.group(2)} bytes a block may use")  # fmt: skip
    return SmemCheckResult(
        "error", "the probe did not compile", errors, smem, probe.log, probe.seconds
    )
