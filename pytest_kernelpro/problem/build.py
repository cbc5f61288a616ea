"""Building a problem's reference and kernel modules: one seed, one device, one weight rule.

Every place that turns a module class into the model it runs goes through here: the gate's
KernelBench problems (`kernelbench.py`) and marked `nn.Module` classes (`model.py`), and the
sandbox's worker (`optimize/sandbox/harness.py`), trusted judge (`optimize/sandbox/judge.py`) and final
re-measurement (`optimize/sandbox/remeasure.py`). So with the same seed the reference is the same model
in all of them, and the kernel gets its weights by the one rule of `measure/weights.py` (by
name, else by position and shape).

Imports only `measure.weights` (torch where used), so the sandbox's child processes import
it without the pytest session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.measure.weights import share_weights

InitInputs = Callable[[], Sequence[Any]] | Sequence[Any]


def _no_init_inputs() -> list[Any]:
    return []


def init_inputs_of(module: Any) -> Callable[[], Sequence[Any]]:
    """A KernelBench module's `get_init_inputs` (none: no constructor arguments)."""
    return getattr(module, "get_init_inputs", _no_init_inputs)


def _arguments(init_inputs: InitInputs) -> list[Any]:
    return list(init_inputs() if callable(init_inputs) else init_inputs)


def build_module(
    cls: Any, init_inputs: InitInputs, device: str, *, seed: int = 0, on_device: bool = True
) -> Any:
    """`cls(*init_inputs)` seeded with `seed`, on `device`, in eval mode.

    `on_device` (KernelBench problems, the sandbox): the constructor runs with `device` as
    torch's default device, so parameters are drawn there (seeded, no CPU initialization of
    large weights, no copy); a constructor that needs the CPU is built there (seeded again)
    and moved. A callable `init_inputs` is called after seeding, inside that device context.
    `on_device=False` (marked `nn.Module` classes): built on the CPU and moved.
    """
    import torch

    if not on_device:
        args = _arguments(init_inputs)
        torch.manual_seed(seed)
        return cls(*args).to(device).eval()
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            built = cls(*_arguments(init_inputs))
    except Exception:  # a model whose constructor needs the CPU: build it there
        torch.manual_seed(seed)
        built = cls(*_arguments(init_inputs))
    return built.to(device).eval()


@dataclass(frozen=True)
class BuiltKernel:
    """A kernel module built next to its reference, and whether it got the reference's
    weights (`how`: `measure.weights.share_weights`' account)."""

    model: Any
    weights_copied: bool
    how: str


def build_kernel(
    cls: Any,
    reference: Any,
    init_inputs: InitInputs,
    device: str,
    *,
    seed: int = 0,
    on_device: bool = True,
) -> BuiltKernel:
    """`cls` built as `build_module` builds the reference (same seed, init inputs, device),
    with `reference`'s parameters and buffers handed over (`share_weights`)."""
    model = build_module(cls, init_inputs, device, seed=seed, on_device=on_device)
    copied, how = share_weights(reference, model)
    return BuiltKernel(model, copied, how)


@dataclass(frozen=True)
class BuiltModels:
    """A KernelBench module's reference (`Model`) and kernel (`ModelNew`), built together."""

    reference: Any
    kernel: BuiltKernel


def build_models(module: Any, device: str, *, seed: int = 0) -> BuiltModels:
    """`module.Model` and `module.ModelNew` (one KernelBench namespace holding both) on
    `device` with `seed`, the kernel holding the reference's weights."""
    init = init_inputs_of(module)
    reference = build_module(module.Model, init, device, seed=seed)
    return BuiltModels(reference, build_kernel(module.ModelNew, reference, init, device, seed=seed))


def sharing_weights(
    kernel_factory: Callable[[str], Any], reference_factory: Callable[[str], Any]
) -> Callable[..., Any]:
    """A kernel factory (device -> module) whose module gets the reference module's weights
    (`share_weights`), for `Problem.instantiate`; marked `takes_reference` so the reference
    it already built for the device is passed in and not constructed twice."""

    def kernel(device: str, reference: Any = None) -> Any:
        built = kernel_factory(device)
        share_weights(reference_factory(device) if reference is None else reference, built)
        return built

    kernel.takes_reference = True  # type: ignore[attr-defined]
    return kernel
