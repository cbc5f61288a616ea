"""Worker-side building blocks, in process: comparison, poisoning, guards, environment."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.output_rule import default_tolerance
from pytest_kernelpro.optimize.sandbox import checks, measurement
from pytest_kernelpro.optimize.sandbox.build_failures import summarize_build_error
from pytest_kernelpro.optimize.sandbox.checks import classify_exception
from pytest_kernelpro.optimize.sandbox.environment import is_secret_name, scrub_environment
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.loader import load_source


def _verdict(ref: object, out: object, **task: object) -> measurement.OutputsVerdict:
    return measurement.verdict(torch, out, ref, task, None)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float32, (1e-4, 1e-4)),
        (torch.float16, (1e-2, 1e-2)),
        (torch.bfloat16, (1.6e-2, 1e-2)),  # the gate's; the sandbox had 1e-2 of its own
        (torch.float64, (1e-7, 1e-7)),
        (torch.int32, (0.0, 0.0)),
        (torch.bool, (0.0, 0.0)),
    ],
)
def test_the_sandbox_decides_with_the_gates_tolerance(
    dtype: torch.dtype, expected: tuple[float, float]
) -> None:
    ref = torch.ones(4, dtype=dtype)
    decided = _verdict(ref, ref.clone())
    assert decided.ok
    assert decided.tolerance is not None
    assert (decided.tolerance.rtol, decided.tolerance.atol) == expected
    assert decided.tolerance == default_tolerance(dtype)


def test_task_rtol_alone_keeps_the_dtype_default_atol() -> None:
    ref = torch.ones(3)
    decided = _verdict(ref, ref * 1.05, rtol=0.1)
    assert decided.ok
    assert decided.tolerance is not None
    assert (decided.tolerance.rtol, decided.tolerance.atol) == (0.1, 1e-4)
    assert decided.tolerance.source == "marker"


def test_within_tolerance_passes_and_reports_errors() -> None:
    ref = torch.tensor([1.0, 2.0, 3.0])
    decided = _verdict(ref, ref + 5e-5)
    assert decided.ok
    assert decided.max_abs == pytest.approx(5e-5, rel=1e-2)
    assert decided.failure is None


def test_beyond_tolerance_fails_naming_the_index() -> None:
    ref = torch.zeros(4, 4)
    out = ref.clone()
    out[2, 3] = 0.5
    decided = _verdict(ref, out)
    assert not decided.ok
    assert decided.failure is not None
    assert "1 of 16 elements" in decided.failure
    assert "Worst at index (2, 3)" in decided.failure


def test_nan_never_passes_where_the_reference_is_a_number() -> None:
    ref = torch.ones(3)
    out = torch.tensor([1.0, math.nan, 1.0])
    decided = _verdict(ref, out, atol=1e9, rtol=1e9)
    assert not decided.ok
    assert decided.failure is not None
    assert "1 NaN where the reference is a number, first at index (1,)" in decided.failure
    # The gate's rule: a NaN the reference itself produced (it runs unpoisoned) is matched.
    assert _verdict(torch.tensor([math.nan]), torch.tensor([math.nan])).ok
    assert not _verdict(torch.tensor([math.nan]), torch.tensor([1.0])).ok


def test_infinities_must_match_exactly() -> None:
    ref = torch.tensor([math.inf, 1.0])
    assert _verdict(ref, ref.clone()).ok
    assert not _verdict(ref, torch.tensor([-math.inf, 1.0])).ok
    assert not _verdict(ref, torch.tensor([1e30, 1.0])).ok


@pytest.mark.parametrize(
    ("out", "why"),
    [
        (
            torch.zeros(3, 2),
            "kernel returned shape (3, 2) dtype float32; reference returned (2, 3)",
        ),
        (
            torch.zeros(2, 3, dtype=torch.float16),
            "dtype float16; reference returned (2, 3) float32",
        ),
        ((torch.zeros(2, 3), torch.zeros(1)), "kernel returned a tuple of 2 items"),
        (3.0, "kernel returned float 3.0; reference returned a tensor"),
    ],
)
def test_structure_mismatches(out: object, why: str) -> None:
    decided = _verdict(torch.zeros(2, 3), out)
    assert not decided.ok
    assert decided.failure is not None
    assert why in decided.failure


def test_integers_compare_exactly() -> None:
    ref = torch.tensor([1, 2, 3])
    assert _verdict(ref, ref.clone()).ok
    assert not _verdict(ref, torch.tensor([1, 2, 4])).ok


def test_forbidden_op_names_are_normalized() -> None:
    # What OpRecorder records for F.linear + softmax (the recorder itself runs in the worker
    # tests: entering a dispatch mode imports torch._dynamo, seconds in process).
    recorded = {
        "aten.t",
        "aten.t.default",
        "aten.addmm",
        "aten.addmm.default",
        "aten._softmax",
        "aten._softmax.default",
    }
    assert checks.forbidden_used(recorded, ["mm", "aten::addmm", "aten._softmax"]) == [
        "aten._softmax",
        "aten.addmm",
    ]
    assert checks.forbidden_used(recorded, ["aten.addmm.out"]) == []
    assert checks.normalize_op("aten.mm.default") == "aten.mm.default"


def test_reference_guard_counts_only_while_active() -> None:
    module = load_source(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n        return helper(x)\n"
        "def helper(x):\n    return x * 2\n"
        "def get_inputs():\n    return [torch.ones(2)]\n",
        "kp_test_guard_reference",
    )
    try:
        guard = checks.ReferenceGuard(module).install()
        model = module.Model()
        model(torch.ones(2))
        assert guard.calls == {}
        guard.active = True
        model(torch.ones(2))
        module.get_inputs()  # part of the problem format: not counted
        assert guard.calls == {"Model.forward": 1, "helper": 1}
        guard.uninstall()
        assert module.Model.forward.__qualname__ == "Model.forward"
    finally:
        sys.modules.pop("kp_test_guard_reference", None)


def test_shares_storage() -> None:
    x = torch.randn(4, 4)
    assert checks.shares_storage(x[1:], [x])
    assert checks.shares_storage((torch.ones(1), x.view(-1)), [torch.ones(2), x])
    assert not checks.shares_storage(x.clone(), [x])


def test_same_values_treats_nan_as_equal() -> None:
    a = torch.tensor([1.0, math.nan])
    assert checks.same_values(a, a.clone())
    assert not checks.same_values(a, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_same_values_sees_a_difference_in_any_chunk(where: str) -> None:
    """The bitwise checks (inputs written in place, a cached output, work left on another
    stream) compare chunk by chunk: an output equal in its first chunks and different in
    its last (or one element anywhere) is not the same; NaN stays equal to NaN in every
    chunk."""
    n = 2 * checks.SAME_VALUES_CHUNK + 17  # three chunks, the last one short
    a = torch.arange(n, dtype=torch.float32)
    a[n - 1] = a[checks.SAME_VALUES_CHUNK + 1] = float("nan")
    assert checks.same_values([a], [a.clone()])
    at = {"first": 0, "middle": checks.SAME_VALUES_CHUNK + 3, "last": n - 2}[where]
    b = a.clone()
    b[at] += 1.0
    assert not checks.same_values([a], [b])
    ints = torch.arange(n, dtype=torch.int64)
    changed = ints.clone()
    changed[at] = -1
    assert not checks.same_values(ints, changed)
    # Views of other strides compare by their elements, not their storage.
    grid = a[: 2 * 4096].view(2, 4096)
    assert checks.same_values(grid.t(), grid.t().contiguous())
    assert not checks.same_values(grid.t(), grid.contiguous().view(4096, 2))


def test_load_source_is_a_fresh_importable_module() -> None:
    module = load_source(
        "X = __name__\nif __name__ == '__main__':\n    raise SystemExit\n", "kp_test_module"
    )
    try:
        assert module.X == "kp_test_module"
        assert sys.modules["kp_test_module"] is module
    finally:
        sys.modules.pop("kp_test_module", None)
    with pytest.raises(SyntaxError):
        load_source("def broken(:\n", "kp_test_broken")
    assert "kp_test_broken" not in sys.modules


def test_exception_classification() -> None:
    assert classify_exception(MemoryError()).startswith("out of memory")
    assert classify_exception(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    ).startswith("out of memory")
    assert (
        classify_exception(
            RuntimeError(
                "CUDA error: an illegal memory access was encountered\nCompile with TORCH_USE_CUDA_DSA"
            )
        )
        == "illegal memory access: RuntimeError: CUDA error: an illegal memory access was "
        "encountered"
    )
    assert classify_exception(ValueError("bad")) == "ValueError: bad"
    build = RuntimeError(
        "Error building extension 'kp'\n[1/2] nvcc ...\nk.cu(8): error: "
        'expected a ";"\nninja: build stopped'
    )
    assert summarize_build_error(build) == (
        "RuntimeError: Error building extension 'kp' | k.cu(8): error: expected a \";\""
    )


@pytest.mark.parametrize(
    "name",
    [
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "HF_TOKEN",
        "HF_HOME",
        "MY_SERVICE_PASSWORD",
        "DB_CREDENTIALS",
        "x_api_key",
        "SLACK_WEBHOOK",
        "CUDA_TOKEN",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


def test_scrub_environment_keeps_what_builds_need_and_drops_secrets() -> None:
    env = {
        "PATH": "/bin",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "0",
        "TORCH_CUDA_ARCH_LIST": "9.0",
        "PYTHONPATH": "/x",
        "LD_LIBRARY_PATH": "/lib",
        "TRITON_CACHE_DIR": "/t",
        "ANTHROPIC_API_KEY": "sk-ant",
        "OPENAI_API_KEY": "sk-oa",
        "AWS_ACCESS_KEY_ID": "AK",
        "GITHUB_TOKEN": "ghp",
        "HF_TOKEN": "hf",
        "RANDOM_APP_SETTING": "1",
        "TORCH_HUB_TOKEN": "tok",
    }
    kept = scrub_environment(env, keep=("RANDOM_APP_SETTING", "GITHUB_TOKEN"))
    assert kept == {
        "PATH": "/bin",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "0",
        "TORCH_CUDA_ARCH_LIST": "9.0",
        "PYTHONPATH": "/x",
        "LD_LIBRARY_PATH": "/lib",
        "TRITON_CACHE_DIR": "/t",
        "RANDOM_APP_SETTING": "1",
    }


def test_sandboxed_processes_allocate_cuda_memory_in_expandable_segments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The worker's and the judge's GPU reserve stays at their live peak (a freed float32 block
    # reused for the float64 truth); a user's own allocator setting is kept.
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    evaluator = SandboxEvaluator(KernelBenchTask("x", device="cpu"), SandboxLimits())
    try:
        assert evaluator.environment(tmp_path)["PYTORCH_CUDA_ALLOC_CONF"] == (
            "expandable_segments:True"
        )
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
        assert evaluator.environment(tmp_path)["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    finally:
        evaluator.close()


def test_task_options_are_validated() -> None:
    with pytest.raises(KernelproError, match="shape_check='sometimes'"):
        KernelBenchTask("x", shape_check="sometimes")
    with pytest.raises(KernelproError, match="device='tpu'"):
        KernelBenchTask("x", device="tpu")
    assert SandboxLimits().memory_limit_mb is None or SandboxLimits().memory_limit_mb >= 1024


@pytest.mark.parametrize("chosen", [12345.678, -0.000123456, 31337.0])
def test_a_wrong_outputs_reason_quotes_positions_and_error_size_not_the_kernels_values(
    chosen: float,
) -> None:
    """The reason reaches the next prompt: a value the kernel chose would be a channel out
    of the sandbox (one number per evaluation)."""
    ref = torch.zeros(4, 4)
    out = ref.clone()
    out[1, 2] = chosen
    decided = _verdict(ref, out)
    assert decided.failure is not None
    assert "Worst at index (1, 2): error " in decided.failure
    digits = f"{abs(chosen):.7g}".replace(".", "").lstrip("0")[:5]
    assert digits not in decided.failure.replace(".", ""), decided.failure
    assert "got" not in decided.failure


def test_an_integer_outputs_reason_quotes_the_difference_not_the_value() -> None:
    ref = torch.zeros(3, dtype=torch.int64)
    out = ref.clone()
    out[2] = 4242
    decided = _verdict(ref, out)
    assert decided.failure is not None
    assert "first at index (2,): error 4.2e+03." in decided.failure
    assert "4242" not in decided.failure
