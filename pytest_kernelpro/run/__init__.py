"""One kernel item's run, and the session that hosts it.

Collection makes a `KernelItem` (`items.py`); running it (`item_runner.py`: the entry, its
guards, the order) goes through the stages (`stages.py`: check, time, recheck, roofline,
profile, gate; `optimize.py`), each filling the item's `KernelRecord`. `session.py` holds what
the items of one pytest session share (settings, ceilings per device, the baseline, the
records); `reporting.py` turns records into the session's outputs (the texts of one record are `gate/`'s).
`limits.py`, `isolate.py` and `workers.py` keep one item from taking the session down (a time
limit, a subprocess per item, one GPU per xdist worker). `optimize_search.py` composes the
optimize loop from `search/`, `agents/` and `analysis/`; `shims.py` is the KernelBench view of
a marked kernel that the sandbox runs.

Nothing below `run/` imports it; `plugin.py` (hooks only) is its one caller from pytest.
"""
