"""Profiling layer: what the micro-profiling tools read about a kernel item.

Modules (none imports torch at import time):
  model           the contract: KernelMetrics, SassSummary, PtxasReport, ProfileReport, ...
  ncu_csv         `ncu --csv --page raw` parsing (any locale's number format)
  metrics_catalog the curated ~60 Hopper metrics by category, checked against --query-metrics
  ncu             the ncu runner (one invocation, NVTX-filtered, failures -> NotCollected)
  target          the program profilers launch: `python -m pytest_kernelpro.profile.target`
  problem_loader  a kernel item's Problem rebuilt in another process (target, the sandbox)
  capture         `capture_extensions()`: records every load_inline/load build (+ ptxas)
  ptxas, sass, symbols, linkage   ptxas -v, cuobjdump SASS/symbols, nm/readelf parsing
  timeline        kineto (or nsys) timeline summaries
  collect, render profile_kernel_item() and the report section
"""
