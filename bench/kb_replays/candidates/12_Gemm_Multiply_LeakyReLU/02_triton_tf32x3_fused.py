"""Strategy: the fused-epilogue Triton GEMM on the tensor cores with 3xTF32 (each fp32 operand
split into a TF32 high part and a remainder, three MMAs): close to fp32 accuracy at
tensor-core speed; bias, multiplier and LeakyReLU applied to the accumulator in registers."""

import torch
import triton
import triton.language as tl
from torch import nn

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 32
PRECISION = "tf32x3"


@triton.jit
def _linear_epilogue(
    a_ptr,
    w_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    sam,
    sak,
    swn,
    swk,
    scm,
    scn,
    multiplier,
    slope,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # C = leaky_relu((A @ W^T + bias) * multiplier): the epilogue runs on the accumulator
    # in registers, so the GEMM's output is written once and never read back.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    in_group = GROUP * num_n
    first_m = (pid // in_group) * GROUP
    group_m = tl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_tile = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    w_tile = w_ptr + rk[:, None] * swk + rn[None, :] * swn  # W^T tile, read from W in place
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        kk = k + rk
        x = tl.load(a_tile, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_tile, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
        a_tile += BK * sak
        w_tile += BK * swk
    bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
    y = (acc + bias[None, :]) * multiplier
    y = tl.where(y > 0, y, y * slope)
    c = c_ptr + rm[:, None] * scm + rn[None, :] * scn
    tl.store(c, y, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = float(multiplier)
        self.negative_slope = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.gemm.weight, self.gemm.bias
        M, K = x.shape
        N = w.shape[0]
        c = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        _linear_epilogue[grid](
            x,
            w,
            b,
            c,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            c.stride(0),
            c.stride(1),
            self.multiplier,
            self.negative_slope,
            BM=BLOCK_M,
            BN=BLOCK_N,
            BK=BLOCK_K,
            GROUP=8,
            PRECISION=PRECISION,
            num_warps=8,
            num_stages=3,
        )
        return c
