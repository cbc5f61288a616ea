"""One kernel item's run, and the session that hosts it.

Collection makes a `KernelItem` (`items.py`); running it (`item_runner.py`: the entry, its
guards, the order) goes through the stages (`stages.py`: check, time, recheck, roofline,
profile, gate), each filling the item's `KernelRecord`. `session.py` holds what
the items of one pytest session share (settings, ceilings per device, the baseline, the
records); `reporting.py` turns records into the session's outputs (the texts of one record are `gate/`'s).
`limits.py`, `isolate.py` and `workers.py` keep one item from taking the session down (a time
limit, a subprocess per item, one GPU per xdist worker). The optimize stage is the one call
into `pytest_kernelpro.optimize` (`optimize.loop.item.optimize_item`), made only under
`--kernelpro-optimize`.

Nothing below `run/` imports it; `plugin.py` (hooks only) is its one caller from pytest.
"""
