"""The regression gate and the outputs of a check session, as plain functions over
`KernelRecord` lists: the baseline (`baseline`, `baseline_save`), the verdict (`verdict` on
the basis `verdict_basis` chooses, `clock_basis` on a GPU under a clock limit,
`other_device_basis` against another device; what differs beside the code `run_differences`;
`confirmation`), the session's files (`report`, `report_read`, `junit`) and texts (`format`
for one record and a note, `render_session` for the session, `condition_notes`,
`process_notes`). What is made of a finished run afterwards lives in
`pytest_kernelpro/review/`. Nothing here is imported by the plugin at import time; import the
module you need.
"""
