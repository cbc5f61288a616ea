"""Building a problem's reference and kernel modules: one seed, one device, one weight rule.

Every place that turns a module class into the model it runs (the gate's problems, the
sandbox's worker, judge and re-measurement) goes through here, so with the same seed the
reference is the same model in all of them, and the kernel gets its weights by one rule
(`share_weights`): by name when both state_dicts have the same keys of the same shapes, else
by position when both list tensors of the same shapes in the same (registration) order, so a
kernel may name its weights as it likes. The Programmer's prompt states this rule
(agents/problem_context.py).

Imports nothing of the plugin (torch where used), so the sandbox's child processes import it
without the pytest session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def share_weights(reference: Any, kernel: Any) -> tuple[bool, str]:
    """Load `reference`'s state_dict into `kernel`; (copied?, how or why not)."""
    ref_sd, new_sd = getattr(reference, "state_dict", None), getattr(kernel, "state_dict", None)
    if not callable(ref_sd) or not callable(new_sd):
        return False, "not modules"
    ref_state, new_state = ref_sd(), new_sd()
    if not ref_state:
        return False, "the reference has no parameters"
    if set(ref_state) == set(new_state) and all(
        tuple(ref_state[k].shape) == tuple(new_state[k].shape) for k in ref_state
    ):
        kernel.load_state_dict(ref_state)
        return True, "copied by name"
    ref_values, new_keys = list(ref_state.values()), list(new_state)
    if len(ref_values) == len(new_keys) and all(
        tuple(v.shape) == tuple(new_state[k].shape)
        for v, k in zip(ref_values, new_keys, strict=True)
    ):
        kernel.load_state_dict(dict(zip(new_keys, ref_values, strict=True)))
        return True, "copied by position and shape"
    return False, (
        "not copied: the reference's state_dict ("
        + ", ".join(f"{k} {tuple(v.shape)}" for k, v in list(ref_state.items())[:6])
        + ") matches the kernel's ("
        + ", ".join(f"{k} {tuple(v.shape)}" for k, v in list(new_state.items())[:6])
        + ") neither by name nor by position and shape"
    )


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
