"""`call_input_factory`: the device, `shape` and `generator` reach a factory by its signature,
which is read once per factory (a fixed fact of the session), and every kind of callable
works, hashable or not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.problem import model
from pytest_kernelpro.problem.model import call_input_factory


def test_shape_and_generator_reach_the_factory_that_takes_them() -> None:
    seen: dict[str, Any] = {}

    def inputs(device: str, shape: tuple[int, int], generator: torch.Generator) -> Any:
        seen.update(device=device, shape=shape, generator=generator)
        return (torch.randn(shape, generator=generator),)

    (x,) = call_input_factory(inputs, "cpu", seed=3, shape=(2, 3))
    assert seen["device"] == "cpu"
    assert seen["shape"] == (2, 3)
    assert isinstance(seen["generator"], torch.Generator)
    (again,) = call_input_factory(inputs, "cpu", seed=3, shape=(2, 3))
    assert torch.equal(x, again)  # the same seed, the same inputs


def test_a_factory_without_a_device_parameter_gets_only_its_keywords() -> None:
    def inputs(**kwargs: Any) -> tuple[Any, ...]:
        return (sorted(kwargs),)

    assert call_input_factory(inputs, "cpu", seed=0) == (["generator"],)


def test_shapes_for_a_factory_without_shape_is_a_config_error() -> None:
    def inputs(device: str) -> tuple[Any, ...]:
        return (torch.zeros(1),)

    with pytest.raises(KernelproConfigError, match="takes no 'shape' argument"):
        call_input_factory(inputs, "cpu", seed=0, shape=(4,))


@dataclass
class UnhashableFactory:  # a dataclass with eq=True has no hash
    calls: int = 0

    def __call__(self, device: str, shape: Any = None) -> tuple[Any, ...]:
        self.calls += 1
        return (torch.zeros(shape or (1,)),)


def test_an_unhashable_callable_object_still_works() -> None:
    factory = UnhashableFactory()
    with pytest.raises(TypeError):
        hash(factory)
    (x,) = call_input_factory(factory, "cpu", seed=0, shape=(2,))
    assert x.shape == (2,)
    assert factory.calls == 1


def test_the_signature_is_read_once_per_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[Any] = []
    real = model.inspect.signature

    def counting(obj: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(obj)
        return real(obj, *args, **kwargs)

    def inputs(device: str) -> tuple[Any, ...]:
        return (torch.zeros(1),)

    monkeypatch.setattr(model.inspect, "signature", counting)
    for seed in range(5):
        call_input_factory(inputs, "cpu", seed=seed)
    assert reads.count(inputs) == 1
