import resource, sys
import torch
if sys.argv[1] == "fix":
    from pytest_kernelpro.measure.timing.cpu import steady_allocator
    print(steady_allocator())
a = torch.ones(1_000_000); b = torch.ones(1_000_000)
(a + b)  # warm
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    c = a + b
    del c
print("faults per call", (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 50)
