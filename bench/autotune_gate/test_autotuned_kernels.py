"""Autotuned Triton kernels as pytest-kernelpro items, for `bench/autotune_gate.py`.

Written for this bench in the shape Triton kernel libraries use: row-wise LayerNorm and
softmax autotuned over `num_warps` with the row length as the key, an elementwise GELU
autotuned over block sizes, and a tiled GEMM autotuned over tile shapes and pipeline stages
with (M, N, K) as the key. Several of their configs run within a few percent of each other,
so the pick can differ from one process to the next, as it does in real libraries.

`KP_BENCH_SLOW="layer_norm=0.05"` makes an item do that much more work of its own kind on the
GPU (a real slowdown): LayerNorm normalizes 5% more rows (the input's storage holds them; the
output returned is the first M rows), in the same single launch.

`KP_BENCH_SMALL=1` (with `TRITON_INTERPRET=1`) shrinks everything for a CPU dry run through
Triton's interpreter; there the autotuner times its configs with the host clock (Triton's own
benchmarker needs a GPU driver).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SMALL = os.environ.get("KP_BENCH_SMALL") == "1"
ROWS, COLS = (8, 64) if SMALL else (16384, 4096)
GEMM = 32 if SMALL else 4096
ELEMENTS = 1 << 10 if SMALL else 1 << 26
DTYPE = torch.float32 if SMALL else torch.bfloat16
SLOW = dict(
    (name, float(value))
    for name, _, value in (
        item.partition("=") for item in os.environ.get("KP_BENCH_SLOW", "").split(",") if item
    )
)


def _host_bench(kernel_call, quantiles):  # noqa: ANN001, ANN202 - Triton's do_bench signature
    times = []
    for _ in range(3):
        start = time.perf_counter()
        kernel_call()
        times.append(time.perf_counter() - start)
    return [sorted(times)[1]] * len(quantiles)


DO_BENCH = _host_bench if os.environ.get("TRITON_INTERPRET") == "1" else None


def kernel_item(**options):  # noqa: ANN003, ANN201
    """The kernelpro marker; the CPU dry run puts the Triton items on the CPU (interpreter)."""
    return pytest.mark.kernelpro(**options, **({"device": "cpu"} if SMALL else {}))


WARPS = [triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)]


@triton.autotune(configs=WARPS, key=["N"], do_bench=DO_BENCH)
@triton.jit
def _layer_norm_fwd(X, Y, W, B, stride, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, (xc * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


@triton.autotune(configs=WARPS, key=["N"], do_bench=DO_BENCH)
@triton.jit
def _softmax_fwd(X, Y, stride, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(Y + row * stride + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (1024, 2048, 4096) for w in (4, 8)],
    key=["n_elements"],
    do_bench=DO_BENCH,
)
@triton.jit
def _gelu(X, Y, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


def _gemm_configs() -> list[triton.Config]:
    shapes = ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
              (128, 64, 32, 4, 4), (128, 128, 64, 3, 8), (256, 128, 64, 3, 8))  # fmt: skip
    if SMALL:
        shapes = ((32, 32, 32, 1, 4), (16, 32, 16, 1, 4))  # fmt: skip
    return [
        triton.Config({"BM": m, "BN": n, "BK": k, "GROUP": 8}, num_stages=s, num_warps=w)
        for m, n, k, s, w in shapes
    ]


# K is a compile-time constant: the loop bound is then a Python int (Triton's interpreter
# cannot index with a runtime scalar under numpy 2); on the GPU the kernel is specialized to
# the one K it runs.
@triton.autotune(configs=_gemm_configs(), key=["M", "N", "K"], do_bench=DO_BENCH)
@triton.jit
def _matmul(A, B, C, M, N, K: tl.constexpr, sam, sak, sbk, sbn, scm, scn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP * tiles_n)
    first_m = group * GROUP
    size_m = tl.minimum(tiles_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * tiles_n)) % size_m
    pid_n = (pid % (GROUP * tiles_n)) // size_m
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    a = A + rm[:, None] * sam + rk[None, :] * sak
    b = B + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        acc += tl.dot(
            tl.load(a, mask=rk[None, :] < left, other=0.0),
            tl.load(b, mask=rk[:, None] < left, other=0.0),
        )
        a += BK * sak
        b += BK * sbk
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    c = C + cm[:, None] * scm + cn[None, :] * scn
    tl.store(c, acc.to(C.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


def _extra_rows(name: str, rows: int) -> int:
    return int(round(rows * SLOW.get(name, 0.0)))


def rows_inputs(name: str):  # noqa: ANN201
    def make(device, generator=None):  # noqa: ANN001, ANN202
        extra = _extra_rows(name, ROWS)
        # The storage holds the extra rows a slowed variant also processes.
        full = torch.randn(ROWS + extra, COLS, device=device, dtype=DTYPE, generator=generator)
        return (full[:ROWS],)

    return make


def layer_norm_inputs(device, generator=None):  # noqa: ANN001, ANN201
    (x,) = rows_inputs("layer_norm")(device, generator)
    w = torch.randn(COLS, device=device, dtype=DTYPE, generator=generator)
    b = torch.randn(COLS, device=device, dtype=DTYPE, generator=generator)
    return x, w, b


def _rows_launched(x: torch.Tensor, name: str) -> int:
    return x.shape[0] + _extra_rows(name, x.shape[0])


@kernel_item(
    reference=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
    inputs=layer_norm_inputs,
)
def layer_norm(x, w, b):  # noqa: ANN001, ANN201
    rows = _rows_launched(x, "layer_norm")
    y = torch.empty((rows, x.shape[1]), device=x.device, dtype=x.dtype)
    block = triton.next_power_of_2(x.shape[1])
    _layer_norm_fwd[(rows,)](x, y, w, b, x.stride(0), x.shape[1], 1e-5, BLOCK_N=block)
    return y[: x.shape[0]]


@kernel_item(reference=lambda x: torch.softmax(x, -1), inputs=rows_inputs("softmax"))
def softmax(x):  # noqa: ANN001, ANN201
    rows = _rows_launched(x, "softmax")
    y = torch.empty((rows, x.shape[1]), device=x.device, dtype=x.dtype)
    _softmax_fwd[(rows,)](x, y, x.stride(0), x.shape[1], BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y[: x.shape[0]]


def gelu_inputs(device, generator=None):  # noqa: ANN001, ANN201
    return (torch.randn(ELEMENTS, device=device, dtype=DTYPE, generator=generator),)


@kernel_item(reference=lambda x: F.gelu(x), inputs=gelu_inputs)
def gelu(x):  # noqa: ANN001, ANN201
    y = torch.empty_like(x)
    n = x.numel()
    _gelu[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y


def gemm_inputs(device, generator=None):  # noqa: ANN001, ANN201
    a = torch.randn(GEMM, GEMM, device=device, dtype=DTYPE, generator=generator)
    b = torch.randn(GEMM, GEMM, device=device, dtype=DTYPE, generator=generator)
    return a, b


@kernel_item(reference=torch.matmul, inputs=gemm_inputs)
def matmul(a, b):  # noqa: ANN001, ANN201
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)

    def grid(meta):  # noqa: ANN001, ANN202
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

    _matmul[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                  c.stride(0), c.stride(1))  # fmt: skip
    return c
