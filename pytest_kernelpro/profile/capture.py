"""Record every torch C++/CUDA extension built while a kernel item runs.

`capture_extensions()` patches `torch.utils.cpp_extension._jit_compile`, the function that
both `load_inline` and `load` call, so it also sees callers that did
`from torch.utils.cpp_extension import load_inline` before the patch. It adds profiling flags
(`-lineinfo`, `-Xptxas=-v`) to `extra_cuda_cflags` of CUDA builds, returns exactly what the
original returned (or raises exactly what it raised), and records one `ExtensionBuild`
per call: name, build directory, `.so`, flags, build log with the ptxas report, seconds.

The build log is read from the `ninja -v` run: cpp_extension's module-level `subprocess`
reference is swapped for a proxy whose `run` captures ninja's output (and still writes it
to stdout when the caller asked for `verbose=True`); every other `subprocess` use passes
through. When ninja has nothing to do (a cached build), the ptxas report of the build that
produced the `.so` is read from `kernelpro_build.log`, which this module writes next to it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.fileio import atomic_write_text

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import PtxasReport

DEFAULT_CUDA_FLAGS: tuple[str, ...] = ("-lineinfo", "-Xptxas=-v")
BUILD_LOG_NAME = "kernelpro_build.log"
_CUDA_SUFFIXES = (".cu", ".cuh")


@dataclass
class ExtensionBuild:
    """One `load_inline`/`load` call seen while capturing."""

    name: str  # the module name, after cpp_extension's `_v<N>` bump
    build_directory: str
    so_path: str | None
    extra_cuda_cflags: tuple[str, ...]
    build_log: str
    build_seconds: float
    ptxas: tuple[PtxasReport, ...] = ()
    log_source: str = "none"  # "ninja" (this build), "cached" (an earlier build's log), "none"
    error: str | None = None  # the build or import error, re-raised to the caller unchanged


@dataclass(eq=False)  # identity: two open captures with equal contents are still two
class ExtensionCapture:
    """What one `capture_extensions()` block saw."""

    extra_cuda_cflags: tuple[str, ...]
    builds: list[ExtensionBuild] = field(default_factory=list)

    @property
    def so_paths(self) -> list[str]:
        """Existing `.so` files of the recorded builds, once each."""
        paths = [b.so_path for b in self.builds if b.so_path and os.path.exists(b.so_path)]
        return list(dict.fromkeys(paths))


_LOCK = threading.RLock()
_ACTIVE: list[ExtensionCapture] = []
_SAVED: dict[str, Any] = {}
_TLS = threading.local()


class _SubprocessProxy:
    """Stands in for the `subprocess` module inside cpp_extension; captures ninja's output."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def run(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        buffer: list[str] | None = getattr(_TLS, "buffer", None)
        is_ninja = (
            isinstance(command, list | tuple)
            and bool(command)
            and Path(str(command[0])).name.startswith("ninja")
        )
        if buffer is None or not is_ninja or args:
            return self._real.run(command, *args, **kwargs)
        wanted_stdout = kwargs.get("stdout")
        check = kwargs.pop("check", False)
        kwargs["stdout"] = self._real.PIPE
        kwargs.setdefault("stderr", self._real.STDOUT)
        completed = self._real.run(command, **kwargs)
        output = completed.stdout if isinstance(completed.stdout, bytes | str) else b""
        raw = output.encode() if isinstance(output, str) else output
        buffer.append(raw.decode("utf-8", errors="replace"))
        if wanted_stdout is not self._real.PIPE:
            # verbose=True: the caller sent ninja's output to a file descriptor.
            fd = wanted_stdout if isinstance(wanted_stdout, int) else 1
            with contextlib.suppress(OSError):
                os.write(fd, raw)
            completed.stdout = None
            raw_for_error: bytes | None = None
        else:
            raw_for_error = raw
        if check and completed.returncode != 0:
            raise self._real.CalledProcessError(completed.returncode, command, output=raw_for_error)
        return completed


def _is_cuda_source(path: str) -> bool:
    return str(path).endswith(_CUDA_SUFFIXES)


def _merge_flags(existing: Sequence[str] | None, extra: Sequence[str]) -> list[str]:
    flags = list(existing or [])
    for flag in extra:  # several open captures may ask for the same flag
        if flag not in flags:
            flags.append(flag)
    return flags


def _find_so(build_directory: str, result: Any) -> str | None:
    if isinstance(result, str) and os.path.exists(result):
        return result
    module_file = getattr(result, "__file__", None)
    if isinstance(module_file, str) and os.path.exists(module_file):
        return module_file
    candidates = sorted(Path(build_directory).glob("*.so"), key=lambda p: p.stat().st_mtime)
    return str(candidates[-1]) if candidates else None


def _resolve_log(build_directory: str, captured: str, so_path: str | None) -> tuple[str, str]:
    """(log text, source): this build's ninja output, or the log saved with the `.so`."""
    cache = Path(build_directory) / BUILD_LOG_NAME
    if "ptxas info" in captured:
        with contextlib.suppress(OSError):
            atomic_write_text(cache, captured)
        return captured, "ninja"
    if so_path and cache.exists():
        try:
            if cache.stat().st_mtime >= Path(so_path).stat().st_mtime - 1.0:
                return cache.read_text(encoding="utf-8", errors="replace"), "cached"
        except OSError:
            pass
    return captured, "ninja" if captured else "none"


def _make_wrapper(original: Any) -> Any:
    signature = inspect.signature(original)

    def _jit_compile(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            captures = list(_ACTIVE)
        if not captures:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        arguments = bound.arguments
        extra = [f for c in captures for f in c.extra_cuda_cflags]
        sources = arguments.get("sources") or []
        with_cuda = arguments.get("with_cuda")
        if "extra_cuda_cflags" in arguments and (
            with_cuda or (with_cuda is None and any(_is_cuda_source(s) for s in sources))
        ):
            arguments["extra_cuda_cflags"] = _merge_flags(arguments["extra_cuda_cflags"], extra)
        build_directory = str(arguments.get("build_directory") or "")
        flags = tuple(arguments.get("extra_cuda_cflags") or ())
        previous = getattr(_TLS, "buffer", None)
        _TLS.buffer = []
        started = time.perf_counter()
        error: BaseException | None = None
        result: Any = None
        try:
            result = original(*bound.args, **bound.kwargs)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            seconds = time.perf_counter() - started
            captured = "".join(_TLS.buffer)
            _TLS.buffer = previous
            so_path = _find_so(build_directory, result) if build_directory else None
            log, source = _resolve_log(build_directory, captured, so_path)
            name = Path(so_path).stem if so_path else str(arguments.get("name", ""))
            from pytest_kernelpro.profile.ptxas import parse_ptxas_output

            record = ExtensionBuild(
                name=name,
                build_directory=build_directory,
                so_path=so_path,
                extra_cuda_cflags=flags,
                build_log=log,
                build_seconds=seconds,
                ptxas=tuple(parse_ptxas_output(log)),
                log_source=source,
                error=None if error is None else f"{type(error).__name__}: {error}",
            )
            with _LOCK:
                for capture in _ACTIVE:
                    capture.builds.append(record)

    _jit_compile.__wrapped__ = original  # type: ignore[attr-defined]
    return _jit_compile


def _install() -> None:
    import torch.utils.cpp_extension as cpp_extension

    original = getattr(cpp_extension, "_jit_compile", None)
    if original is None:
        import warnings

        from pytest_kernelpro.errors import KernelproWarning

        warnings.warn(
            "torch.utils.cpp_extension has no _jit_compile in this torch version, so "
            "load_inline/load builds are not recorded (SASS and ptxas need torch >= 2.4)",
            KernelproWarning,
            stacklevel=3,
        )
        return
    _SAVED["module"] = cpp_extension
    _SAVED["_jit_compile"] = original
    _SAVED["subprocess"] = cpp_extension.subprocess
    cpp_extension._jit_compile = _make_wrapper(original)
    cpp_extension.subprocess = _SubprocessProxy(subprocess)


def _uninstall() -> None:
    if "module" not in _SAVED:
        return
    module = _SAVED.pop("module")
    module._jit_compile = _SAVED.pop("_jit_compile")
    module.subprocess = _SAVED.pop("subprocess")


def active_cuda_flags() -> tuple[str, ...]:
    """The flags the open captures add to CUDA builds (none open: empty)."""
    with _LOCK:
        return tuple(f for c in _ACTIVE for f in c.extra_cuda_cflags)


def merge_cuda_flags(existing: Sequence[str] | None, extra: Sequence[str]) -> list[str]:
    """`existing` plus the flags of `extra` it lacks (what a capture does to a build)."""
    return _merge_flags(existing, extra)


def record_build(record: ExtensionBuild) -> None:
    """Report a build made outside torch's `_jit_compile` (a build cache of its own, such as
    the optimizer's) to every open capture."""
    with _LOCK:
        for capture in _ACTIVE:
            capture.builds.append(record)


@contextlib.contextmanager
def capture_extensions(
    extra_cuda_cflags: Sequence[str] = DEFAULT_CUDA_FLAGS,
) -> Iterator[ExtensionCapture]:
    """Record every extension built inside the block; nested and concurrent blocks each see
    every build that happens while they are open."""
    capture = ExtensionCapture(extra_cuda_cflags=tuple(extra_cuda_cflags))
    with _LOCK:
        if not _ACTIVE:
            _install()
        _ACTIVE.append(capture)
    try:
        yield capture
    finally:
        with _LOCK:
            _ACTIVE.remove(capture)
            if not _ACTIVE:
                _uninstall()
