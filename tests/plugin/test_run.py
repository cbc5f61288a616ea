"""Running kernel items on the CPU: correctness, poisoning, bad input, reports, roofline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SLOWDOWN_ENV, records_by_name

GOOD = """
import pytest, torch

def pair(device):
    return torch.randn(65536, device=device), torch.randn(65536, device=device)

@pytest.mark.kernelpro(reference=torch.add, inputs=pair)
def add(x, y):
    return x + y

def mats(device):
    return torch.randn(256, 1024, device=device), torch.randn(1024, 256, device=device)

@pytest.mark.kernelpro(reference=torch.mm, inputs=mats, rtol=1e-4, atol=1e-4)
def matmul(a, b):
    return a @ b
"""


def test_passing_kernels_report_time_and_exact_roofline(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(test_k=GOOD)
    result = kp_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*= kernelpro =*", "*add*", "*matmul*", "*kernelpro: JSON report*"]
    )
    records = records_by_name(kp_project)
    add, mm = records["add"], records["matmul"]
    n = 65536
    # elementwise add: one FLOP per output element; read x and y, write out once (fp32).
    assert add["roofline"]["flops"] == n
    assert add["roofline"]["min_bytes"] == 3 * 4 * n
    assert add["roofline"]["bound"] == "memory"
    assert add["roofline"]["roofline_time_s"] == pytest.approx(3 * 4 * n / 100e9)
    # (256x1024) @ (1024x256): 2*M*N*K FLOPs; bytes of A, B and C once each.
    assert mm["roofline"]["flops"] == 2 * 256 * 1024 * 256
    assert mm["roofline"]["min_bytes"] == 4 * (256 * 1024 + 1024 * 256 + 256 * 256)
    assert mm["roofline"]["bound"] == "compute"
    assert mm["roofline"]["roofline_time_s"] == pytest.approx(2 * 256 * 1024 * 256 / 1e12)
    for record in (add, mm):
        median = record["timing"]["stats"]["median_s"]
        assert median > 0
        assert record["efficiency"] == pytest.approx(record["roofline"]["roofline_time_s"] / median)
        assert record["correctness"]["passed"] is True
        assert record["timing"]["method"] == "cpu-perf-counter"
        assert record["outcome"] == "passed"


def test_marker_flops_and_bytes_override_counting(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.randn(1000, device=device),),
                               flops=5000, bytes=8000)
        def neg(x):
            return -x
        """
    )
    kp_project.runpytest().assert_outcomes(passed=1)
    roofline = records_by_name(kp_project)["neg"]["roofline"]
    assert (roofline["flops"], roofline["min_bytes"]) == (5000, 8000)
    assert roofline["flops_source"] == "marker"


def test_wrong_kernel_reports_error_and_worst_index(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        @pytest.mark.kernelpro(reference=torch.relu, inputs=lambda device: (torch.randn(32, 16, device=device),))
        def relu_off_by_one(x):
            out = torch.relu(x)
            out[3, 5] += 0.5
            return out
        """
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*relu_off_by_one is wrong: output: 1 of 512 elements*farther from the float64 truth "
            "than 8x the reference's own error*"
            "Worst at index (3, 5): truth 0, reference 0, kernel 0.5.*"
        ]
    )
    assert records_by_name(kp_project)["relu_off_by_one"]["outcome"] == "failed"


def test_poisoned_output_catches_an_unwritten_element(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        @pytest.mark.kernelpro(reference=lambda x: x * 2, inputs=lambda device: (torch.randn(1024, device=device),))
        def double_skips_last(x):
            out = torch.empty_like(x)
            out[:-1] = x[:-1] * 2
            return out
        """
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*double_skips_last is wrong*(1023,)*"])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "def inp(device):\n    raise RuntimeError('no data here')\n"
            "@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)\ndef k(x):\n    return -x\n",
            "*input factory inp('cpu') raised RuntimeError: no data here*",
        ),
        (
            "@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4, 4),))\n"
            "def k(x):\n    return -x[:2]\n",
            "*shape*(2, 4)*(4, 4)*",
        ),
        (
            "@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4),))\n"
            "def k(x):\n    return (-x).half()\n",
            "*float16*float32*",
        ),
        (
            "@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4),))\n"
            "def k(x):\n    raise ValueError('kernel exploded')\n",
            "*k: The kernel raised ValueError: kernel exploded*",
        ),
    ],
    ids=["factory-raises", "wrong-shape", "wrong-dtype", "kernel-raises"],
)
def test_bad_input_fails_that_item_and_the_session_goes_on(
    kp_project: pytest.Pytester, body: str, expected: str
) -> None:
    kp_project.makepyfile(
        test_k="import pytest, torch\n" + body + "\ndef test_after():\n    pass\n"
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([expected])


def test_gpu_kernel_is_skipped_on_cpu_with_reason(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # About the default device (auto) on a machine without a GPU: the child sees none on any
    # host (in this process, patching the plugin's own check was not enough on an H200: other
    # checks ask torch, and a CUDA context of this process cannot be hidden).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4, device=device),), language="triton")
        def triton_neg(x):
            raise AssertionError("must not run without a GPU")
        """
    )
    result = kp_project.runpytest_subprocess(
        "-rs", "-p", "no:cacheprovider", "--kernelpro-device=auto"
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU (triton kernel) and none is visible*"])


def test_a_kernel_calling_a_triton_library_layer_is_skipped_on_cpu(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marked function calls a library's layer object whose forward launches only a
    Triton kernel (no source it names mentions Triton). A stand-in `triton` package (Triton
    is not installed here) fails on launch as Triton does without a GPU: detected as Triton,
    the item is skipped, not run and failed inside Triton."""
    import shutil

    standin = Path(__file__).resolve().parents[1] / "data" / "triton_standin"
    shutil.copytree(standin, kp_project.path, dirs_exist_ok=True)
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        from normlib.layers import Wrapper, make_block

        layer = Wrapper(make_block())

        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(4, device=device),))
        def library_norm(x):
            return layer(x)
        """
    )
    # About the default device (auto) on a machine without a GPU: the child sees none on any host.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = kp_project.runpytest_subprocess(
        "-rs", "-p", "no:cacheprovider", "--kernelpro-device=auto"
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU (triton kernel) and none is visible*"])
    assert "0 active drivers" not in result.stdout.str()


def test_min_roofline_fails_a_slow_kernel(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
        import time, pytest, torch
        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(64),), min_roofline=0.9)
        def slow_neg(x):
            time.sleep(0.001)
            return -x
        """
    )
    result = kp_project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*slow_neg reaches *% of its roofline, below min_roofline=90%*"])


def test_module_kernel_shares_reference_parameters(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        class Ref(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(64, 32)
            def forward(self, x):
                return torch.relu(self.lin(x))
        @pytest.mark.kernelpro(reference=Ref, inputs=lambda device: (torch.randn(16, 64, device=device),), rtol=1e-5, atol=1e-5)
        class Fused(Ref):
            def forward(self, x):
                return torch.addmm(self.lin.bias, x, self.lin.weight.t()).clamp_min(0)
        """
    )
    kp_project.runpytest().assert_outcomes(passed=1)
    record = records_by_name(kp_project)["Fused"]
    # Linear 16x64 @ 64x32 (+ bias) and relu: parameters are inputs of the reference.
    assert record["roofline"]["flops"] >= 2 * 16 * 64 * 32
    assert record["roofline"]["min_bytes"] >= 4 * (16 * 64 + 64 * 32 + 32 + 16 * 32)


def test_shapes_become_items_with_their_own_records(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        def inp(device, shape):
            return (torch.randn(*shape, device=device),)
        @pytest.mark.kernelpro(reference=lambda x: x * 3, inputs=inp, shapes=[(128, 64), (32,)])
        def triple(x):
            return x + x + x
        """
    )
    kp_project.runpytest().assert_outcomes(passed=2)
    records = records_by_name(kp_project)
    assert records["triple[128x64]"]["roofline"]["min_bytes"] == 2 * 4 * 128 * 64
    assert records["triple[32]"]["roofline"]["min_bytes"] == 2 * 4 * 32
    assert records["triple[32]"]["shape"] == "32"


GATED = """
import pytest, torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def neg(x):
    return -x
"""


def test_check_without_baseline_fails_clearly(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(test_k=GATED)
    result = kp_project.runpytest("--kernelpro-check")
    # Before any kernel is measured: a usage error naming the file and the fix.
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*kernelpro-baseline.yaml*--kernelpro-save-baseline*"])


def test_save_then_check_passes_then_catches_a_regression(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    """The gate end to end on injected timings: unchanged passes, 5x slower fails confirmed."""
    kp_project.makepyfile(test_k=GATED)
    kp_project.runpytest("--kernelpro-save-baseline").assert_outcomes(passed=1)
    baseline = kp_project.path / "kernelpro-baseline.yaml"
    assert "neg" in baseline.read_text()

    result = kp_project.runpytest("--kernelpro-check", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1)
    gate = records_by_name(kp_project)["neg"]["gate"]
    assert gate["status"] == "ok"
    assert gate["basis"].startswith("time (same device")
    junit = (kp_project.path / "junit.xml").read_text()
    from pytest_kernelpro.review.junit_read import read_junit_records

    (from_junit,) = read_junit_records(kp_project.path / "junit.xml")
    assert from_junit.name == "neg"
    assert from_junit.median_s == pytest.approx(
        records_by_name(kp_project)["neg"]["timing"]["stats"]["median_s"], rel=1e-3
    )
    assert "<property" in junit

    monkeypatch.setenv(SLOWDOWN_ENV, "5")
    result = kp_project.runpytest("--kernelpro-check")
    result.assert_outcomes(failed=1)
    gate = records_by_name(kp_project)["neg"]["gate"]
    assert gate["status"] == "regressed"
    assert gate["confirmed"] is True
    # The baseline keeps 6 significant digits of its median.
    assert gate["change"] == pytest.approx(injected_timing[-2] / injected_timing[0] - 1, rel=1e-4)


def test_a_plugin_on_the_measured_item_sees_the_gates_time_so_far(
    kp_project: pytest.Pytester,
) -> None:
    """The optimizer sizes its evaluations' run limit on what the gate spent checking and
    timing the item (`optimize.loop.compose.run_limit_s`): when another plugin's
    `pytest_kernelpro_item_measured` runs, the record already carries that time, and the
    record written at the end the item's whole time, that plugin's work included."""
    kp_project.makeconftest(
        "import time\n"
        "SEEN = []\n"
        "def pytest_kernelpro_item_measured(run, session, set_phase):\n"
        "    SEEN.append(run.record.wall_s)\n"
        "    time.sleep(0.3)\n"
        "def pytest_sessionfinish(session):\n"
        "    print('seen at the hook:', SEEN)\n"
    )
    kp_project.makepyfile(test_k=GOOD)
    result = kp_project.runpytest("-p", "no:randomly", "-s", "-k", "add")
    result.assert_outcomes(passed=1)
    found = re.search(r"seen at the hook: \[([0-9.e+-]+)\]", result.stdout.str())
    assert found is not None, result.stdout.str()
    seen = float(found.group(1))
    assert seen > 0.0
    final = records_by_name(kp_project)["add"]["wall_s"]
    assert final >= seen + 0.3


def test_a_plugin_on_the_measured_item_works_beside_none_of_its_tensors(
    kp_project: pytest.Pytester,
) -> None:
    """Without --kernelpro-check nothing after another plugin's work reads the timing's
    inputs, the re-measurement's fresh content or the correctness rule's truth: the session
    drops them before that work (the optimizer's evaluations run beside the session, on the
    same host and device), so no tensor of the problem's size is alive at the hook. Under
    --kernelpro-check the gate reads them after it: kept."""
    kp_project.makeconftest(
        "import gc, torch\n"
        "SEEN = []\n"
        "def pytest_kernelpro_item_measured(run, session, set_phase):\n"
        "    gc.collect()\n"
        "    SEEN.append(sum(1 for o in gc.get_objects()\n"
        "                    if type(o) is torch.Tensor and o.numel() == 65536))\n"
        "def pytest_sessionfinish(session):\n"
        "    print('alive at the hook:', SEEN)\n"
    )
    kp_project.makepyfile(test_k=GOOD)
    baseline = f"--kernelpro-save-baseline={kp_project.path / 'kernelpro-baseline.yaml'}"
    for flags, alive in (((baseline,), "[0]"), (("--kernelpro-check",), None)):
        # In a process of its own: this one holds other tests' tensors.
        result = kp_project.runpytest_subprocess("-p", "no:randomly", "-s", "-k", "add", *flags)
        result.assert_outcomes(passed=1)
        found = re.search(r"alive at the hook: (\[[0-9, ]*\])", result.stdout.str())
        assert found is not None, result.stdout.str()
        if alive is not None:
            assert found.group(1) == alive
        else:  # the gate's inputs and re-measurement, still held
            assert found.group(1) != "[0]"
