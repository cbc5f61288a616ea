"""Recording a reference's aten ops for the roofline: what each op costs and where it runs.

`make_recorder` returns a TorchDispatchMode that prices every op the reference runs (the
op-cost hook first, then the built-in formulas of `flops.py`); `aggregate` merges the costs
per (op, peak); `price_upcasts_at_io_dtype` re-prices a float64 reference of narrower work.
Split from `roofline.py`, which combines these costs with the graph's bytes and ceilings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pytest_kernelpro.measure.devices import DeviceSpec
from pytest_kernelpro.measure.flops import (
    OpCost,
    backend_peak_key,
    compute_dtype,
    is_no_cost,
    iter_tensors,
    op_bytes,
    op_category,
    op_device_type,
    op_flops,
    select_peak_key,
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
            self.hooked = 0
            self.hook_error: BaseException | None = None
            # Tensors an op reads that no op of the reference produced: captured weights,
            # constants, a closure's tensors. They are graph inputs for the minimal bytes.
            self.external: dict[Any, Any] = {}
            self.produced: set[Any] = set()

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if self.hook_error is None:
                self._track(args, kwargs, out)
                self._price(func, args, kwargs, out)
            return out

        def _track(self, args: tuple, kwargs: dict, out: Any) -> None:
            for t in iter_tensors((args, kwargs)):
                key = storage_key(t)
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
                dtype = compute_dtype(category, args, out)
                device_type = op_device_type(args, out)
                key = select_peak_key(
                    category, dtype, device_type, allow_tf32, allow_cudnn_tf32, spec
                )
                key, backend_note = backend_peak_key(name, key, dtype, device_type)
                if backend_note:
                    self.notes.append(backend_note)
                nbytes = op_bytes(func, args, kwargs, out)
            except Exception as exc:  # an odd schema must not break the user's reference
                self.notes.append(f"{name}: not priced ({type(exc).__name__}: {exc})")
                return
            if note:
                self.notes.append(note)
            self.costs.append(OpCost(name, category, flops, nbytes, dtype, key))

    return _Recorder()


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
    """A reference that upcasts to float64 for accuracy (inputs and outputs in a narrower
    float type) describes the kernel's work in that narrower type: price its float64 ops at
    the rate of the inputs' dtype, not at the FP64 pipe's, which the kernel never uses."""
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
            key = select_peak_key(
                op.category, io_dtype, device_type, allow_tf32, allow_cudnn_tf32, spec
            )
            repriced.append(replace(op, dtype=io_dtype, peak_key=key))
            changed = True
        else:
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
        if prev is None:
            merged[key] = cost
        else:
            merged[key] = OpCost(
                cost.op, prev.category, prev.flops + cost.flops,
                prev.bytes_unfused + cost.bytes_unfused, prev.dtype, cost.peak_key,
                prev.count + cost.count,
            )  # fmt: skip
    return tuple(merged.values())
