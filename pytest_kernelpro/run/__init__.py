"""One kernel item's run, and the session that hosts it.

Collection makes a `KernelItem` (`items.py`); running it is `item_runner.py`: the entry, its
guards, the item's state built once (`context.ItemRun`: device, time limit, threads, resolved
settings, ceilings, baseline entry), and the stages in order, each a function that takes
that state and values and fills its part of the item's `KernelRecord`: `stages.py` (the
correctness trials, the timing, the re-check; the roofline; the gate) and `profile_stage.py`
(imported only when an item is profiled). What the run knows and is bound by is
`context.py`: `ItemSettings`, `ItemRun`, `Profiling`, the item's time limit, and what the item's process chose (autotune
picks, library settings, versions). `fresh_process.py` re-measures a provisional regression
in a fresh process. `session.py` holds what the items of one pytest session share (settings, ceilings per device,
the baseline, the records) and writes the session's outputs (the texts of one record are
`gate/`'s). The time limit (`context.py`), `isolate.py` and `workers.py` keep one item from
taking the session down (a time limit, a subprocess per item, one GPU per xdist worker). Other
plugins (the optimizer) work on a measured item through the `pytest_kernelpro_item_measured`
hook; nothing here imports them.

Nothing below `run/` imports it; `plugin.py` (hooks only) is its one caller from pytest.
"""
