"""What the reference's fp32-matmul recording costs a fresh process (CPU is enough).

    python bench/trials/recording_cost.py [--runs 3]

Every sandboxed process that checks a reference on CUDA (the worker, the judge, each final
re-measurement worker, the winner's re-timing) records the reference's first call under a
TorchDispatchMode (`measure.tolerance.run_recording_precision`). This starts N fresh
interpreters that import torch and record one matmul (the CPU counted as a tensor-core device,
the same code path as a CUDA tensor), and prints the seconds of the recording and whether
torch._dynamo got imported, as JSON lines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
import torch
from pytest_kernelpro.measure import tolerance
tolerance.TENSOR_CORE_DEVICES = ("cuda", "cpu")
a = torch.randn(64, 64)
t = time.perf_counter()
tolerance.run_recording_precision(torch, lambda: a @ a, "cpu")
print(json.dumps({"record_s": time.perf_counter() - t, "dynamo": "torch._dynamo" in sys.modules}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.runs):
        # Not from the current directory (`-c` puts it first on sys.path): the package comes
        # from PYTHONPATH, so one checkout can measure another's code.
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        print(done.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
