"""Worker-side anti-cheating building blocks: exception classification, output-structure
helpers the guards use, and the guards themselves (calls into the reference, forbidden ops,
side streams, inputs written or aliased).

What is not the sandbox's own comes from `measure/`, so the gate and the sandbox decide
alike: the correctness rule and its comparison (`measure.output_rule`), output poisoning
and input copies (`measure.correctness_check`) and timing (`measure.timing`). Imported
only inside the sandbox worker (and by tests), so torch is imported at the top. `harness.py`
puts them together into the KernelBench pipeline.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_kernelpro.measure.timing.streams import StreamWatch

# Reference-module names that are part of the problem format, not of the computation.
PROBLEM_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs", "get_inputs_variants"})


def classify_exception(exc: BaseException) -> str:
    """One line naming an exception, with out-of-memory and CUDA errors called out."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    lowered = str(exc).lower()
    oom_types = tuple(
        t
        for t in (
            getattr(torch, "OutOfMemoryError", None),
            getattr(torch.cuda, "OutOfMemoryError", None),
        )
        if t is not None
    )
    if (
        isinstance(exc, MemoryError)
        or isinstance(exc, oom_types)
        or ("out of memory" in lowered or "can't allocate memory" in lowered)
    ):
        return f"out of memory: {name}: {text}"[:400]
    if "illegal memory access" in lowered or "illegal address" in lowered:
        return f"illegal memory access: {name}: {text}"[:400]
    if "cuda error" in lowered or name == "AcceleratorError":
        return f"CUDA error: {name}: {text}"[:400]
    return f"{name}: {text}"[:400]


# ----- outputs -----


def flatten(value: Any) -> list[Any]:
    """Leaves of a (nested) tuple/list/dict output, in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in flatten(value[key])]
    return [value]


def flat_paths(value: Any, path: str = "output") -> list[str]:
    """The path of each leaf `flatten` returns, in its order, named as the correctness rule
    names the leaves of the unflattened output (`measure.output_rule.leaves_of`)."""
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in flat_paths(item, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [
            p for key in sorted(value, key=str) for p in flat_paths(value[key], f"{path}[{key!r}]")
        ]
    return [path]


DIGEST_CHUNK = 2**22  # bytes of an output read at once for its digest (one device copy each)
# Per process, secret to nothing: the fingerprint only has to give equal bytes equal values
# (a deterministic function of the bytes) and different bytes different values by chance
# alone. Drawn at random so that no fixed set of outputs collides in every process.
_FINGERPRINT_SEEDS = tuple(int.from_bytes(os.urandom(7), "little") for _ in range(2))
FINGERPRINT_CHUNK = 2**24  # 8-byte words hashed at once (a chunk's weights: 128 MiB each)


def device_fingerprint(tensor: Any) -> bytes:
    """16 bytes of a tensor's bytes, computed on its device: the bytes as 64-bit words, two
    sums of each word times a pseudo-random weight of its position (fixed per process, made
    on the device from `_FINGERPRINT_SEEDS`), wrapping modulo 2^64; the last bytes that do
    not fill a word are added as they are. Two different byte strings collide only when
    both sums agree, about 2^-64 each by chance. One synchronizing read of 16 bytes."""
    flat = tensor.detach().reshape(-1).contiguous().view(torch.uint8)
    words_end = flat.numel() // 8 * 8
    words = flat[:words_end].view(torch.int64)
    sums = [torch.zeros((), dtype=torch.int64, device=flat.device) for _ in _FINGERPRINT_SEEDS]
    for chunk_index, start in enumerate(range(0, words.numel(), FINGERPRINT_CHUNK)):
        chunk = words[start : start + FINGERPRINT_CHUNK]
        for total, seed in zip(sums, _FINGERPRINT_SEEDS, strict=True):
            generator = torch.Generator(device=flat.device)
            generator.manual_seed(seed + chunk_index)  # the same weights at the same place
            weights = torch.randint(
                -(2**63), 2**63 - 1, (chunk.numel(),), generator=generator,
                dtype=torch.int64, device=flat.device,
            )  # fmt: skip
            total.add_((chunk * weights.bitwise_or_(1)).sum())  # odd weights: no bit lost
    tail = flat[words_end:].cpu().numpy().tobytes()
    return b"".join(int(s.item()).to_bytes(8, "little", signed=True) for s in sums) + tail


def digest(value: Any) -> bytes:
    """SHA-256 of an output's leaves (dtype, shape and bytes of each tensor; the repr of
    anything else), read in chunks: an earlier output kept as 32 bytes instead of itself.
    Equal bytes give equal digests; a caching candidate returns the same bytes. A GPU
    tensor's bytes enter as their `device_fingerprint`, made where they live: copying them
    to the host to hash them cost seconds per GiB."""
    found = hashlib.sha256()
    for leaf in flatten(value):
        if not isinstance(leaf, torch.Tensor):
            found.update(repr(leaf).encode("utf-8", "replace"))
            continue
        found.update(f"{leaf.dtype}{tuple(leaf.shape)}".encode())
        if leaf.device.type != "cpu":
            found.update(device_fingerprint(leaf))
            continue
        flat = leaf.detach().reshape(-1)  # a view when contiguous
        step = max(1, DIGEST_CHUNK // max(1, leaf.element_size()))
        for start in range(0, flat.numel(), step):
            chunk = flat[start : start + step].contiguous().cpu().view(torch.uint8)
            found.update(chunk.numpy())
    return found.digest()


# Elements of two tensors compared at once (`same_values`): where they live, so a CUDA
# output is never copied whole to the host, and no temporary is the size of the output.
SAME_VALUES_CHUNK = 2**22


def same_values(a: Any, b: Any) -> bool:
    """True when two outputs are bitwise equal (NaNs equal), leaf by leaf; every chunk of
    every tensor compared (`SAME_VALUES_CHUNK` elements at once, on the first's device)."""
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not _same_tensor(x, y):
                return False
        elif x != y:
            return False
    return True


def _same_tensor(x: Any, y: Any) -> bool:
    """Two tensors of one shape and dtype bitwise equal, NaN equal to NaN, chunk by chunk."""
    xf, yf = x.detach().reshape(-1), y.detach().reshape(-1)
    step = SAME_VALUES_CHUNK
    for lo in range(0, xf.numel(), step):
        xc, yc = xf[lo : lo + step], yf[lo : lo + step].to(xf.device)
        if torch.equal(xc, yc):
            continue
        if not xc.is_floating_point() or not bool(
            torch.isclose(xc, yc, rtol=0, atol=0, equal_nan=True).all()
        ):
            return False
    return True


def shares_storage(output: Any, inputs: Sequence[Any]) -> bool:
    """True when an output tensor overlaps the memory of an input tensor."""
    spans = []
    for t in flatten(list(inputs)):
        if isinstance(t, torch.Tensor) and t.numel():
            storage = t.untyped_storage()
            spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    for t in flatten(output):
        if isinstance(t, torch.Tensor) and t.numel():
            start = t.untyped_storage().data_ptr()
            end = start + t.untyped_storage().nbytes()
            if any(start < hi and lo < end for lo, hi in spans):
                return True
    return False


# ----- guards -----


class OpRecorder(TorchDispatchMode):
    """Records the aten ops run inside it (below autograd, so composite ops decompose)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.add(str(func.overloadpacket))  # e.g. "aten.mm"
        self.ops.add(str(func))  # e.g. "aten.mm.default"
        return func(*args, **(kwargs or {}))


def normalize_op(name: str) -> str:
    """ "mm", "aten::mm", "aten.mm" → "aten.mm"; an overload ("aten.mm.default") is kept."""
    name = name.strip().replace("::", ".")
    return name if "." in name else f"aten.{name}"


def forbidden_used(recorded: set[str], forbidden: Sequence[str]) -> list[str]:
    """Forbidden ops (normalized) that appear among the recorded ones."""
    return sorted({normalize_op(f) for f in forbidden} & recorded)


class ReferenceGuard:
    """Counts calls into the reference module while `active` (during the candidate's run).

    Wraps `forward` of every nn.Module class defined in the reference module and every
    plain function there (except the problem-format functions). Install it before the
    candidate's module is executed, so that functions it imports are already wrapped.
    """

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.active = False
        self.calls: dict[str, int] = {}
        self._restore: list[Callable[[], None]] = []

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.calls[label] = self.calls.get(label, 0) + 1
            return fn(*args, **kwargs)

        return wrapper

    def install(self) -> ReferenceGuard:
        name = self.module.__name__
        for attr, obj in list(vars(self.module).items()):
            if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == name:
                original = obj.__dict__.get("forward")
                if original is not None:
                    obj.forward = self._wrap(f"{attr}.forward", original)
                    self._restore.append(functools.partial(setattr, obj, "forward", original))
            elif (
                inspect.isfunction(obj) and obj.__module__ == name and attr not in PROBLEM_FUNCTIONS
            ):
                setattr(self.module, attr, self._wrap(attr, obj))
                self._restore.append(functools.partial(setattr, self.module, attr, obj))
        return self

    def uninstall(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()


class StreamGuard(StreamWatch):
    """Records CUDA streams the candidate creates or switches to (no-op without CUDA).

    Installed before the candidate's module runs, so streams created at import time count.
    The gate's stream watch (`measure.timing.streams.StreamWatch`): `torch.cuda.set_stream`
    (and so `torch.cuda.stream(s)`), `torch._C._cuda_setStream` called directly, and the
    constructor of `torch.cuda.streams.Stream` (which `torch.cuda.Stream` names) are wrapped.
    """

    def install(self, torch_module: Any = None, *, force: bool = False) -> StreamGuard:
        super().install(torch if torch_module is None else torch_module, force=force)
        return self
