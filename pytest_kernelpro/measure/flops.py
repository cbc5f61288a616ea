"""FLOPs, bytes, category and peak of one aten op (the counting rules of the roofline), and the
recorder that prices every op a reference runs with them.

GEMM, convolution and attention FLOPs come from torch's own registry
(`torch.utils.flop_counter.flop_registry`, what FlopCounterMode counts). Everything else
uses the formulas below, per element of the tensor named:

==============================  ===========================================================
elementwise (pointwise tag)     1 per output element, transcendental ops (exp, tanh, gelu,
                                ...) too: the roofline prices an op, not its instruction mix
reduction (sum, mean, amax...)  1 per input element (n - 1 adds per row of n, taken as n)
var / std (+ _mean)             4 per input element (mean, subtract, square, sum)
norm / linalg_vector_norm       2 per input element (square, sum)
logsumexp                       4 per input element (max, subtract, exp, sum)
softmax, log_softmax            5 per element (max, subtract, exp, sum, divide/subtract)
layer / group norm, batch norm  5 per element (mean, subtract, square, sum, scale by rstd)
  (training statistics)         + 1 per element for a weight, + 1 for a bias
batch norm (running stats)      2 per element (subtract, scale) + weight + bias
rms norm (fused)                3 per element (square, sum, scale) + 1 for a weight
cumsum / cumprod / cummax/min   1 per element; logcumsumexp 3 per element
losses                          mse / l1 3, smooth_l1 / huber 4, kl_div 3, binary
                                cross-entropy 6 (with logits 7) per element; nll_loss 1
                                per target
attention without a registry    torch's SDPA formula: 2*B*H*Lq*Lk*(D + Dv)
  entry (CPU flash kernel)
copies, casts, cat, gather,     0 FLOPs (bytes only)
  fills, random fills
views, empty allocations        no cost at all (not listed)
anything else                   unpriced: 0 FLOPs counted, and the op named in the
                                analysis's `unpriced_ops` (never a silent zero): give the
                                marker `flops=` or answer the pytest_kernelpro_op_cost hook
==============================  ===========================================================

An op's ("unfused") bytes: its distinct input tensors read plus its outputs written, a
broadcast dimension once; a write-only op's first argument and `out=` are not read.
`make_recorder` prices every op the reference runs (the op-cost hook first); `roofline`
combines the costs with the graph's bytes and the ceilings.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.measure.devices import DeviceSpec


# The note of an op no formula prices (`op_flops`): the recorder names such ops as unpriced.
NO_FORMULA = "no FLOP formula; counted 0 (give flops= or a hook)"

CATEGORIES: tuple[str, ...] = tuple(
    "gemm conv attention softmax norm reduction elementwise scan copy other".split()
)


@dataclass(frozen=True)
class OpCost:
    """The cost of one aten op (or, aggregated, of all calls of one op at one peak)."""

    op: str
    category: str
    flops: float
    bytes_unfused: float
    dtype: str
    peak_key: str
    count: int = 1


_GEMM = {
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "matmul",
    "linear", "_int_mm", "_scaled_mm", "_grouped_mm", "_scaled_grouped_mm", "einsum",
}  # fmt: skip
_CONV_PREFIXES = ("conv", "_conv", "cudnn_conv", "mkldnn_conv", "miopen_conv", "_slow_conv",
                  "slow_conv", "thnn_conv")  # fmt: skip
_SOFTMAX = {"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax",
            "_masked_softmax"}  # fmt: skip
_NORM = {
    "native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "_fused_rms_norm",
    "rms_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "instance_norm",
    "_batch_norm_with_update", "_batch_norm_no_update", "_batch_norm_impl_index",
}  # fmt: skip
_REDUCTION_PER_ELEMENT = {
    "sum": 1, "nansum": 1, "mean": 1, "nanmean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1,
    "aminmax": 1, "prod": 1, "any": 1, "all": 1, "argmax": 1, "argmin": 1,
    "count_nonzero": 1, "var": 4, "std": 4, "var_mean": 4, "std_mean": 4, "norm": 2,
    "linalg_vector_norm": 2, "logsumexp": 4,
    # losses (per element of the input)
    "mse_loss": 3, "l1_loss": 3, "smooth_l1_loss": 4, "huber_loss": 4, "kl_div": 3,
    "binary_cross_entropy": 6, "binary_cross_entropy_with_logits": 7, "soft_margin_loss": 4,
}  # fmt: skip
_NLL = {"nll_loss_forward", "nll_loss2d_forward", "nll_loss", "nll_loss_nd"}
_SCAN_PER_ELEMENT = {"cumsum": 1, "cumprod": 1, "cummax": 1, "cummin": 1, "_cummax_helper": 1,
                     "_cummin_helper": 1, "logcumsumexp": 3}  # fmt: skip
_COPY = {
    "copy_", "_to_copy", "clone", "contiguous", "cat", "stack", "index_select", "gather",
    "scatter", "scatter_", "scatter_add", "scatter_add_", "index", "_unsafe_index", "index_put",
    "index_put_", "_index_put_impl_", "embedding", "_copy_from", "_copy_from_and_resize",
    "fill", "fill_", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like",
    "new_zeros", "new_ones", "new_full", "scalar_tensor", "arange", "linspace", "randn",
    "rand", "randint", "randn_like", "rand_like", "randint_like", "normal", "normal_",
    "uniform_", "bernoulli", "bernoulli_", "random_", "exponential_", "flip", "roll",
    "repeat", "tril", "triu", "constant_pad_nd", "narrow_copy", "slice_scatter",
    "select_scatter", "diagonal_scatter", "masked_select", "take", "lift_fresh_copy",
    "_local_scalar_dense", "masked_scatter", "index_copy", "index_fill", "index_add", "sort",
    "topk", "unique", "_unique2", "nonzero", "view_copy", "permute_copy", "expand_copy",
    "t_copy", "transpose_copy", "unsqueeze_copy", "squeeze_copy", "alias_copy",
}  # fmt: skip
# Ops that read of their first argument only the elements they gather (`gathered_source`).
_GATHERS = {"index_select", "embedding", "take", "gather", "index", "_unsafe_index"}
# Ops whose first argument is only written (not read).
_WRITE_ONLY_SELF = {"copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_",
                    "exponential_", "index_put_", "_index_put_impl_", "scatter_"}  # fmt: skip
# Ops that move no bytes: views and allocations without a fill.
_NO_COST = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "detach", "lift_fresh",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "empty_permuted", "resize_", "set_", "as_strided", "t", "expand", "unsqueeze", "squeeze",
    "permute", "transpose", "slice", "select", "split", "split_with_sizes", "unbind",
    "chunk", "unfold", "diagonal", "narrow", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "_assert_async", "_assert_scalar", "record_stream", "_to_dense",
}  # fmt: skip
_EXTRA_ELEMENTWISE = {"native_dropout", "dropout", "_prelu_kernel", "prelu", "glu",
                      "_masked_scale", "threshold", "where", "masked_fill", "clamp"}  # fmt: skip

_DTYPE_CPU_KEY = {"float64": "fp64", "bfloat16": "bf16", "float16": "fp16"}


@functools.lru_cache(maxsize=1024)
def base_name(func: Any) -> str:
    """The aten op's base name without namespace or overload: aten.mm.default -> "mm" (read
    once per op: the recorder's rules ask it of each op several times)."""
    schema = getattr(func, "_schema", None)
    name = schema.name if schema is not None else str(func)
    return name.split("::")[-1].split(".")[0]


def is_no_cost(func: Any) -> bool:
    """A view or a bare allocation: it reads and writes nothing."""
    return bool(getattr(func, "is_view", False)) or base_name(func) in _NO_COST


def op_category(func: Any) -> str:
    """The roofline category of an aten op (see the module docstring's table)."""
    import torch

    name = base_name(func)
    if name in _GEMM:
        return "gemm"
    if name.startswith(_CONV_PREFIXES):
        return "conv"
    if "attention" in name:
        return "attention"
    if name in _SOFTMAX:
        return "softmax"
    if name in _NORM:
        return "norm"
    if name in _REDUCTION_PER_ELEMENT or name in _NLL:
        return "reduction"
    if name in _SCAN_PER_ELEMENT:
        return "scan"
    if name in _COPY or name.endswith("_copy"):
        return "copy"
    if torch.Tag.pointwise in getattr(func, "tags", ()) or name.rstrip("_") in _EXTRA_ELEMENTWISE:
        return "elementwise"
    return "other"


def iter_tensors(obj: Any) -> list[Any]:
    """Every torch.Tensor inside nested args/kwargs/outputs (pytree leaves), in order."""
    import torch
    from torch.utils._pytree import tree_flatten

    found = []
    for leaf in tree_flatten(obj)[0]:
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
    return found


def tensor_bytes(t: Any) -> int:
    """Bytes a tensor occupies once: a broadcast (stride-0) dimension counts once."""
    if t.numel() == 0:
        return 0
    unique = 1  # a loop, not a generator: this runs for every tensor of every operator
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            unique *= size
    return int(unique) * t.element_size()


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> float:
    """Bytes read (distinct input tensors) plus bytes written (distinct outputs)."""
    kwargs = dict(kwargs)
    out_kw = kwargs.pop("out", None)
    read_args: Any = args
    if base_name(func) in _WRITE_ONLY_SELF and args:
        read_args = args[1:]
    reads = {
        (storage_key(t), view_key(t)): tensor_bytes(t) for t in iter_tensors((read_args, kwargs))
    }
    writes = {(storage_key(t), view_key(t)): tensor_bytes(t) for t in iter_tensors((out, out_kw))}
    return float(sum(reads.values()) + sum(writes.values()))


def compute_dtype(category: str, tensors: Sequence[Any], outs: Sequence[Any]) -> str:
    """The dtype that decides the unit: the first floating (or int8/fp8) input tensor, else
    the first output tensor's."""
    if category in ("gemm", "conv", "attention"):
        for t in tensors:
            if t.dtype.is_floating_point or str(t.dtype) in ("torch.int8", "torch.uint8"):
                return str(t.dtype).removeprefix("torch.")
    for t in tensors:
        if t.dtype.is_floating_point or t.dtype.is_complex:
            return _real_dtype(t)
    if outs:
        return _real_dtype(outs[0])
    return str(tensors[0].dtype).removeprefix("torch.") if tensors else "float32"


def _real_dtype(t: Any) -> str:
    """The dtype's name, a complex one's real part's (the units it runs on)."""
    name = str(t.dtype).removeprefix("torch.")
    return {"complex64": "float32", "complex128": "float64", "complex32": "float16"}.get(name, name)


def _sdpa_flops(args: tuple) -> float:
    q, k, v = args[0], args[1], args[2]
    return 2.0 * math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])


def _gemm_fallback(name: str, args: tuple, out: Any) -> float | None:
    tensors, outs = iter_tensors(args), iter_tensors(out)
    if name in ("dot", "vdot") and tensors:
        return 2.0 * int(tensors[0].numel())
    if name in ("mv", "addmv") and len(tensors) >= 2:
        return 2.0 * int(tensors[-2].numel())
    if name in ("_int_mm", "_grouped_mm", "_scaled_grouped_mm") and len(tensors) >= 2 and outs:
        return 2.0 * int(outs[0].numel()) * tensors[0].shape[-1]
    return None


def _norm_flops(name: str, args: tuple) -> float:
    x = args[0]
    n = float(x.numel())

    def present(i: int) -> int:
        return int(len(args) > i and _is_tensor(args[i]))

    if name in ("_fused_rms_norm", "rms_norm"):
        return n * (3 + present(2))
    if "layer_norm" in name:  # (input, normalized_shape, weight, bias, eps)
        return n * (5 + present(2) + present(3))
    affine = present(1) + present(2)  # batch/group norm: (input, weight, bias, ...)
    if "batch_norm" in name:
        # Training computes the batch statistics; every schema passes `training` as a bool
        # after the tensors (the no_training/no_update variants use the running stats).
        training = name == "_batch_norm_with_update" or (
            "no_training" not in name
            and "no_update" not in name
            and any(a is True for a in args[3:])
        )
        return n * ((5 if training else 2) + affine)
    return n * (5 + affine)


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def op_flops(
    func: Any, category: str, args: tuple, kwargs: dict, out: Any
) -> tuple[float, str | None]:
    """(FLOPs, note) of one op call; the note says when no formula applied."""
    from torch.utils.flop_counter import flop_registry

    packet = getattr(func, "_overloadpacket", None)
    name = base_name(func)
    if category in ("gemm", "conv", "attention"):
        if packet is not None and packet in flop_registry:
            return float(flop_registry[packet](*args, **kwargs, out_val=out)), None
        if category == "attention" and len(args) >= 3 and all(_is_tensor(a) for a in args[:3]):
            return _sdpa_flops(args), f"{func}: torch's SDPA formula 2*B*H*Lq*Lk*(D+Dv)"
        fallback = _gemm_fallback(name, args, out) if category == "gemm" else None
        if fallback is not None:
            return fallback, None
        return 0.0, f"{func}: {NO_FORMULA}"
    tensors, outs = iter_tensors(args), iter_tensors(out)
    first_in = tensors[0] if tensors else None
    first_out = outs[0] if outs else None
    if category == "softmax":
        return 5.0 * int(first_in.numel()), None
    if category == "norm":
        return float(_norm_flops(name, args)), None
    if category == "reduction":
        if name in _NLL:
            target = args[1] if len(args) > 1 and _is_tensor(args[1]) else first_in
            return float(target.numel()), None
        return float(_REDUCTION_PER_ELEMENT.get(name, 1) * int(first_in.numel())), None
    if category == "scan":
        return float(_SCAN_PER_ELEMENT.get(name, 1) * int(first_in.numel())), None
    if category == "elementwise":
        ref = first_out if first_out is not None else first_in
        return float(ref.numel()) if ref is not None else 0.0, None
    if category == "copy":
        return 0.0, None
    return 0.0, f"{func}: {NO_FORMULA}"


def select_peak_key(
    op_category: str,
    dtype: str,
    device_type: str,
    allow_tf32: bool,
    allow_cudnn_tf32: bool,
    spec: DeviceSpec | None,
) -> str:
    """The ceiling key whose rate the op runs at. CUDA: matrix work on its dtype's tensor
    cores (fp32 on TF32 when torch's cuBLAS/cuDNN flag allows it, else "fp32"; fp64 on DMMA
    unless the spec lacks it); the rest on CUDA cores ("fp64" or "fp32": half types compute
    in fp32 registers). CPU: GEMM and convolution at their dtype's matmul rate, every other
    op at fp32's ("fp64" for float64): CPU kernels compute half types in fp32 too."""
    if device_type != "cuda":
        if op_category in ("gemm", "conv"):
            return _DTYPE_CPU_KEY.get(dtype, "fp32")
        return "fp64" if dtype == "float64" else "fp32"
    if op_category in ("gemm", "conv", "attention"):
        if dtype == "float32":
            tf32 = allow_cudnn_tf32 if op_category == "conv" else allow_tf32
            return "tf32_tensor" if tf32 else "fp32"
        if dtype == "bfloat16":
            return "bf16_tensor"
        if dtype == "float16":
            return "fp16_tensor"
        if dtype.startswith("float8"):
            return "fp8_tensor"
        if dtype in ("int8", "uint8"):
            return "int8_tensor"
        if dtype == "float64":
            if spec is not None and "fp64_tensor" not in spec.peak_flops:
                return "fp64"
            return "fp64_tensor"
    return "fp64" if dtype == "float64" else "fp32"


# PyTorch's memory-efficient SDPA runs fp32 as three TF32 tensor-core MMAs per product
# (CUTLASS's OpMultiplyAddFastF32 on sm80+), whatever torch's TF32 flags say.
TF32X3_KEY = "tf32x3_tensor"
TF32X3_MMAS = 3


def backend_peak_key(
    op_name: str, key: str, dtype: str, device_type: str
) -> tuple[str, str | None]:
    """The peak key of the backend an op dispatched to (SDPA's backends are their own aten
    ops), where the op-level rule cannot know it, and a note saying why."""
    if device_type == "cuda" and dtype == "float32" and "efficient_attention" in op_name:
        return TF32X3_KEY, (
            f"{op_name}: SDPA chose the memory-efficient backend, whose fp32 kernel runs on "
            "tensor cores as 3xTF32 (three TF32 MMAs per product): priced at a third of the "
            "TF32 tensor-core rate, not at the FP32 CUDA-core rate"
        )
    return key, None


def _read_flag(new: Callable[[], str], legacy: Callable[[], bool]) -> bool:
    """A TF32 flag through torch's new fp32_precision API, else the legacy boolean."""
    try:
        value = new()
        if value in ("tf32", "ieee"):
            return value == "tf32"
    except (AttributeError, RuntimeError):
        pass
    try:
        return bool(legacy())
    except (AttributeError, RuntimeError):  # torch raises when both APIs were mixed
        return False


def tf32_flags() -> tuple[bool, bool]:
    """(cuBLAS matmul TF32 allowed, cuDNN convolution TF32 allowed) as torch is set now."""
    import torch

    backends = torch.backends

    def matmul_new() -> str:
        value = backends.cuda.matmul.fp32_precision
        return backends.fp32_precision if value == "none" else value

    def conv_new() -> str:
        value = backends.cudnn.conv.fp32_precision
        if value == "none":
            value = backends.cudnn.fp32_precision
        return backends.fp32_precision if value == "none" else value

    return (
        _read_flag(matmul_new, lambda: backends.cuda.matmul.allow_tf32),
        _read_flag(conv_new, lambda: backends.cudnn.allow_tf32),
    )


OpCostHook = Callable[[str, tuple, dict, Any], "OpCost | None"]


def make_recorder(
    hook: OpCostHook | None, allow_tf32: bool, allow_cudnn_tf32: bool, spec: DeviceSpec | None
) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        """Runs every op, then prices it (the hook first, the built-in formulas after)."""

        def __init__(self) -> None:
            super().__init__()
            self.costs: list[OpCost] = []
            self.notes: list[str] = []
            self.unpriced: list[str] = []  # ops no formula prices
            self.hooked = 0
            self.hook_error: BaseException | None = None
            # Tensors read that no op produced (weights, constants): graph inputs.
            self.external: dict[Any, Any] = {}
            self.produced: set[Any] = set()
            # Bytes gathered per storage, and the storages some op read whole.
            self.gathered: dict[Any, float] = {}
            self.read_whole: set[Any] = set()

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if self.hook_error is None:
                self._track(func, args, kwargs, out)
                self._price(func, args, kwargs, out)
            return out

        def _track(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
            source = gathered_source(func, args, out, self.gathered)
            for t in iter_tensors((args, kwargs)):
                key = storage_key(t)
                if t is not source:
                    self.read_whole.add(key)
                if key not in self.produced:
                    self.external.setdefault((key, view_key(t)), t)
            external_storages = {k for k, _ in self.external}
            for t in iter_tensors(out):
                key = storage_key(t)
                if key not in external_storages:  # a view or in-place write of an input is not new
                    self.produced.add(key)

        def _price(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
            name = str(func)
            if hook is not None:
                try:
                    cost = hook(name, args, kwargs, out)
                except Exception as exc:  # the user's hook: report it as theirs
                    self.hook_error = exc
                    return
                if cost is not None:
                    if not isinstance(cost, OpCost):
                        self.hook_error = TypeError(
                            f"op-cost hook returned {type(cost).__name__} for {name}; "
                            "return an OpCost or None"
                        )
                        return
                    self.costs.append(cost)
                    self.hooked += 1
                    return
            if is_no_cost(func):
                return
            try:
                category = op_category(func)
                flops, note = op_flops(func, category, args, kwargs, out)
                tensors, outs = iter_tensors(args), iter_tensors(out)
                dtype = compute_dtype(category, tensors, outs)
                # The op's first tensor's device type ("cuda", "cpu", ...).
                first = tensors or outs
                device_type = str(first[0].device.type) if first else "cpu"
                key = select_peak_key(
                    category, dtype, device_type, allow_tf32, allow_cudnn_tf32, spec
                )
                key, backend_note = backend_peak_key(name, key, dtype, device_type)
                if backend_note:
                    self.notes.append(backend_note)
                nbytes = op_bytes(func, args, kwargs, out)
            except Exception as exc:  # an odd schema must not break the user's reference
                self.notes.append(f"{name}: not priced ({type(exc).__name__}: {exc})")
                self.unpriced.append(name)
                return
            if note:
                self.notes.append(note)
                if note.endswith(NO_FORMULA):
                    self.unpriced.append(name)
            self.costs.append(OpCost(name, category, flops, nbytes, dtype, key))

    return _Recorder()


def gathered_source(func: Any, args: tuple, out: Any, gathered: dict[Any, float]) -> Any:
    """The source a `_GATHERS` op reads in part, the bytes it needs added to `gathered`;
    None for any other op."""
    name = base_name(func)
    if name not in _GATHERS or not args:  # every other op: nothing more to look at
        return None
    source = args[0]
    outs = list(iter_tensors(out))
    if not hasattr(source, "element_size") or not outs or source.dim() == 0:
        return None
    # The distinct index values say which rows (or elements: `take`) are read; `gather` and
    # advanced indexing read at most their output's elements.
    index, dim = None, None
    if name == "index_select":
        index, dim = args[2], int(args[1])
    elif name == "embedding":
        index, dim = args[1], 0
    elif name == "take":
        index = args[1]
    if hasattr(index, "unique") and not (index.dtype.is_floating_point or index.dtype.is_complex):
        # each distinct row (element) is read once; repeats come from cache
        per_index = 1 if dim is None else source.numel() // max(1, source.shape[dim])
        needed = float(index.unique().numel() * per_index * source.element_size())
    else:
        needed = float(sum(t.numel() for t in outs) * source.element_size())
    key = storage_key(source)
    gathered[key] = gathered.get(key, 0.0) + needed
    return source


def price_upcasts_at_io_dtype(
    ops: list[OpCost] | tuple[OpCost, ...],
    inputs: Sequence[Any],
    output: Any,
    device_type: str,
    allow_tf32: bool,
    allow_cudnn_tf32: bool,
    spec: DeviceSpec | None,
    notes: list[str],
) -> tuple[OpCost, ...]:
    """A reference upcasting to float64 for accuracy (narrower inputs and outputs): its
    float64 ops priced at the narrower type's rate, the kernel's work."""
    io = [
        t for t in (*iter_tensors(list(inputs)), *iter_tensors(output)) if t.dtype.is_floating_point
    ]
    io_dtypes = {str(t.dtype).removeprefix("torch.") for t in io}
    if not io_dtypes or "float64" in io_dtypes:
        return tuple(ops)
    io_dtype = max(io_dtypes, key=lambda d: _DTYPE_WIDTH.get(d, 4))
    repriced: list[OpCost] = []
    changed = False
    for op in ops:
        if op.dtype == "float64":
            flags = (allow_tf32, allow_cudnn_tf32, spec)
            key = select_peak_key(op.category, io_dtype, device_type, *flags)
            op, changed = replace(op, dtype=io_dtype, peak_key=key), True
        repriced.append(op)
    if changed:
        notes.append(
            f"the reference computes in float64 but takes and returns {io_dtype}: its float64 "
            f"ops are priced at the {io_dtype} rate the kernel's work runs at"
        )
    return tuple(repriced)


_DTYPE_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def storage_key(t: Any) -> Any:
    try:
        return (str(t.device), t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, AttributeError):
        return ("id", id(t))


def view_key(t: Any) -> tuple[Any, ...]:
    return (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def aggregate(costs: Sequence[OpCost]) -> tuple[OpCost, ...]:
    merged: dict[tuple[str, str], OpCost] = {}
    for cost in costs:
        key = (cost.op, cost.peak_key)
        prev = merged.get(key)
        merged[key] = cost if prev is None else replace(
            prev, flops=prev.flops + cost.flops, count=prev.count + cost.count,
            bytes_unfused=prev.bytes_unfused + cost.bytes_unfused,
        )  # fmt: skip
    return tuple(merged.values())
