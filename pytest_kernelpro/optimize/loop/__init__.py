"""What `--kernelpro-optimize` hands a user: checks before any work (`preflight`), run
folders (`runs`), live progress (`progress`), patches for the kernel's own file (`site`,
with `search.patch`), a replay that tolerates measurement noise (`replay`) and the summary
(`summary`). `optimize.py` composes them around the search.
"""
