"""The regression gate and the outputs of a check session, as plain functions over
`KernelRecord` lists.

- `baseline`: `load_baseline` (YAML; `BaselineError` names the fix); `baseline_save`:
  `save_baseline` (--kernelpro-save-baseline: merged, atomic, under a lock)
- `verdict`: `decide_verdict` -> `Verdict`, on the basis `verdict_basis.choose_basis`
  chooses (from the facts `baseline` reads of a record), with the autotune picks against the
  baseline's and a changed environment named; `confirmation`: `needs_confirmation`, `confirm`
  (a provisional regression settled by an independent re-measurement)
- `report`, the files of a session's records: `build_report`, `write_json_report`,
  `save_run` (the run history), `RecordsLog` (every finished record appended as it
  finishes); `report_read` reads them back: `load_report`, `merge_report_dicts`,
  `read_records_log`
- the texts made from one record: `format.item_section` (the item's report section),
  `format.terminal_row` (its terminal-table row); `render_session`: the texts about the
  session as a whole (`render_terminal_table`, the notes and lines under it)
- `junit`: `junit_properties`, `read_junit_records`

What is made of a finished run afterwards (the PR comment, GitHub, the plot, `kernelpro
compare`, `history`, `report`) lives in `pytest_kernelpro/review/`.
Nothing here is imported by the plugin at import time; import the module you need.
"""
