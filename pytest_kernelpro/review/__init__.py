"""The `kernelpro` command: what a reviewer and the CI workflow make of a finished run's saved
files (the JSON report, JUnit XML, the run history, the records log), and the machine's
ceilings re-measured. A check session imports none of it.

- `cli`: `main`, the `kernelpro` command: dispatches to the subcommands below and those
  other parts add (`kernelpro.commands` entry points)
- `calibrate`: `calibrate_main` (`kernelpro calibrate`: the ceilings re-measured, cached and
  printed; `measure/` does the measuring)
- `comment`: `render_comment` (the PR comment: speedup table, roofline bars, details);
  `comment_check`: `check_report` (the artifact's types, first); `comment_cli`:
  `comment_main` (`kernelpro comment`, `--post` through `github.post_comment`)
- `github`: the GitHub REST calls the comment and the approval need
- `approval`: `approval_main` (`kernelpro approval`: the PR's head commit approved by a
  maintainer before its code runs on the GPU runner)
- `plot`: `roofline_plot` (PNG), `roofline_figure` (the matplotlib Figure), `roofline_points`
- `offline_gate`: `compare_main` (`kernelpro compare BASE HEAD`: two saved runs, offline)
- `runs`: `history_main` (`kernelpro history`), `resolve_run` (compare's run references)
- `junit_read`: `read_junit_records` (the records a JUnit file's properties carry);
  `report_load`: `load_report`, `records_of`, `merge_report_dicts` (a JSON report read back)
- `records_report`: `report_main` (`kernelpro report`: the JSON report and JUnit rebuilt
  from a records log; `--check` fails on kernels that left no record)
"""
