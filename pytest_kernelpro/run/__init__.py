"""One kernel item's run, and the session that hosts it.

- `items.py`: collection makes a `KernelItem`; `item_runner.py` runs it (the entry, its
  guards, the item's state built once, the stages in order); `context.py`: what the run knows
  and is bound by (`ItemSettings`, `ItemRun`, `Profiling`, the time limit, what the item's
  process chose); `stages.py` and `profile_stage.py` (imported only when an item is profiled):
  the stages, each a function of that state and values filling its part of the record;
- `fresh_process.py` re-measures a provisional regression in a fresh process; `isolate.py`
  and `workers.py` keep one item from taking the session down (a subprocess per item, one GPU
  per xdist worker);
- `session.py`: what the items of one pytest session share (settings, ceilings per device,
  the baseline, the records), and the session's outputs (their texts are `gate/`'s).

Other plugins (the optimizer) work on a measured item through the
`pytest_kernelpro_item_measured` hook; nothing here imports them. `plugin.py` (hooks only) is
this package's one caller from pytest.
"""
