"""The real problem, as the Programmer sees it in every prompt.

A model that is shown a generated shim (`load_problem(...)`) learns nothing about the
computation. `ProblemContext` holds what a person reviewing the kernel would read: the
reference as the user wrote it (function, lambda or module class, found through `inspect`
wherever it lives), the user's current kernel and the implementation module(s) it calls, the
inputs actually used (dtype, shape, device, layout; scalars by value), the constructor
arguments, and how a module's weights reach the candidate. `render()` is the prompt section.

The sandbox still runs a KernelBench-format module (`class Model`, `get_inputs`); its source
closes the section, so the model knows the interface `ModelNew` must match.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.optimize.agents.prompts.builder import code_block

MAX_MODULE_CHARS = 12_000  # an implementation module longer than this: only what is called
SKIP_MODULES = ("torch", "numpy", "math", "triton", "pytest", "builtins", "functools", "typing")
WEIGHTS_RULE = (
    "The checker copies the reference's parameters and buffers into `ModelNew` before "
    "checking: by name when the state_dict keys match, otherwise by position, matching the "
    "entries of both state_dicts in registration order by shape. So name your parameters as "
    "you like, but register tensors of these shapes in this order:"
)


@dataclass(frozen=True)
class SourcePart:
    """One piece of source code and where it lives."""

    label: str
    where: str
    source: str

    def render(self) -> str:
        return f"{self.label} ({self.where}):\n{code_block(self.source)}"


@dataclass(frozen=True)
class ProblemContext:
    """What the Programmer is told about the problem (module doc)."""

    name: str
    reference: SourcePart
    kernel: SourcePart | None = None
    implementation: tuple[SourcePart, ...] = ()
    inputs: tuple[str, ...] = ()
    init_args: str = ""
    weights: tuple[str, ...] = ()  # "weight: float32 (1024,)" in state_dict order
    device: str = ""
    sandbox_source: str = ""

    def render(self) -> str:
        """The "## The problem" Markdown section."""
        lines = [f"## The problem: `{self.name}`", "", self.reference.render()]
        if self.kernel is not None:
            lines += ["", "The current kernel, which your solution replaces:", self.kernel.render()]
        for part in self.implementation:
            lines += ["", part.render()]
        if self.inputs:
            lines += ["", "Inputs actually used (in call order):"]
            lines += [f"- {line}" for line in self.inputs]
        if self.init_args:
            lines += ["", f"Constructor arguments (`get_init_inputs()`): {self.init_args}"]
        if self.weights:
            lines += ["", WEIGHTS_RULE]
            lines += [f"- {w}" for w in self.weights]
        if self.sandbox_source:
            lines += [
                "",
                "The checker runs this KernelBench-format module as the reference "
                "(`ModelNew(*get_init_inputs())(*get_inputs())` must match "
                "`Model(*get_init_inputs())(*get_inputs())`):",
                code_block(self.sandbox_source),
            ]
        return "\n".join(lines) + "\n"


def describe_value(value: Any, name: str = "") -> str:
    """One line for an input: tensors by dtype, shape, device and layout; others by value."""
    prefix = f"`{name}`: " if name else ""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is there wherever kernels run
        torch = None  # type: ignore[assignment]
    if torch is not None and isinstance(value, torch.Tensor):
        layout = "contiguous" if value.is_contiguous() else f"strides {tuple(value.stride())}"
        return (
            f"{prefix}tensor {str(value.dtype).removeprefix('torch.')} "
            f"{tuple(value.shape)} on {value.device}, {layout}"
        )
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe_value(v) for v in value[:8])
        more = f", ... {len(value) - 8} more" if len(value) > 8 else ""
        return f"{prefix}{type(value).__name__} of {len(value)}: [{inner}{more}]"
    text = repr(value)
    return f"{prefix}{type(value).__name__} {text[:80]}"


def _relative(path: str | None, root: str | None) -> str:
    if not path:
        return "?"
    if root:
        real = os.path.realpath(path)
        try:
            return os.path.relpath(real, root) if os.path.commonpath([real, root]) == root else path
        except ValueError:  # another drive
            return path
    return path


def _where(obj: Any, root: str | None = None) -> str:
    target = inspect.unwrap(obj) if callable(obj) else obj
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", "?")
    try:
        file = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return f"{module}.{qualname}"
    return f"{module}.{qualname}, {_relative(file, root)}:{line}"


def source_of(obj: Any) -> str | None:
    """The source of a function, lambda or class as written (dedented), or None."""
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    return textwrap.dedent(source).rstrip()


def reference_part(reference: Any, root: str | None = None) -> SourcePart:
    """The reference's source, or what it is when it has none (a PyTorch built-in)."""
    name = getattr(reference, "__qualname__", None) or getattr(reference, "__name__", None)
    source = source_of(reference)
    if source is None:
        module = getattr(reference, "__module__", None) or "torch"
        label = f"{module}.{name}" if name else repr(reference)
        return SourcePart(
            "The reference", "a built-in without Python source", f"# the reference is {label}"
        )
    if name == "<lambda>":
        return SourcePart(
            "The reference (a lambda in the marker)", _where(reference, root), source.strip()
        )
    return SourcePart("The reference", _where(reference, root), source)


def _called_modules(obj: Any) -> list[Any]:
    """Modules (not torch & co.) whose names the kernel's code uses, one level deep; for a
    class, its methods and the modules of its base classes too."""
    found: list[Any] = []
    targets = [obj]
    if inspect.isclass(obj):
        targets = [v for v in vars(obj).values() if inspect.isfunction(v)]
        for base in obj.__mro__[1:]:
            mod = inspect.getmodule(base)
            if mod is not None and mod.__name__.split(".")[0] not in SKIP_MODULES:
                if mod not in found and mod is not inspect.getmodule(obj):
                    found.append(mod)
    for target in targets:
        code = getattr(target, "__code__", None)
        namespace = getattr(target, "__globals__", {})
        for name in getattr(code, "co_names", ()):
            ref = namespace.get(name)
            mod = (
                ref if inspect.ismodule(ref) else inspect.getmodule(ref) if callable(ref) else None
            )
            if mod is None or mod.__name__.split(".")[0] in SKIP_MODULES:
                continue
            if mod is inspect.getmodule(obj) or mod in found:
                continue
            found.append(mod)
    return found


def implementation_parts(kernel: Any, root: str | None = None) -> list[SourcePart]:
    """The implementation modules the kernel calls: whole when short, else the functions
    and classes of it that the kernel names."""
    parts = []
    for module in _called_modules(kernel):
        source = source_of(module)
        if source is None:
            continue
        file = _relative(getattr(module, "__file__", None), root)
        if len(source) <= MAX_MODULE_CHARS:
            parts.append(SourcePart(f"Implementation module `{module.__name__}`", file, source))
            continue
        used = _names_used(kernel)
        pieces = [
            src
            for n in used
            if (member := getattr(module, n, None)) is not None
            and (src := source_of(member)) is not None
        ]
        if pieces:
            parts.append(
                SourcePart(
                    f"From implementation module `{module.__name__}` (the parts the kernel calls)",
                    file,
                    "\n\n\n".join(pieces),
                )
            )
    return parts


def _names_used(kernel: Any) -> list[str]:
    code = getattr(kernel, "__code__", None)
    names = list(getattr(code, "co_names", ()))
    return list(dict.fromkeys(names))


def _parameter_names(obj: Any) -> list[str]:
    target = obj.forward if inspect.isclass(obj) and hasattr(obj, "forward") else obj
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[1:] if inspect.isclass(obj) and names[:1] == ["self"] else names


def weight_lines(module: Any) -> list[str]:
    """`name: dtype shape` of a module's state_dict, in registration order."""
    state = getattr(module, "state_dict", None)
    if not callable(state):
        return []
    return [
        f"`{k}`: {str(v.dtype).removeprefix('torch.')} {tuple(v.shape)}" for k, v in state().items()
    ]


def build_context(
    name: str,
    reference: Any,
    *,
    kernel: Any = None,
    inputs: Sequence[Any] = (),
    input_names: Sequence[str] = (),
    init_args: Sequence[Any] = (),
    reference_module: Any = None,
    device: str = "",
    sandbox_source: str = "",
    root: str | os.PathLike[str] | None = None,
) -> ProblemContext:
    """A ProblemContext from live objects (the kernel item's, in the pytest process); file
    paths are shown relative to `root` (the repository) when under it."""
    base = None if root is None else os.path.realpath(root)
    kernel_part = None
    implementation: list[SourcePart] = []
    if kernel is not None:
        source = source_of(kernel)
        if source is not None:
            kernel_part = SourcePart("Current kernel", _where(kernel, base), source)
        implementation = implementation_parts(kernel, base)
    names = list(input_names) or _parameter_names(kernel if kernel is not None else reference)
    names += [""] * max(0, len(inputs) - len(names))
    return ProblemContext(
        name=name,
        reference=reference_part(reference, base),
        kernel=kernel_part,
        implementation=tuple(implementation),
        inputs=tuple(describe_value(v, n) for v, n in zip(inputs, names, strict=False)),
        init_args=", ".join(describe_value(a) for a in init_args) if init_args else "",
        weights=tuple(weight_lines(reference_module)) if reference_module is not None else (),
        device=device,
        sandbox_source=sandbox_source,
    )
