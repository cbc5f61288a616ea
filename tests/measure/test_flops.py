"""Per-op counting rules: categories, FLOP formulas, bytes, and the peak each op runs at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure.devices import find_device_spec  # noqa: E402
from pytest_kernelpro.measure.flops import (  # noqa: E402
    is_no_cost,
    op_bytes,
    op_category,
    op_flops,
    select_peak_key,
    tensor_bytes,
    tf32_flags,
)

aten = torch.ops.aten
H100 = find_device_spec("NVIDIA H100 80GB HBM3")
L4 = find_device_spec("NVIDIA L4")


@pytest.mark.parametrize(
    ("category", "dtype", "device", "tf32", "cudnn_tf32", "spec", "expected"),
    [
        ("gemm", "float32", "cuda", True, False, H100, "tf32_tensor"),
        ("gemm", "float32", "cuda", False, True, H100, "fp32"),
        ("attention", "float32", "cuda", True, False, H100, "tf32_tensor"),
        ("conv", "float32", "cuda", False, True, H100, "tf32_tensor"),
        ("conv", "float32", "cuda", True, False, H100, "fp32"),
        ("gemm", "bfloat16", "cuda", False, False, H100, "bf16_tensor"),
        ("conv", "float16", "cuda", False, False, H100, "fp16_tensor"),
        ("gemm", "float8_e4m3fn", "cuda", False, False, H100, "fp8_tensor"),
        ("gemm", "int8", "cuda", False, False, H100, "int8_tensor"),
        ("gemm", "float64", "cuda", False, False, H100, "fp64_tensor"),
        ("gemm", "float64", "cuda", False, False, L4, "fp64"),  # Ada: no DMMA
        ("gemm", "float64", "cuda", False, False, None, "fp64_tensor"),
        ("elementwise", "bfloat16", "cuda", True, True, H100, "fp32"),
        ("softmax", "float16", "cuda", True, True, H100, "fp32"),
        ("reduction", "float64", "cuda", True, True, H100, "fp64"),
        ("norm", "float32", "cuda", True, True, H100, "fp32"),
        ("gemm", "float32", "cpu", True, True, None, "fp32"),
        ("gemm", "bfloat16", "cpu", False, False, None, "bf16"),
        ("conv", "float16", "cpu", False, False, None, "fp16"),
        ("attention", "bfloat16", "cpu", False, False, None, "fp32"),
        ("softmax", "bfloat16", "cpu", False, False, None, "fp32"),
        ("elementwise", "float64", "cpu", False, False, None, "fp64"),
        ("elementwise", "int64", "cpu", False, False, None, "fp32"),
    ],
)
def test_select_peak_key(
    category: str,
    dtype: str,
    device: str,
    tf32: bool,
    cudnn_tf32: bool,
    spec: object,
    expected: str,
) -> None:
    assert select_peak_key(category, dtype, device, tf32, cudnn_tf32, spec) == expected  # type: ignore[arg-type]


@pytest.fixture
def restore_tf32() -> Iterator[None]:
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch < 2.9 has no fp32_precision API")
    saved = (matmul.fp32_precision, conv.fp32_precision)
    yield
    matmul.fp32_precision, conv.fp32_precision = saved


@pytest.mark.usefixtures("restore_tf32")
def test_tf32_flags_follow_torch_settings() -> None:
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    assert tf32_flags() == (True, False)
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    assert tf32_flags() == (False, True)


@pytest.mark.parametrize(
    ("op", "category"),
    [
        (aten.mm.default, "gemm"),
        (aten.addmm.default, "gemm"),
        (aten.convolution.default, "conv"),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, "attention"),
        (aten._softmax.default, "softmax"),
        (aten._log_softmax.default, "softmax"),
        (aten.native_layer_norm.default, "norm"),
        (aten.native_batch_norm.default, "norm"),
        (aten.sum.dim_IntList, "reduction"),
        (aten.nll_loss_forward.default, "reduction"),
        (aten.cumsum.default, "scan"),
        (aten.clone.default, "copy"),  # tagged pointwise by torch, but it is a copy
        (aten._to_copy.default, "copy"),
        (aten.cat.default, "copy"),
        (aten.gelu.default, "elementwise"),
        (aten.add.Tensor, "elementwise"),
        (aten.relu.default, "elementwise"),
        (aten.where.self, "elementwise"),
        (aten.nonzero_static.default, "other"),
    ],
)
def test_op_category(op: object, category: str) -> None:
    assert op_category(op) == category


def test_views_and_allocations_cost_nothing() -> None:
    for op in (aten.view.default, aten.t.default, aten.expand.default, aten.empty.memory_format):
        assert is_no_cost(op)
    assert not is_no_cost(aten.clone.default)


def test_broadcast_tensor_counts_once() -> None:
    bias = torch.randn(128)
    assert tensor_bytes(bias.expand(64, 128)) == 128 * 4
    assert tensor_bytes(torch.randn(64, 128).t()) == 64 * 128 * 4
    assert tensor_bytes(torch.empty(0, 5)) == 0


def test_bytes_of_in_place_and_copy_ops() -> None:
    x, y = torch.randn(1000), torch.randn(1000)
    out = aten.add_.Tensor(x, y)
    # read x, read y, write x
    assert op_bytes(aten.add_.Tensor, (x, y), {}, out) == 3 * 4000
    dst = torch.empty(1000)
    # copy_ reads only the source
    assert op_bytes(aten.copy_.default, (dst, y), {}, dst) == 2 * 4000
    # a bf16 -> fp32 cast reads 2 bytes and writes 4 per element
    h = torch.randn(1000).bfloat16()
    assert op_bytes(aten._to_copy.default, (h,), {"dtype": torch.float32}, h.float()) == 6000


def _flops(op: object, *args: object) -> float:
    out = op(*args)  # type: ignore[operator]
    category = op_category(op)
    value, note = op_flops(op, category, args, {}, out)
    assert note is None
    return value


def test_norm_formulas() -> None:
    x, w, b = torch.randn(32, 64), torch.randn(64), torch.randn(64)
    n = x.numel()
    assert _flops(aten.native_layer_norm.default, x, [64], w, b, 1e-5) == 7 * n
    assert _flops(aten.native_layer_norm.default, x, [64], None, None, 1e-5) == 5 * n
    img = torch.randn(4, 3, 5, 5)
    c = torch.randn(3)
    mean, var = torch.zeros(3), torch.ones(3)
    eval_bn = _flops(aten.native_batch_norm.default, img, c, c, mean, var, False, 0.1, 1e-5)
    train_bn = _flops(
        aten.native_batch_norm.default, img, c, c, mean.clone(), var.clone(), True, 0.1, 1e-5
    )
    assert (eval_bn, train_bn) == (4 * img.numel(), 7 * img.numel())
    assert _flops(aten.native_group_norm.default, img, c, c, 4, 3, 25, 1, 1e-5) == 7 * img.numel()
    if hasattr(aten, "_fused_rms_norm"):
        value, _ = op_flops(aten._fused_rms_norm.default, "norm", (x, [64], w, 1e-5), {}, None)
        assert value == 4 * n


def test_reduction_scan_softmax_loss_formulas() -> None:
    x = torch.randn(16, 32)
    n = x.numel()
    assert _flops(aten.sum.dim_IntList, x, [1]) == n
    assert _flops(aten.amax.default, x, [1]) == n
    assert _flops(aten.var.correction, x, [1]) == 4 * n
    assert _flops(aten.logsumexp.default, x, [1]) == 4 * n
    assert _flops(aten.linalg_vector_norm.default, x) == 2 * n
    assert _flops(aten.cumsum.default, x, 0) == n
    assert _flops(aten.logcumsumexp.default, x, 0) == 3 * n
    assert _flops(aten._softmax.default, x, 1, False) == 5 * n
    assert _flops(aten._log_softmax.default, x, 1, False) == 5 * n
    assert _flops(aten.mse_loss.default, x, x + 1) == 3 * n
    target = torch.randint(0, 32, (16,))
    assert _flops(aten.nll_loss_forward.default, x, target, None, 1, -100) == 16


def test_elementwise_counts_output_elements() -> None:
    x, row = torch.randn(16, 32), torch.randn(32)
    assert _flops(aten.add.Tensor, x, row) == 16 * 32  # broadcast: the output's elements
    assert _flops(aten.exp.default, x) == 16 * 32  # a transcendental counts 1, documented
    assert _flops(aten.clone.default, x) == 0  # a copy moves bytes only


def test_gemm_flops_come_from_torch_registry() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert _flops(aten.mm.default, a, b) == 2 * 8 * 16 * 4
    batch = torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    assert _flops(aten.bmm.default, *batch) == 2 * 3 * 8 * 16 * 4
    v = torch.randn(16)
    assert _flops(aten.mv.default, a, v) == 2 * 8 * 16


def test_unknown_op_is_noted() -> None:
    x = torch.tensor([0, 1, 0, 2])
    out = aten.nonzero_static.default(x, size=4)
    value, note = op_flops(aten.nonzero_static.default, "other", (x,), {"size": 4}, out)
    assert value == 0
    assert note is not None
    assert "no FLOP formula" in note
