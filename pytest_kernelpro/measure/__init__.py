"""What the gate measures of a kernel: correctness, time and its place on the roofline.

- `output_rule.py`: the correctness rule, how close an output must be given the
  reference's own error against its higher-precision truth (the dtype tolerances where no
  truth decides), compared leaf by leaf; `correctness_check.py`: the trials that run the
  kernel and the reference on fresh inputs with poisoned allocations, the reference's
  reduced precision (`fp32_precision.py`; on CUDA `fp32_tensor_cores.py`) and its re-run in
  float64 (the truth), the re-check after timing. The optimizer's sandbox decides with these
  too (`optimize/sandbox/measurement.py`), so the gate and the search cannot disagree;
- `timing/`: one timer interface (`timing.time_kernel`), with the budget, the adaptive
  rounds and the statistics of their samples (`budget.py`), the CPU timer with its anchor,
  the CPU's load and the thread policy for CPU kernels (`cpu.py`), and the CUDA timer
  (`cuda.py`);
- `clocks.py`: NVML clocks and throttle reasons while a GPU kernel is timed;
- `devices.py`: the datasheet table of GPUs; `ceilings.py`: the measured ceilings
  (bandwidth, FLOP/s per precision) of this machine, their probes and when to trust them;
  `calibrate.py`: the `kernelpro calibrate` command;
- `flops.py`: the reference's FLOPs and bytes, op by op, and the recorder that prices them;
  `roofline.py`: the roofline of the reference, a kernel's share of it and an impossible time,
  and on CUDA the faster units fp32 matrix work may run on (`matrix_paths.py`);
- `environment.py` (`cuda_versions.py` on CUDA): the versions and library settings that change
  the code a kernel runs; `autotune_capture.py`: what its autotuners chose;
- `gpu_memory.py`: an item's GPU memory against its footprint.
"""
