"""The optimizer: a pytest plugin of its own (`plugin.py`, entry point `kernelpro_optimize`)
and everything `--kernelpro-optimize` and the optimizer's `kernelpro` commands use.

No module outside this package imports it. Its plugin registers its options (`settings.py`)
and, under `--kernelpro-optimize` (`search_hooks.py`), resolves them (`search_config.py`), runs
its preflight and reaches each measured kernel item through the gate's
`pytest_kernelpro_item_measured` hook; a `--kernelpro-check` session loads only `plugin.py`
and `settings.py` of it, and none with `-p no:kernelpro_optimize`.

- `loop/`: the search composed for one kernel item, its run folder, patches and summary.
- `search/`: the algorithms (MCTS, greedy), reward, budget, trajectory, ranking.
- `sandbox/`: the isolated worker that builds, checks and times a candidate, and the trusted judge.
- `agents/`: the LLM agents (programmer, profiling, benchmarking) and their model backends.
- `build/`, `cutlass/`: candidate CUDA builds and CUTLASS support.
- `candidate_profile/`: every correct candidate profiled like a user's kernel item.
- `dask/`: builds and evaluations as tasks on a Dask cluster.
"""
