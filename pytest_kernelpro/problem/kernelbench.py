"""KernelBench-format problem files: `class Model`, `get_inputs()`, `get_init_inputs()`,
and optionally `class ModelNew` (the kernel under test; `Model` is the reference).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.problem.build import build_module, init_inputs_of
from pytest_kernelpro.problem.language import detect_language
from pytest_kernelpro.problem.model import Problem, sharing_weights

_MODEL_RE = re.compile(r"^class\s+Model\s*\(", re.MULTILINE)
_INPUTS_RE = re.compile(r"^def\s+get_inputs\s*\(", re.MULTILINE)


def is_kernelbench_file(path: Path) -> bool:
    """True for a .py file in the problems directory that defines `class Model(` or
    `def get_inputs(` at top level, or cannot be read: one that has only one of the two, or
    is not UTF-8, is a broken problem and must fail as one, not be passed over."""
    if path.suffix != ".py" or not path.is_file():
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return True
    return bool(_MODEL_RE.search(text) or _INPUTS_RE.search(text))


def _to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def kernelbench_inputs(module: Any, device: str) -> tuple[Any, ...]:
    """One input set of a KernelBench module (its `get_inputs()`, seeded by the caller) on
    `device`: with the device as the default device its tensors are made there (seeded,
    bit-identical across runs) instead of on the CPU and copied; what it still makes elsewhere
    is moved."""
    import torch

    with torch.device(device):
        made = module.get_inputs()
    return tuple(_to_device(v, device) for v in made)


def _defining_source(cls: type, fallback: str) -> str:
    import inspect

    try:
        file = inspect.getsourcefile(cls)
        return Path(file).read_text(encoding="utf-8") if file else fallback
    except (OSError, TypeError, UnicodeDecodeError):
        return fallback


def problem_from_kernelbench(path: Path) -> Problem:
    """Import the file and wrap it as a Problem; a broken file is a clear error."""
    try:
        module = import_file(path)
    except Exception as exc:
        raise KernelproConfigError(
            f"KernelBench file {path} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    missing = [n for n in ("Model", "get_inputs") if not hasattr(module, n)]
    if missing:
        raise KernelproConfigError(
            f"KernelBench file {path} lacks {', '.join(missing)}; it needs class Model, "
            "get_inputs() and get_init_inputs()"
        )
    get_init = init_inputs_of(module)
    reference_cls = module.Model
    kernel_cls = getattr(module, "ModelNew", None) or reference_cls

    def build(cls: type) -> Any:
        def factory(device: str) -> Any:
            return build_module(cls, get_init, device, seed=0)

        return factory

    def inputs(device: str) -> tuple[Any, ...]:
        return kernelbench_inputs(module, device)

    reference_factory = build(reference_cls)
    if kernel_cls is reference_cls:
        # No ModelNew: the kernel under test is the reference module itself; one instance,
        # so its parameters are neither built nor held twice.
        def kernel_factory(device: str, reference: Any = None) -> Any:
            return reference if reference is not None else reference_factory(device)

        kernel_factory.takes_reference = True  # type: ignore[attr-defined]
    else:
        kernel_factory = sharing_weights(build(kernel_cls), reference_factory)

    text = path.read_text(encoding="utf-8")
    language = detect_language(text) if kernel_cls is not reference_cls else "pytorch"
    if language == "pytorch" and kernel_cls is not reference_cls:
        # ModelNew imported from another file (a kernelpro patch): that file decides.
        language = detect_language(_defining_source(kernel_cls, text))
    return Problem(
        name=path.stem,
        kernel_factory=kernel_factory,
        reference_factory=reference_factory,
        input_factory=inputs,
        kind="kernelbench",
        source_file=str(path),
        language_given=language,
        extra={"has_model_new": kernel_cls is not reference_cls},
    )


def import_file(path: str | Path, module_name: str | None = None) -> Any:
    """Import a Python file by path, with its directory on sys.path (as pytest's rootdir
    insertion would have it), so `from mykernels import ...` works."""
    file = Path(path).resolve()
    for entry in (str(file.parent), str(Path.cwd())):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    name = module_name or f"_kernelpro_{file.stem}_{abs(hash(str(file))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise KernelproConfigError(f"cannot import {file}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
