"""The full path: `load_inline`-style torch extensions through the build cache, with the
host binding reused when only the device code changes.

`build_extension(name, cpp_sources, cuda_sources, functions, ...)` takes what
`torch.utils.cpp_extension.load_inline` takes, and `import_extension` imports what it built. The extension is built by `load_inline`
itself, in a child process, under a module name and in a build directory that depend only
on the binding (`cpp_sources`, `functions`, host flags, torch and Python versions): the
generated `main.cpp` is then byte-identical between two candidates that differ only in
their CUDA code, so ninja keeps its object (compiling `torch/extension.h`, about half of a
`load_inline` build) and recompiles `cuda.cu` alone. The finished `.so` is copied into a
content-addressed entry (all inputs in the key), so an identical extension is never built
twice, and imported from there.

Unlike `load_inline`, torch's headers are put in front of the CUDA code only when it uses
torch (`torch::`, `at::`, `c10::`, `TORCH_*` macros, `<torch/...>` includes): device code
without torch then compiles in about a second.

The build runs in a child process for three reasons: torch numbers repeated JIT builds of
one name in a process (`name_v1`, which changes the compile flags and defeats the reuse);
`load_inline` imports what it built, which runs the candidate's static initializers, and
that must not happen in the process that builds ahead for the search; and several builds
run at once on the machine's cores. The child only builds: it does not import the module
(which would run the candidate's static initializers outside the sandbox).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_kernelpro.optimize.build.cache import (
    BuildCache,
    BuildError,
    CacheableBuildError,
    Confinement,
    build_key,
    confined_env,
    sandbox_outcome,
)
from pytest_kernelpro.optimize.build.flags import check_extension_flags, check_flag_lists
from pytest_kernelpro.optimize.build.nvcc import compiler_version, find_nvcc, trim_compiler_log

SPEC_NAME = "spec.json"
_USES_TORCH = re.compile(r"\b(?:torch|at|c10)::|\b(?:TORCH|AT|C10)_[A-Z]|<(?:torch|ATen|c10)/")
_records: list[dict[str, Any]] = []


def _as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


@dataclass(frozen=True)
class BuiltExtension:
    """The outcome of one `build_extension` call."""

    key: str
    binding_key: str
    module_name: str
    path: Path  # the .so in the cache entry
    hit: bool
    seconds: float  # this call's wall time
    compile_s: float  # the build's time when the entry was made
    binding_reused: bool  # the binding object was already compiled (only cuda.cu rebuilt)
    log: str = ""  # the build's ninja -v output (compile lines, ptxas -v report)

    def record(self) -> dict[str, Any]:
        return {
            "path": "extension",
            "key": self.key,
            "binding_key": self.binding_key,
            "hit": self.hit,
            "seconds": round(self.seconds, 4),
            "compile_s": round(self.compile_s, 4),
            "binding_reused": self.binding_reused,
            "so": str(self.path),
        }


def extension_records(clear: bool = False) -> list[dict[str, Any]]:
    """The builds this process made through `build_extension` (and `clear` them)."""
    out = list(_records)
    if clear:
        _records.clear()
    return out


def build_extension(
    name: str,
    cpp_sources: str | Sequence[str],
    cuda_sources: str | Sequence[str] | None = None,
    functions: str | Sequence[str] | None = None,
    *,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    cache: BuildCache | str | os.PathLike[str] | None = None,
    timeout_s: float = 900.0,
) -> BuiltExtension:
    """Build (or find) the extension; see the module doc. `name` is only a label: the
    module name comes from the binding's key."""
    import torch

    started = time.monotonic()
    # Refused flags never reach build.ninja (flags.py says why): the candidate's build_error.
    check_flag_lists(
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_include_paths=extra_include_paths,
    )
    store = cache if isinstance(cache, BuildCache) else BuildCache(cache)
    cpp, cuda, funcs = _as_list(cpp_sources), _as_list(cuda_sources), _as_list(functions)
    # load_inline's implicit headers, but torch's only where the CUDA code uses torch: device
    # code without it then compiles in about a second instead of tens of seconds.
    cpp = ["#include <torch/extension.h>", *cpp]
    if cuda:
        uses_torch = any(_USES_TORCH.search(text) for text in cuda)
        head = ["#include <torch/types.h>"] if uses_torch else []
        cuda = [*head, "#include <cuda.h>", "#include <cuda_runtime.h>", *cuda]
    cflags, cuda_flags = _as_list(extra_cflags), _as_list(extra_cuda_cflags)
    includes = _as_list(extra_include_paths)
    nvcc = find_nvcc() if cuda else None
    binding_inputs = {
        "kind": "ext-binding",
        "cpp_sources": cpp,
        "functions": funcs,
        "extra_cflags": cflags,
        "include_paths": includes,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "with_cuda": bool(cuda),
    }
    binding_key = build_key(binding_inputs)
    key = build_key(
        {
            **binding_inputs,
            "kind": "extension",
            "cuda_sources": cuda,
            "extra_cuda_cflags": cuda_flags,
            "compiler": compiler_version(nvcc) if nvcc else None,
        }
    )
    module_name = f"kp_ext_{binding_key[:16]}"
    spec = {
        "name": module_name,
        "cpp_sources": cpp,
        "cuda_sources": cuda or None,
        "functions": funcs or None,
        "extra_cflags": cflags,
        "extra_cuda_cflags": cuda_flags,
        "extra_include_paths": includes,
        "no_implicit_headers": True,  # added above
    }
    reused = {"value": False}

    def produce(folder: Path) -> dict[str, Any]:
        build_dir = (store.root if store.writable else folder) / "ext-build" / binding_key
        began = time.monotonic()
        locks = store.root / "locks"
        if store.writable:
            locks.mkdir(parents=True, exist_ok=True)
        lock_path = (locks if store.writable else folder) / f"ext-{binding_key}.lock"
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # one build per build directory
            reused["value"] = any(build_dir.glob("main.o")) or any(build_dir.glob("*/main.o"))
            log = _run_child(spec, build_dir, folder, timeout_s, store.confine)
        shutil.copy2(build_dir / f"{module_name}.so", folder / f"{module_name}.so")
        return {
            "kind": "extension",
            "log": log[-20_000:],
            "module": module_name,
            "binding_key": binding_key,
            "binding_reused": reused["value"],
            "build_s": time.monotonic() - began,
        }

    entry = store.get_or_build(key, produce)
    build = BuiltExtension(
        key=key,
        binding_key=binding_key,
        module_name=module_name,
        path=entry.path / f"{module_name}.so",
        hit=entry.hit,
        seconds=time.monotonic() - started,
        compile_s=float(entry.meta.get("build_s") or 0.0),
        binding_reused=bool(entry.meta.get("binding_reused")),
        log=str(entry.meta.get("log") or ""),
    )
    _records.append(build.record())
    return build


def import_extension(build: BuiltExtension) -> ModuleType:
    """Import the built extension from its cache entry."""
    loader = importlib.machinery.ExtensionFileLoader(build.module_name, str(build.path))
    spec = importlib.util.spec_from_file_location(build.module_name, str(build.path), loader=loader)
    if spec is None:
        raise BuildError(f"cannot import {build.path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _run_child(
    spec: dict[str, Any],
    build_dir: Path,
    folder: Path,
    timeout_s: float,
    confine: Confinement | None = None,
) -> str:
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch's own lock of the directory, left behind by a build that was killed, would make
    # this one wait forever; the caller holds our lock of the directory, so none is running.
    (build_dir / "lock").unlink(missing_ok=True)
    spec_path = folder / SPEC_NAME
    spec_path.write_text(json.dumps({**spec, "build_directory": str(build_dir)}), encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "pytest_kernelpro.optimize.build.extension",
        "--spec",
        str(spec_path),
    ]
    env = _child_env()
    sandboxed = False
    if confine is not None:
        # In the candidates' sandbox (the search's builds ahead): it writes only this entry's
        # folder and the binding's build directory, and sees no home, no secret.
        env.update(confined_env(folder))
        wrapped = confine(command, folder, [build_dir])
        sandboxed, command = wrapped != command, wrapped
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=timeout_s,
            env=env, check=False, cwd=build_dir,  # not the caller's cwd: another checkout
        )  # fmt: skip                                # of this package there would shadow it
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"the extension build did not finish within {timeout_s:g}s") from exc
    log = (done.stdout + done.stderr).replace(str(build_dir) + os.sep, "")
    if sandboxed:
        started, log = sandbox_outcome(log)
        if not started:  # not the source's fault: not cached
            raise BuildError(
                f"the build sandbox did not start (exit {done.returncode}): {log[-600:]}", log
            )
    if done.returncode == 0:
        return log
    if done.returncode == 3:  # the compiler refused the source: cache the failure
        raise CacheableBuildError(trim_compiler_log(log), log)
    raise BuildError(f"the extension build failed (exit {done.returncode})", log)


_ENV_NAMES = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "LIBRARY_PATH",
              "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX", "CUDAHOSTCXX", "MAX_JOBS",
              "TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR")  # fmt: skip


def _child_env() -> dict[str, str]:
    """What the compilers need, and nothing that could hold a credential."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_NAMES or k.startswith("CUDA")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")) if p
    )
    return env


# load_inline keywords the cached path reproduces; a call with any other goes to torch as is.
SUPPORTED_KEYWORDS = frozenset({
    "name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_include_paths", "verbose", "build_directory", "with_cuda",
})  # fmt: skip


def cached_load_inline(original: Any, cache: BuildCache | None = None) -> Any:
    """A stand-in for `torch.utils.cpp_extension.load_inline` that builds through the cache
    (`build_extension`, `import_extension`) when the call uses only `SUPPORTED_KEYWORDS`, else calls `original`."""

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any,
                    **kwargs: Any) -> Any:  # fmt: skip
        # Every flag is checked, also of the calls torch builds itself (flags.py says why).
        check_extension_flags(kwargs)
        if args or not set(kwargs) <= SUPPORTED_KEYWORDS or kwargs.get("with_cuda") is False:
            return original(name, cpp_sources, cuda_sources, *args, **kwargs)
        from pytest_kernelpro.profile import capture

        flags = kwargs.get("extra_cuda_cflags")
        if cuda_sources:  # the profiler's flags, as a capture adds them to torch's builds
            flags = capture.merge_cuda_flags(flags, capture.active_cuda_flags())
        started = time.perf_counter()
        try:
            build = build_extension(
                name, cpp_sources, cuda_sources, kwargs.get("functions"),
                extra_cflags=kwargs.get("extra_cflags"), extra_cuda_cflags=flags,
                extra_include_paths=kwargs.get("extra_include_paths"), cache=cache,
            )  # fmt: skip
            module = import_extension(build)
        except BaseException as exc:
            capture.record_build(_capture_record(name, None, flags, time.perf_counter() - started,
                                                 error=f"{type(exc).__name__}: {exc}"))  # fmt: skip
            raise
        capture.record_build(_capture_record(name, build, flags, time.perf_counter() - started))
        return module

    load_inline.__wrapped__ = original  # type: ignore[attr-defined]
    return load_inline


def _capture_record(name: str, build: BuiltExtension | None, flags: Any, seconds: float,
                    error: str | None = None) -> Any:  # fmt: skip
    """The `profile.capture.ExtensionBuild` of a build made here."""
    from pytest_kernelpro.profile.capture import ExtensionBuild
    from pytest_kernelpro.profile.ptxas import parse_ptxas_output

    log = build.log if build is not None else ""
    return ExtensionBuild(
        name=build.module_name if build is not None else name,
        build_directory=str(build.path.parent) if build is not None else "",
        so_path=str(build.path) if build is not None else None,
        extra_cuda_cflags=tuple(flags or ()),
        build_log=log,
        build_seconds=seconds,
        ptxas=tuple(parse_ptxas_output(log)),
        log_source="none" if build is None else ("cached" if build.hit else "ninja"),
        error=error,
    )


@contextlib.contextmanager
def cached_extension_builds(cache: BuildCache | None = None) -> Iterator[None]:
    """While the block runs, `load_inline` calls build through the build cache (see
    `cached_load_inline`): the evaluator may have built them ahead, and candidates that
    differ only in CUDA code share the compiled host binding. Open captures
    (`profile.capture`) see these builds as they see torch's."""
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline
    cpp_extension.load_inline = cached_load_inline(original, cache)
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def _child(spec_path: Path) -> int:
    """Child process: one load_inline build (exit 3 on a compiler error)."""
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    import torch.utils.cpp_extension as cpp_extension

    if cpp_extension.CUDA_HOME is None and os.environ.get("CUDA_HOME"):
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # a CPU-only torch builds too
    # Build only: importing would run the candidate's static initializers here, outside the
    # sandbox (the build ahead runs for the search's own process). The caller imports the
    # `.so` from the cache entry where it is allowed to.
    if hasattr(cpp_extension, "_import_module_from_library"):
        cpp_extension._import_module_from_library = lambda *args, **kwargs: None
    try:
        cpp_extension.load_inline(**spec, verbose=True)  # ninja -v: the ptxas report
    except Exception as exc:
        sys.stderr.write(str(exc))
        return 3 if "Error building extension" in str(exc) else 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m pytest_kernelpro.optimize.build.extension")
    parser.add_argument("--spec", type=Path, required=True)
    sys.exit(_child(parser.parse_args().spec))
