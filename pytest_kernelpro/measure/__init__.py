"""What the gate measures of a kernel: correctness, time and its place on the roofline.

- `correctness.py`: trials on fresh inputs with poisoned allocations, the re-check after
  timing; `tolerance.py`: the dtype tolerances, the TF32/bf16 relaxation and its detection;
  `truth.py`: the reference re-run in float64, the truth; `accuracy.py`: how close an
  output must be, the rule measured against that truth;
  `compare.py`: output comparison and its verdict. The optimizer's sandbox decides with
  these too (`optimize/sandbox/measurement.py`), so the gate and the search cannot disagree;
- `timing/`: one timer interface (`timing.time_kernel`), with the budget, the adaptive
  rounds and the statistics of their samples (`budget.py`), the CPU timer with its anchor,
  the CPU's load and the thread policy for CPU kernels (`cpu.py`), and the CUDA timer
  (`cuda.py`);
- `clocks.py`: NVML clocks and throttle reasons while a GPU kernel is timed;
- `devices.py`: the datasheet table of GPUs; `ceilings.py`: the measured ceilings
  (bandwidth, FLOP/s per precision) of this machine, their probes and when to trust them;
  `calibrate.py`: the `kernelpro calibrate` command;
- `flops.py`: the reference's FLOPs and bytes, op by op, and the recorder that prices them;
  `roofline.py`: the roofline of the reference, a kernel's share of it and an impossible time;
- `gpu_memory.py`: an item's GPU memory against its footprint.
"""
