import torch, numpy as np, ctypes
ctypes.CDLL(None).mallopt(-3, 32*2**20); ctypes.CDLL(None).mallopt(-1, 2**30)
from pytest_kernelpro.measure.timing.budget import TimingBudget
from pytest_kernelpro.measure.timing.cpu import time_cpu
torch.set_num_threads(1)
keep=[]
for i in range(8):
    x = torch.randn(4_000_000)
    keep.append(x)  # keep so the next allocation gets new pages
    r = time_cpu(lambda: x.sum(), TimingBudget(max_time_s=0.5, clock_anchor="on", working_set_bytes=16_000_000))
    print(i, round(np.median(r.anchor["kernel_s"])*1e6), hex(x.data_ptr()))
