"""The plugin decides correctness by the reference's own error against its float64 truth
(issue 27) and says so in the JSON report and the item's section; KernelBench files also get
KernelBench's own verdict next to it."""

from __future__ import annotations

import pytest
from conftest import records_by_name

# A KernelBench-format softmax over wide rows (level 1 `23_Softmax`'s 393,216 columns, a few
# rows): every output is about 2.5e-6, below fp32's default atol.
SOFTMAX = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
{new}
def get_inputs():
    return [torch.rand(4, 393216)]

def get_init_inputs():
    return []
"""
ZEROS = """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
"""
BY_HAND = """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.max(dim=1, keepdim=True).values)
        return e / e.sum(dim=1, keepdim=True)
"""


def test_zeros_fail_and_a_reordered_softmax_passes_with_the_rule_recorded(
    kp_project: pytest.Pytester,
) -> None:
    problems = kp_project.mkdir("problems")
    (problems / "1_softmax_zeros.py").write_text(SOFTMAX.format(new=ZEROS))
    (problems / "2_softmax_by_hand.py").write_text(SOFTMAX.format(new=BY_HAND))
    result = kp_project.runpytest(
        "--kernelpro-only", "--kernelpro-problems=problems", "--kernelpro-trials=2", "-rA"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*1_softmax_zeros*the kernel returned all zeros*"])
    result.stdout.fnmatch_lines(
        [
            "correctness rule: within 8x the reference's own error against its float64 re-run;"
            " normwise error against the float64 truth: kernel *, reference *; truth re-run * ms",
            "KernelBench's own check (allclose, atol=0.01, rtol=0.01): passed, max abs err *",
        ]
    )
    records = records_by_name(kp_project)
    zeros = records["1_softmax_zeros"]["correctness"]
    assert zeros["passed"] is False
    assert zeros["rule"] == "within 8x the reference's own error against its float64 re-run"
    assert zeros["factor"] == 8.0
    assert zeros["kernel_error"] == pytest.approx(1.0)
    assert zeros["truth"]["precision"] == "float64"
    assert zeros["truth"]["seconds"] > 0
    # KernelBench's own check passes the zeros (atol 1e-2): both verdicts are in the record.
    assert zeros["kernelbench"]["passed"] is True
    good = records["2_softmax_by_hand"]["correctness"]
    assert good["passed"] is True
    assert good["kernel_error"] < 8 * good["reference_error"] + 2 * 2**-24
    assert good["kernelbench"]["passed"] is True


def test_a_marker_tolerance_is_named_as_the_rule(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
import pytest
import torch

def pair(device):
    return torch.randn(64, device=device), torch.randn(64, device=device)

@pytest.mark.kernelpro(reference=torch.add, inputs=pair, rtol=1e-3, atol=1e-3)
def add(x, y):
    return x + y
"""
    )
    result = kp_project.runpytest("--kernelpro-only", "--kernelpro-correctness-only")
    result.assert_outcomes(passed=1)
    record = records_by_name(kp_project)["add"]["correctness"]
    assert record["rule"] == "marker rtol=0.001, atol=0.001 (override)"
    assert record["kernelbench"] is None
    # The truth still ran: the record has both errors for the reader.
    assert record["truth"]["precision"] == "float64"
    assert record["kernel_error"] == record["reference_error"]
