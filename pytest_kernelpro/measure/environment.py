"""What changes the code a kernel runs besides its source: the versions of the toolchain
(`code_versions`), and the choices made in the process (`AutotuneCapture`: what the item's
autotuned kernels chose, and pinning the baseline's; `library_choices`: the library algorithm
settings).

The versions: torch, Triton, the CUDA runtime torch was built with, cuDNN, the CUDA compiler
(nvcc, for extensions built in the session) and the NVIDIA driver (it compiles PTX to machine
code). Each is read once per process (nvcc is a subprocess) and left out when this process has no
such thing (a CPU-only torch has no CUDA runtime; triton is read only when installed). The
record keeps them (`KernelRecord.environment`), the baseline keeps them per entry, and
`gate/run_differences.py` names the ones that differ when a kernel regressed.

The autotune choices: what an item's autotuned kernels chose in this process, and pinning
the baseline's choice. An autotuner picks a configuration per process by timing its
candidates, and two processes running the same code may pick differently (the timings it
decides on are as noisy as any).
Triton's `Autotuner` (`triton.runtime.autotuner`, read for 3.6) keeps what it needs to say
what it chose: `configs` (the candidates), `keys` (the argument names whose values select a
tuning), `cache` (key tuple -> the chosen `Config`) and `best_config` (the config of the last
call); its key is the values of the `keys` arguments followed by `str(arg.dtype)` of every
argument with a dtype. A `Config` carries `kwargs` (the meta-parameters, e.g. BLOCK_SIZE),
`num_warps`, `num_stages`, `num_ctas`, `maxnreg` and `ir_override`; `all_kwargs()` gives them
flat, the form recorded here (`{"BLOCK_SIZE": 1024, "num_warps": 8, ...}`).

`AutotuneCapture.watching()` wraps `run` of every autotuner class (Triton's, and any a
conftest names through `pytest_kernelpro_autotuners`) while the item's correctness trials run:
the first calls are where a process tunes. Each call's key is computed the way Triton does;
the choice is read back from `cache` / `best_config` after the call, so a Triton whose key
rule changed still records the config (with the key it really used when it can be found).
The timing runs without the wrapper (it would add host time to every launch), and
`after_timing` records any key first tuned during the timing from the caches' growth.

Pinning (`pins`): before a call whose kernel and key have a pinned choice, the matching config
of the autotuner's own `configs` is put into `cache[key]`, so the autotuner runs it without
tuning, that call and every later one with the key (Triton checks its cache first). A pin
whose config is no longer among the kernel's `configs` is not applied and says why: the
configs changed, so the code did.

Library algorithm choices that change results or speed (`library_choices`): cuDNN's
benchmark mode (a per-process algorithm pick by timing), deterministic algorithms, TF32 and
reduced-precision reductions, the float32 matmul precision and the preferred BLAS library.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro.record import AutotunePart

NVCC_TIMEOUT_S = 20.0


@functools.cache
def _torch_versions() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {}
    out = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        out["cuda_runtime"] = str(torch.version.cuda)
    hip = getattr(torch.version, "hip", None)
    if hip:
        out["hip_runtime"] = str(hip)
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        cudnn = None
    if cudnn:
        out["cudnn"] = str(cudnn)
    return out


@functools.cache
def _triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def _find_nvcc() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


@functools.cache
def _nvcc_version() -> str | None:
    """nvcc's release ("13.0.88" from "Cuda compilation tools, release 13.0, V13.0.88")."""
    nvcc = _find_nvcc()
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--version"],
            capture_output=True,
            text=True,
            timeout=NVCC_TIMEOUT_S,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\bV(\d+(?:\.\d+)+)", out) or re.search(r"release (\d+(?:\.\d+)*)", out)
    return match.group(1) if match else None


@functools.cache
def _driver_version() -> str | None:
    """The NVIDIA driver's version: NVML, else /proc/driver/nvidia/version."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        try:
            version = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def code_versions(device_kind: str) -> dict[str, str]:
    """The versions that change the code an item runs on `device_kind` ("cuda"/"cpu"):
    torch and Triton always (when present); the CUDA runtime, cuDNN, nvcc and the driver on
    a CUDA device."""
    torch_versions = _torch_versions()
    out = {"torch": torch_versions["torch"]} if "torch" in torch_versions else {}
    triton = _triton_version()
    if triton:
        out["triton"] = triton
    if device_kind == "cuda":
        for name in ("cuda_runtime", "hip_runtime", "cudnn"):
            if name in torch_versions:
                out[name] = torch_versions[name]
        nvcc = _nvcc_version()
        if nvcc:
            out["nvcc"] = nvcc
        driver = _driver_version()
        if driver:
            out["driver"] = driver
    return out


# ----- autotune choices: recorded, and the baseline's pinned -----

# Autotuner classes found by module and class name when their module is loaded (a kernel
# that launches Triton has imported it).
KNOWN_AUTOTUNERS = (("triton.runtime.autotuner", "Autotuner"),)

TUNED = "tuned"  # benchmarked its configs in this process
CACHED = "cached"  # found in the autotuner's cache (tuned earlier in this process)
PINNED = "pinned"  # the pinned config, placed in the cache before the call
SINGLE = "single"  # only one config: nothing to choose
TUNED_IN_TIMING = "tuned during timing"  # a key first seen in the timing's calls


def json_value(value: Any) -> Any:
    """A key element or config value as JSON: numbers, strings, booleans and None as they
    are (non-finite floats as text), anything else as its `str` (a dtype: "torch.float16")."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def kernel_name(tuner: Any) -> str:
    """The autotuned function's module and qualified name (Triton: `base_fn`)."""
    fn = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{name}"


def config_dict(config: Any) -> dict[str, Any]:
    """A Triton `Config` flat, as `all_kwargs()` gives it (meta-parameters, num_warps,
    num_stages, num_ctas, maxnreg when set), JSON values."""
    try:
        flat = config.all_kwargs()
    except Exception:  # another shape of config: its public attributes
        flat = dict(getattr(config, "kwargs", {}) or {})
        for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if getattr(config, name, None) is not None:
                flat[name] = getattr(config, name)
    return {str(k): json_value(v) for k, v in dict(flat).items()}


def autotune_key(tuner: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The key Triton 3.6's `Autotuner.run` computes for a call: the `keys` arguments' values,
    then `str(dtype)` of every argument (of the kernel's own, in call order) with a dtype."""
    names = list(getattr(tuner, "arg_names", ()) or ())
    all_args = {**dict(zip(names, args, strict=False)), **kwargs}
    own = {k: v for k, v in all_args.items() if k in names}
    key: list[Any] = [own[k] for k in getattr(tuner, "keys", ()) or () if k in own]
    key += [str(v.dtype) for v in own.values() if hasattr(v, "dtype")]
    return tuple(key)


def key_text(key: Sequence[Any] | None) -> list[Any] | None:
    """A key in its recorded (JSON) form."""
    return None if key is None else [json_value(v) for v in key]


@dataclass(frozen=True)
class Pin:
    """A choice to impose: this kernel, at this key (recorded form), runs this config."""

    kernel: str
    key: list[Any] | None
    config: dict[str, Any]

    @classmethod
    def from_choice(cls, choice: Mapping[str, Any]) -> Pin:
        key = choice.get("key")
        return cls(
            kernel=str(choice.get("kernel")),
            key=list(key) if isinstance(key, list) else None,
            config=dict(choice.get("config") or {}),
        )


@dataclass
class _Seen:
    """One autotuner met during the capture."""

    tuner: Any
    keys_after_check: set[Any] = field(default_factory=set)


def autotuner_classes(extra: Iterable[type] = ()) -> list[type]:
    """The autotuner classes to watch: Triton's when its module is loaded, then `extra`."""
    found: list[type] = []
    for module_name, class_name in KNOWN_AUTOTUNERS:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    for cls in extra:
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return found


def load_triton_if_used(language: str) -> None:
    """Import Triton's autotuner for a Triton item that has not imported it yet (a kernel
    that imports triton lazily, at its first call); nothing when triton is not installed."""
    if language != "triton" or "triton.runtime.autotuner" in sys.modules:
        return
    with contextlib.suppress(Exception):
        importlib.import_module("triton.runtime.autotuner")


class AutotuneCapture:
    """Records the choices of autotuned kernels (and applies `pins`) while `watching`."""

    def __init__(self, pins: Iterable[Pin] = (), classes: Iterable[type] = ()) -> None:
        self.pins = list(pins)
        self.extra_classes = list(classes)
        self.choices: dict[tuple[str, str], dict[str, Any]] = {}
        self.pin_problems: list[str] = []
        self._seen: dict[int, _Seen] = {}

    def _pin_for(self, tuner: Any, key: tuple[Any, ...]) -> tuple[Pin | None, Any]:
        """The pin for this call and the autotuner's own config matching it (or None)."""
        name, recorded = kernel_name(tuner), key_text(key)
        for pin in self.pins:
            if pin.kernel != name or (pin.key is not None and pin.key != recorded):
                continue
            for config in getattr(tuner, "configs", ()) or ():
                if config_dict(config) == pin.config:
                    return pin, config
            problem = (
                f"{name.rsplit('.', 1)[-1]}: the baseline's config {config_words(pin.config)} "
                "is not among the kernel's configs now (its configs changed), so it was not pinned"
            )
            if problem not in self.pin_problems:
                self.pin_problems.append(problem)
            return pin, None
        return None, None

    def _wrap(self, original: Any) -> Any:
        capture = self

        def run(tuner: Any, *args: Any, **kwargs: Any) -> Any:
            configs = getattr(tuner, "configs", ()) or ()
            cache = getattr(tuner, "cache", None)
            key: tuple[Any, ...] | None = None
            had: set[Any] = set()
            pinned = None
            if len(configs) > 1 and isinstance(cache, dict):
                key = autotune_key(tuner, args, kwargs)
                had = set(cache)
                pin, config = capture._pin_for(tuner, key) if capture.pins else (None, None)
                if config is not None:
                    cache[key] = config
                    pinned = config
            result = original(tuner, *args, **kwargs)
            capture._note(tuner, key, had, pinned)
            return result

        run.__wrapped__ = original  # type: ignore[attr-defined]
        return run

    def _note(self, tuner: Any, key: tuple[Any, ...] | None, had: set[Any], pinned: Any) -> None:
        seen = self._seen.setdefault(id(tuner), _Seen(tuner))
        config = getattr(tuner, "best_config", None)
        configs = getattr(tuner, "configs", ()) or ()
        cache = getattr(tuner, "cache", None)
        if config is None:
            return
        if len(configs) <= 1:
            source, used_key = SINGLE, None
        else:
            used_key = key
            if isinstance(cache, dict) and cache.get(key) is not config:
                # Triton computed another key than ours (its rule changed): the key it
                # added in this call with this config, if one.
                new = [k for k in cache if k not in had and cache[k] is config]
                used_key = new[0] if len(new) == 1 else None
            if pinned is not None and config is pinned:
                source = PINNED
            elif used_key is not None and used_key in had:
                source = CACHED
            else:
                source = TUNED
        self._add(tuner, used_key, config, source)
        if isinstance(cache, dict):
            seen.keys_after_check.update(cache)

    def _add(self, tuner: Any, key: Any, config: Any, source: str) -> None:
        name = kernel_name(tuner)
        recorded = key_text(key)
        ident = (name, repr(recorded))
        if ident in self.choices:
            return
        choice: dict[str, Any] = {
            "kernel": name,
            "key": recorded,
            "key_names": [str(k) for k in getattr(tuner, "keys", ()) or ()],
            "config": config_dict(config),
            "configs": len(getattr(tuner, "configs", ()) or ()),
            "source": source,
        }
        if getattr(tuner, "cache_results", False):
            # Triton's disk cache of tunings: a fresh process reads the earlier pick.
            choice["disk_cache"] = True
        self.choices[ident] = choice

    @contextlib.contextmanager
    def watching(self) -> Iterator[AutotuneCapture]:
        """Wrap the autotuner classes' `run` for the duration; restored on exit."""
        patched: list[tuple[type, Any]] = []
        try:
            for cls in autotuner_classes(self.extra_classes):
                original = cls.__dict__.get("run")
                if original is None:
                    continue
                cls.run = self._wrap(original)  # type: ignore[attr-defined]
                patched.append((cls, original))
            yield self
        finally:
            for cls, original in reversed(patched):
                cls.run = original  # type: ignore[attr-defined]

    def after_timing(self) -> None:
        """Record keys first tuned while the timing ran (without the wrapper): the growth of
        each seen autotuner's cache since the capture."""
        for seen in self._seen.values():
            cache = getattr(seen.tuner, "cache", None)
            if not isinstance(cache, dict):
                continue
            for key, config in list(cache.items()):
                if key not in seen.keys_after_check:
                    self._add(seen.tuner, key, config, TUNED_IN_TIMING)
            seen.keys_after_check.update(cache)

    def part(self, library: dict[str, Any] | None) -> AutotunePart:
        """The record's `autotune` part: the choices, the pins and why a pin could not be
        applied (None when none), and the `library` settings that choose algorithms."""
        pinned = tuple({"kernel": p.kernel, "key": p.key, "config": p.config} for p in self.pins)
        return AutotunePart(
            choices=tuple(self.choices.values()),
            library=library,
            pinned=pinned or None,
            pin_problems=tuple(self.pin_problems) or None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The `autotune` part's JSON form, without the library settings."""
        part = self.part(None)
        out: dict[str, Any] = {"choices": list(part.choices)}
        if part.pinned:
            out["pinned"] = list(part.pinned)
        if part.pin_problems:
            out["pin_problems"] = list(part.pin_problems)
        return out


def config_words(config: Mapping[str, Any]) -> str:
    """A config in words: "BLOCK_SIZE=1024, num_warps=8, num_stages=3"."""
    return ", ".join(f"{k}={v}" for k, v in config.items()) or "(no parameters)"


def library_choices() -> dict[str, Any]:
    """The library settings that choose algorithms (and so results and speed) in this
    process; a setting this torch does not have is left out."""
    try:
        import torch
    except ImportError:
        return {}
    out: dict[str, Any] = {}
    readers = {
        "cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
        "cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": lambda: (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": lambda: (
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "preferred_blas_library": lambda: torch.backends.cuda.preferred_blas_library(),
    }
    for name, read in readers.items():
        # Some of these accessors are deprecated in newer torch: reading one must not warn.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                value = read()
            except Exception:
                continue
        out[name] = json_value(getattr(value, "name", value))  # an enum by its name
    return out
