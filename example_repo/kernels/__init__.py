"""Example kernels: PyTorch (runs anywhere), Triton and CUDA (need a GPU)."""
