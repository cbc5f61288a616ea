"""A candidate kernel module built next to its reference, by the gate's one rule
(`problem/build.py`: one seed, one device, the reference's weights handed over by
`share_weights`): the sandbox's worker (`harness.py`) builds a candidate with
`build_kernel`, the final re-measurement (`remeasure.py`) a KernelBench namespace's `Model`
and `ModelNew` with `build_models`.

Imports nothing of the plugin (torch where used), like `problem/build.py`, so the sandbox's
child processes import it without the pytest session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.problem.build import InitInputs, build_module, init_inputs_of, share_weights


@dataclass(frozen=True)
class BuiltKernel:
    """A kernel module built next to its reference, and whether it got the reference's
    weights (`how`: `share_weights`' account)."""

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
) -> BuiltKernel:
    """`cls` built as `build_module` builds the reference (same seed, init inputs, device),
    with `reference`'s parameters and buffers handed over (`share_weights`)."""
    model = build_module(cls, init_inputs, device, seed=seed)
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
