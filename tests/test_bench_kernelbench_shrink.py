"""bench/kernelbench_shrink.py on problem texts written here (no KernelBench file is read):
the size constants halved until one call fits the budget, the operator's geometry kept,
sizes that must stay equal or divisible kept so, and the problems that cannot shrink named."""

from __future__ import annotations

import types
from types import ModuleType

import pytest
from bench_scripts import load_bench_script

torch = pytest.importorskip("torch")

MIB = 2**20


def load_script():  # noqa: ANN201
    return load_bench_script("kernelbench_shrink")


ks = load_script()

# A grouped convolution: channels must stay divisible by groups; kernel_size, stride and
# padding set the operator and must not move; `height = width` is one chained constant.
CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding, groups=groups)

    def forward(self, x):
        return self.conv(x)

batch_size = 8 * 2
in_channels = 12
out_channels = 24
kernel_size = 5
stride = 2
padding = 2
groups = 3
height = width = 256

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, groups]
"""

# A loss whose targets broadcast against the predictions only while batch_size equals
# input_shape[0]: halving either alone breaks it; `dim = 1` is an axis, not a size.
LOSS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0), dim=dim)

batch_size = 4096
input_shape = (4096,)
dim = 1

def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.rand(batch_size)]

def get_init_inputs():
    return []
"""


def built(text: str) -> ModuleType:
    module = types.ModuleType("kp_test_shrunk")
    exec(compile(text, "<shrunk>", "exec"), module.__dict__)  # noqa: S102 - text written above
    return module


def real_bytes(text: str) -> int:
    module = built(text)
    inputs = module.get_inputs()
    output = module.Model(*module.get_init_inputs())(*inputs)
    return sum(t.numel() * t.element_size() for t in [*inputs, output])


def test_conv_shrinks_sizes_within_budget_and_keeps_the_geometry() -> None:
    before = ks.call_bytes(CONV)[0]
    result = ks.shrink(CONV, budget_mib=2)
    assert before == result.original_bytes > 2 * MIB
    assert result.shrunk_bytes <= 2 * MIB
    assert real_bytes(result.text) == result.shrunk_bytes  # the meta count is the real one
    module = built(result.text)
    assert (module.kernel_size, module.stride, module.padding, module.groups) == (5, 2, 2, 3)
    assert module.height == module.width < 256  # the chained constant moved as one
    assert module.in_channels % module.groups == 0
    assert module.out_channels % module.groups == 0
    assert min(module.batch_size, module.in_channels, module.height) >= 1
    assert set(result.changes) <= {"batch_size", "in_channels", "out_channels", "height"}
    assert result.changes["height"][0] == 256
    found = {s.name: s.value for s in ks.find_slots(ks.ast.parse(CONV))}
    assert found == {"batch_size": 16, "in_channels": 12, "out_channels": 24, "height": 256}


def test_halving_that_breaks_divisibility_is_undone_and_named() -> None:
    # groups = 3: channels 12 -> 6 -> 3 work, 3 -> 1 breaks; with a budget below the smallest
    # working form (3 channels, 1x1 pixels: 24 bytes), the kept names are in the reason.
    result = ks.shrink(CONV, budget_mib=0.001)
    module = built(result.text)
    assert module.in_channels % 3 == 0
    assert module.out_channels % 3 == 0
    assert result.shrunk_bytes <= 0.001 * MIB
    with pytest.raises(ks.NotShrinkable, match="halving broke it at in_channels, out_channels"):
        ks.shrink(CONV, budget_mib=16 / MIB)


def test_sizes_that_must_stay_equal_are_halved_together_and_the_axis_is_kept() -> None:
    result = ks.shrink(LOSS, budget_mib=1)
    module = built(result.text)
    assert module.batch_size == module.input_shape[0] < 4096
    assert module.dim == 1
    assert result.shrunk_bytes <= MIB
    assert real_bytes(result.text) == result.shrunk_bytes


def test_a_problem_without_size_constants_over_the_budget_is_not_shrinkable() -> None:
    fixed = LOSS.replace("batch_size = 4096", "batch_size = 1").replace("(4096,)", "(1,)")
    fixed = fixed.replace("torch.rand(batch_size, *input_shape)", "torch.rand(512, 512)")
    fixed = fixed.replace("torch.rand(batch_size)", "torch.rand(512, 1)")
    with pytest.raises(
        ks.NotShrinkable, match=r"smallest working form is 1\.0 MiB per call \(budget 1 MiB"
    ):
        ks.shrink(fixed, budget_mib=1)


def test_a_problem_that_does_not_build_is_not_shrinkable_with_its_error() -> None:
    broken = CONV.replace("import torch.nn as nn", "import torch.nn as nn\nimport not_a_module")
    with pytest.raises(ks.NotShrinkable, match="does not build: ModuleNotFoundError"):
        ks.shrink(broken, budget_mib=1)


def test_a_model_the_meta_device_cannot_build_is_measured_for_real() -> None:
    # `.item()` in __init__ cannot run on meta tensors: the shrink builds it on the CPU.
    item = CONV.replace(
        "super().__init__()", "super().__init__()\n        self.k = torch.ones(1).sum().item()"
    )
    result = ks.shrink(item, budget_mib=2)
    assert result.how == "cpu"
    assert result.shrunk_bytes <= 2 * MIB
    assert real_bytes(result.text) == result.shrunk_bytes


def test_render_rewrites_only_the_chosen_values() -> None:
    tree = ks.ast.parse(LOSS)
    slots = ks.find_slots(tree)
    assert [s.name for s in slots] == ["batch_size", "input_shape[0]"]
    slots[1].value = 7
    text = ks.render(LOSS, slots)
    assert "input_shape = (7,)" in text
    assert "batch_size = 4096" in text
    assert "dim = 1" in text
