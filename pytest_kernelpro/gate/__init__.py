"""The regression gate and its reports, as plain functions over `KernelRecord` lists.

- `baseline`: `save_baseline`, `load_baseline` (YAML; `BaselineError` names the fix)
- `verdict`: `decide_verdict` -> `Verdict`, on the basis `verdict_basis.choose_basis`
  chooses (from the facts `basis_inputs` reads of a record); `confirmation`:
  `needs_confirmation`, `confirm` (a provisional regression settled by an independent
  re-measurement), the autotune picks against the baseline's, a changed environment named
- `report`: `build_report`, `write_json_report`, `merge_reports`, `render_terminal_table`
- the texts made from one record: `format.item_section` (the item's report section),
  `format.terminal_row` (its terminal-table row), `comment` (its PR-comment row and details,
  and the literal-text escaping), `prompt_reference` (the optimize
  prompt's reference analysis), `plot` (the roofline plot's texts); `render_session`:
  the texts about the session as a whole; `format` also holds the texts of an optimize
  search's summary
- `junit`: `junit_properties`, `read_junit_records`
- `comment`: `render_comment`; `comment_check`: `check_report` (the artifact's types, first);
  `comment_cli`: `comment_main` (`kernelpro comment`, `--post` through `github.post_comment`)
- `offline_gate`: `compare_main` (`kernelpro compare BASE HEAD`: two saved runs, offline)
- `plot`: `roofline_plot` (PNG), `roofline_figure` (the matplotlib Figure), `roofline_points`

Nothing here is imported by the plugin at import time; import the module you need.
"""
