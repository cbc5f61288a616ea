"""The optimizer: everything `--kernelpro-optimize` and the optimizer's `kernelpro` commands use.

A `--kernelpro-check` session never imports this package: the item's run reaches it through
one seam, `optimize.loop.item.optimize_item`, called only when the session optimizes.

- `loop/`: the search composed for one kernel item, its run folder, patches and summary.
- `search/`: the algorithms (MCTS, greedy), reward, budget, trajectory, ranking.
- `sandbox/`: the isolated worker that builds, checks and times a candidate, and the trusted judge.
- `agents/`: the LLM agents (programmer, profiling, benchmarking) and their model backends.
- `build/`, `cutlass/`: candidate CUDA builds and CUTLASS support.
- `candidate_profile/`: every correct candidate profiled like a user's kernel item.
- `dask/`: builds and evaluations as tasks on a Dask cluster.
"""
