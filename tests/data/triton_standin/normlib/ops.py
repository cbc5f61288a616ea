from . import kernels


def norm_forward(x):
    kernels._norm_kernel[(1,)](x, x.numel())
    return x
