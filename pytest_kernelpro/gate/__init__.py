"""The regression gate and the outputs of a check session, as plain functions over
`KernelRecord` lists: the baseline, the verdict, the session's files and texts. What is made
of a finished run afterwards lives in `pytest_kernelpro/review/`. Nothing here is imported by
the plugin at import time; import the module you need.
"""
