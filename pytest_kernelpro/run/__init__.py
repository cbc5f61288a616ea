"""One kernel item's run, and the session that hosts it.

Collection makes a `KernelItem` (`items.py`); running it is `item_runner.py`: the entry, its
guards, the order, the values each stage needs, looked up once, and the stages themselves
(check, time, recheck, roofline, profile, gate), each filling the item's `KernelRecord`.
What the run knows and is bound by is `context.py`: `ItemSettings`, `ItemRun`, `Profiling`,
the item's time limit, and what the item's process chose (autotune picks, library settings,
versions). `fresh_process.py` re-measures a provisional regression in a fresh process.
`session.py` holds what the items of one pytest session share (settings, ceilings per device,
the baseline, the records) and writes the session's outputs (the texts of one record are
`gate/`'s). The time limit (`context.py`), `isolate.py` and `workers.py` keep one item from
taking the session down (a time limit, a subprocess per item, one GPU per xdist worker). Other
plugins (the optimizer) work on a measured item through the `pytest_kernelpro_item_measured`
hook; nothing here imports them.

Nothing below `run/` imports it; `plugin.py` (hooks only) is its one caller from pytest.
"""
