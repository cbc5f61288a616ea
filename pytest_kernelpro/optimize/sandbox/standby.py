"""A sandboxed process started ahead of its task: it imports torch and the project, then
waits for the order that says which trusted entry point to run (`pool.py` starts and hands
these over).

    python -m pytest_kernelpro.optimize.sandbox.standby --order DIR/order.json --ready DIR/ready

Its life: started inside the sandbox like any worker (the same namespaces, scratch directory,
environment and memory watch), it imports the heavy modules and writes `--ready`, then polls
for `--order` (written by the evaluator by an atomic rename): `{"module": ..., "argv": [...]}`.
The module must be one of `ENTRY_POINTS` (the worker or the judge), and its `main(argv)` runs
in this process, which then exits as that entry point does. One order per process: a standby
never serves a second candidate, so nothing one candidate did reaches another.

CUDA is not touched before the order (importing torch does not start it), so the process
that runs the order starts CUDA itself, as a freshly launched worker would.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

# The only entry points an order may name: both trusted code the project ships.
ENTRY_POINTS = (
    "pytest_kernelpro.optimize.sandbox.worker",
    "pytest_kernelpro.optimize.sandbox.judge",
)
# What a worker and a judge import before their first line of real work (torch, the harness
# with measure/ and problem/, the judge).
PRELOAD = (
    "torch",
    "pytest_kernelpro.optimize.sandbox.harness",
    "pytest_kernelpro.optimize.sandbox.judge",
    "pytest_kernelpro.optimize.sandbox.worker",
    "pytest_kernelpro.optimize.sandbox.handles",
    "pytest_kernelpro.fileio",
)
POLL_S = 0.005  # the order is picked up this soon after it is written
MAX_IDLE_S = 3600.0  # a standby nobody ordered ends itself after this long


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_kernelpro.optimize.sandbox.standby")
    parser.add_argument("--order", required=True, type=Path)
    parser.add_argument("--ready", required=True, type=Path)
    args = parser.parse_args(argv)
    started = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    args.ready.write_text(f"{time.monotonic():.3f} {time.monotonic() - started:.3f}\n")
    deadline = time.monotonic() + MAX_IDLE_S
    while not args.order.exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(POLL_S)
    order = json.loads(args.order.read_text(encoding="utf-8"))
    module = order.get("module")
    if module not in ENTRY_POINTS or not isinstance(order.get("argv"), list):
        sys.stderr.write(f"kernelpro standby: refused order for {module!r}\n")
        return 2
    entry = importlib.import_module(module)
    sys.argv = [module, *map(str, order["argv"])]
    code = entry.main(list(map(str, order["argv"])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))


if __name__ == "__main__":
    sys.exit(main())
