"""The unified Problem: every kind of kernel (marked function, marked nn.Module class,
KernelBench file) becomes one of these, and everything downstream consumes only this.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.problem.language import detect_language_of

MARKER_NAME = "kernelpro"
MARKER_SIGNATURE = (
    "kernelpro(reference, inputs, rtol=None, atol=None, flops=None, bytes=None, "
    "min_roofline=None, threshold=None, source=None, language=None, shapes=None, "
    "device=None, init_inputs=(), trials=None, dtype=None, streams=None): collect this function or "
    "nn.Module class as a kernel item: checked against `reference` on inputs from "
    "`inputs(device)`, timed, and placed on its roofline"
)
LANGUAGES = ("pytorch", "triton", "cuda")
# GPU: "current" (default): device work left on another stream fails the kernel; "any": it is
# timed at its real cost (a device-wide synchronize after every call, measure/timing/streams.py).
STREAM_MODES = ("current", "any")
DEVICES = ("cuda", "cpu", "any")


def _positive_fraction(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


def _nonnegative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


_FLOATING_DTYPES = ("float16", "bfloat16", "float32", "float64")
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}


def _floating_dtype_name(value: Any) -> str | None:
    """`"bfloat16"` for `torch.bfloat16` or `"bfloat16"`; None for anything else (checked
    without importing torch: a marker is read at collection)."""
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        value = str(value).removeprefix("torch.")
    if not isinstance(value, str):
        return None
    name = _DTYPE_ALIASES.get(value, value)
    return name if name in _FLOATING_DTYPES else None


# keyword -> (check, what it must be)
_MARKER_KEYWORDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "reference": (callable, "a callable or nn.Module class computing the expected output"),
    "inputs": (callable, "a callable inputs(device) returning a tuple of inputs"),
    "rtol": (_nonnegative, "a number >= 0, e.g. rtol=1e-3"),
    "atol": (_nonnegative, "a number >= 0, e.g. atol=1e-5"),
    "flops": (_nonnegative, "the FLOP count as a number, e.g. flops=2 * M * N * K"),
    "bytes": (_nonnegative, "the minimal byte count as a number, e.g. bytes=4 * (M * K + K * N)"),
    "min_roofline": (_positive_fraction, "a fraction in (0, 1], e.g. min_roofline=0.6"),
    "threshold": (_positive_fraction, "a fraction in (0, 1], e.g. threshold=0.05"),
    "source": (lambda v: isinstance(v, (str, Path)), "a path to the kernel's source file"),
    "language": (lambda v: v in LANGUAGES, "one of " + ", ".join(LANGUAGES)),
    "shapes": (
        lambda v: isinstance(v, (list, tuple)) and len(v) > 0,
        "a non-empty list of shapes, e.g. shapes=[(8192, 4096), (1024, 1024)]",
    ),
    "device": (lambda v: v in DEVICES, "one of " + ", ".join(DEVICES)),
    "init_inputs": (
        lambda v: isinstance(v, (list, tuple)) or callable(v),
        "a tuple of constructor arguments for nn.Module kernels",
    ),
    "trials": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
    "dtype": (
        lambda v: _floating_dtype_name(v) is not None,
        "a floating torch dtype the nn.Module kernel and reference are cast to after they are "
        "built, e.g. dtype=torch.bfloat16 (or the name, dtype='bfloat16')",
    ),
    "streams": (
        lambda v: v in STREAM_MODES,
        "'any' for a kernel that really launches work on streams of its own and does not join "
        "them (timed with a device-wide synchronize after every call), or 'current'",
    ),
}


def did_you_mean(keyword: str) -> str:
    """`keyword`, with the marker keyword it is closest to: "refrence (did you mean
    reference?)"; a case-only slip ("Inputs") counts too."""
    import difflib

    known = list(_MARKER_KEYWORDS)
    close = [k for k in known if k == keyword.lower()] or difflib.get_close_matches(
        keyword.lower(), known, n=1, cutoff=0.6
    )
    return f"{keyword} (did you mean {close[0]}?)" if close else keyword


@dataclass(frozen=True)
class MarkerOptions:
    """The validated keywords of one `@pytest.mark.kernelpro(...)`."""

    reference: Any
    inputs: Callable[..., Any]
    rtol: float | None = None
    atol: float | None = None
    flops: float | None = None
    bytes: float | None = None
    min_roofline: float | None = None
    threshold: float | None = None
    source: str | None = None
    language: str | None = None
    shapes: tuple[Any, ...] | None = None
    device: str | None = None
    init_inputs: Any = ()
    trials: int | None = None
    dtype: str | None = None  # nn.Module kernels: the dtype both modules are cast to
    streams: str | None = None  # STREAM_MODES; None: "current"

    @classmethod
    def from_marker(
        cls, args: Sequence[Any], kwargs: dict[str, Any], *, kernel_name: str
    ) -> MarkerOptions:
        """Validate marker arguments; every problem names the kernel, the value and the fix."""
        where = f"@pytest.mark.kernelpro on {kernel_name!r}"
        if args:
            raise KernelproConfigError(
                f"{where}: positional arguments {args!r} are not accepted; "
                "pass keywords, e.g. kernelpro(reference=..., inputs=...)"
            )
        unknown = sorted(set(kwargs) - set(_MARKER_KEYWORDS))
        if unknown:
            raise KernelproConfigError(
                f"{where}: unknown keyword(s) {', '.join(map(did_you_mean, unknown))}; valid "
                "keywords are " + ", ".join(_MARKER_KEYWORDS)
            )
        for required in ("reference", "inputs"):
            if kwargs.get(required) is None:
                raise KernelproConfigError(
                    f"{where}: missing {required}=; pass {_MARKER_KEYWORDS[required][1]}"
                )
        for key, value in kwargs.items():
            check, expected = _MARKER_KEYWORDS[key]
            if value is not None and not check(value):
                raise KernelproConfigError(
                    f"{where}: {key}={value!r} is invalid; {key} must be {expected}"
                )
        values = dict(kwargs)
        if values.get("shapes") is not None:
            values["shapes"] = tuple(values["shapes"])
        if values.get("source") is not None:
            values["source"] = str(values["source"])
        if values.get("dtype") is not None:
            values["dtype"] = _floating_dtype_name(values["dtype"])
        return cls(**values)


def shape_id(shape: Any) -> str:
    """`(8192, 4096)` -> "8192x4096"; `{"M": 64}` -> "M=64"; anything else -> str()."""
    if isinstance(shape, (tuple, list)) and all([isinstance(d, int) for d in shape]):
        return "x".join(map(str, shape))
    if isinstance(shape, dict):
        return ",".join(f"{k}={shape_id(v)}" for k, v in shape.items())
    text = str(shape)
    return re.sub(r"\s+", "", text)


@functools.lru_cache(maxsize=256)
def _signature(factory: Callable[..., Any]) -> tuple[frozenset[str], int, bool] | None:
    """The factory's parameter names ("**" for a `**kwargs`), their number, and whether it
    takes `*args`; None without a signature. Fixed for the session: read once per factory."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    kinds = {p.kind for p in params.values()}
    names = set(params) | ({"**"} if inspect.Parameter.VAR_KEYWORD in kinds else set())
    return frozenset(names), len(params), inspect.Parameter.VAR_POSITIONAL in kinds


def call_input_factory(
    factory: Callable[..., Any], device: str, seed: int, shape: Any = None
) -> tuple[Any, ...]:
    """Build one fresh input set: seeds torch, passes the device, and `shape`/`generator`
    when the factory accepts them. Returns a tuple."""
    import torch

    try:
        signature = _signature(factory)
    except TypeError:  # an unhashable callable object: read each time
        signature = _signature.__wrapped__(factory)
    names, count, var_positional = signature or (frozenset(), 0, False)
    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {}
    if shape is not None:
        if not {"shape", "**"} & names:
            raise KernelproConfigError(
                f"input factory {getattr(factory, '__name__', factory)!r} takes no 'shape' "
                f"argument, but the marker gives shapes; define it as inputs(device, shape)"
            )
        kwargs["shape"] = shape
    if {"generator", "**"} & names:
        generator = torch.Generator(device=torch.device(device).type)
        generator.manual_seed(seed)
        kwargs["generator"] = generator
    takes_device = signature is None or count > len(kwargs) or var_positional
    result = factory(device, **kwargs) if takes_device else factory(**kwargs)
    problem = None if type(result) is tuple else wrong_inputs_return(result)
    if problem is not None:
        raise KernelproConfigError(
            f"input factory {factory_name(factory)} returned {problem}; it must return a "
            "tuple of the kernel's positional arguments (tensors), e.g. `return (x, w)`"
        )
    if isinstance(result, list):
        result = tuple(result)
    if not isinstance(result, tuple):
        result = (result,)
    return result


def factory_name(factory: Callable[..., Any]) -> str:
    """`name (file.py:line)` of an inputs factory, for its errors."""
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", repr(factory))
    code = getattr(factory, "__code__", None)
    if code is None:
        return repr(name)
    return f"{name!r} ({Path(code.co_filename).name}:{code.co_firstlineno})"


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def wrong_inputs_return(result: Any) -> str | None:
    """What is wrong with an inputs factory's return value, in words, or None when it can be
    the kernel's arguments: a tuple or list (of tensors and other arguments, None for an
    optional one) or one tensor or scalar; not None, a dict, a string, a set or a generator."""
    if result is None:
        return "None (a missing `return`?)"
    if isinstance(result, Mapping):
        keys = ", ".join(repr(k) for k in list(result)[:4])
        return f"a {type(result).__name__} with keys {keys}: keyword inputs are not passed"
    if isinstance(result, (str, bytes, set, frozenset)) or isinstance(result, Iterator):
        return f"a {type(result).__name__} ({_preview(result)})"
    return None


@dataclass
class Problem:
    """One kernel at one shape: what to run, what to compare with, how to make inputs."""

    name: str  # base kernel name
    kernel_factory: Callable[[str], Callable[..., Any]]  # device -> kernel callable
    reference_factory: Callable[[str], Callable[..., Any]]  # device -> reference callable
    input_factory: Callable[..., Any]
    kind: str  # function | module | kernelbench
    source_file: str
    # The marker's or the file's language; None: detected from `language_source` (the
    # kernel) when first asked, so collection reads no source of a kernel it does not run.
    language_given: str | None = None
    language_source: Any = field(default=None, repr=False)
    shape: Any = None
    rtol: float | None = None
    atol: float | None = None
    flops: float | None = None
    bytes: float | None = None
    min_roofline: float | None = None
    threshold: float | None = None
    device_given: str | None = None  # cuda | cpu | any; None: by the language
    trials: int | None = None
    # The module constructors' arguments (marker `init_inputs=`): the factories apply them;
    # kept so the sandbox's KernelBench view can say them in `get_init_inputs()`.
    init_inputs: Any = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def language(self) -> str:
        if self.language_given is not None:
            return self.language_given
        source = self.language_source
        return "pytorch" if source is None else detect_language_of(source)

    @property
    def device_preference(self) -> str:
        """Where the kernel may run: as given, else a Triton or CUDA kernel needs a GPU."""
        if self.device_given is not None:
            return self.device_given
        return "cuda" if self.language in ("triton", "cuda") else "any"

    # Fixed once the problem is made (`at_shapes` makes a new one per shape): read by the item,
    # its record and every message, computed on the first read.
    @functools.cached_property
    def shape_id(self) -> str | None:
        return None if self.shape is None else shape_id(self.shape)

    @functools.cached_property
    def display_name(self) -> str:
        return self.name if self.shape is None else f"{self.name}[{self.shape_id}]"

    def make_inputs(self, device: str, seed: int) -> tuple[Any, ...]:
        return call_input_factory(self.input_factory, device, seed, self.shape)

    def instantiate(self, device: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """(kernel, reference) on `device`; modules are built with one seed so parameters match."""
        reference = self.reference_factory(device)
        if getattr(self.kernel_factory, "takes_reference", False):
            return self.kernel_factory(device, reference=reference), reference  # type: ignore[call-arg]
        return self.kernel_factory(device), reference

    def at_shapes(self) -> list[Problem]:
        shapes = self.extra.get("shapes")
        if not shapes:
            return [self]
        return [
            replace(self, shape=s, extra={k: v for k, v in self.extra.items() if k != "shapes"})
            for s in shapes
        ]


def _is_module_class(obj: Any) -> bool:
    if not inspect.isclass(obj):
        return False
    torch_nn = sys.modules.get("torch.nn")
    return torch_nn is not None and issubclass(obj, torch_nn.Module)


def _module_factory(
    obj: Any, init_inputs: Any, dtype: str | None
) -> Callable[[str], Callable[..., Any]]:
    """device -> module: the class instantiated (seeded, on the CPU), moved to the device
    (`build.build_module`) and cast to `dtype` when the marker gives one."""

    def build(device: str) -> Callable[..., Any]:
        from pytest_kernelpro.problem.build import build_module

        built = build_module(obj, init_inputs, device, on_device=False)
        if dtype is not None:
            import torch

            built = built.to(getattr(torch, dtype))
        return built

    return build


def sharing_weights(
    kernel_factory: Callable[[str], Any], reference_factory: Callable[[str], Any]
) -> Callable[..., Any]:
    """A kernel factory (device -> module) whose module gets the reference module's weights
    (`build.share_weights`); `takes_reference`: the reference already built is passed in."""

    def kernel(device: str, reference: Any = None) -> Any:
        from pytest_kernelpro.problem.build import share_weights  # at build time, not collection

        built = kernel_factory(device)
        share_weights(reference_factory(device) if reference is None else reference, built)
        return built

    kernel.takes_reference = True  # type: ignore[attr-defined]
    return kernel


def problem_from_marker(
    obj: Any, options: MarkerOptions, *, name: str, source_file: str
) -> Problem:
    """A Problem for a marked function or nn.Module class."""
    kernel_is_module = _is_module_class(obj)
    reference_is_module = _is_module_class(options.reference)
    kind = "module" if kernel_is_module else "function"
    if options.dtype is not None and kind != "module":
        raise KernelproConfigError(
            f"kernel {name!r}: dtype={options.dtype!r} casts nn.Module kernels and references "
            f"after they are built, and {name} is a function; make its inputs in "
            f"{options.dtype} instead (the inputs= factory)"
        )
    reference, init_inputs, dtype = options.reference, options.init_inputs, options.dtype
    # device -> callable: a function is itself on every device.
    kernel_factory: Callable[[str], Any] = (
        _module_factory(obj, init_inputs, dtype) if kernel_is_module else lambda device: obj
    )
    reference_factory: Callable[[str], Any] = (
        _module_factory(reference, init_inputs, dtype)
        if reference_is_module
        else lambda device: reference
    )
    if kernel_is_module and reference_is_module:
        # The kernel gets the reference module's parameters (`problem.build.share_weights`),
        # so a patched kernel whose candidate named its weights differently checks the same.
        kernel_factory = sharing_weights(kernel_factory, reference_factory)
    return Problem(
        name=name,
        kernel_factory=kernel_factory,
        reference_factory=reference_factory,
        input_factory=options.inputs,
        kind=kind,
        source_file=str(options.source or source_file),
        language_given=options.language,
        language_source=obj,
        rtol=options.rtol,
        atol=options.atol,
        flops=options.flops,
        bytes=options.bytes,
        min_roofline=options.min_roofline,
        threshold=options.threshold,
        device_given=options.device,
        trials=options.trials,
        init_inputs=options.init_inputs if kind == "module" else (),
        extra={
            **({"shapes": options.shapes} if options.shapes else {}),
            **({"streams": options.streams} if options.streams else {}),
        },
    )


@dataclass(frozen=True)
class ProblemLocator:
    """Enough to rebuild a Problem in another process: file, object name, shape index."""

    path: str
    qualname: str
    shape_index: int | None = None


def marker_of(obj: Any) -> Any | None:
    """The `kernelpro` Mark stored on a decorated object, if any."""
    for mark in getattr(obj, "pytestmark", []) or []:
        if getattr(mark, "name", None) == MARKER_NAME:
            return mark
    return None
