"""Hand a reference module's weights to the module checked against it.

One rule for every place that builds a kernel module next to its reference (all through
`problem/build.py`: the gate's marked `nn.Module` classes and KernelBench files, the sandbox
worker, the final re-measurement): by name
when both state_dicts have the same keys of the same shapes, else by position when both list
tensors of the same shapes in the same (registration) order, so a kernel may name its
weights as it likes. The Programmer's prompt states this rule (agents/problem_context.py).
"""

from __future__ import annotations

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
