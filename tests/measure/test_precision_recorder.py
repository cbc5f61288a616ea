"""The reference's fp32-matmul recording (`measure.fp32_precision.run_recording_precision`) sees
the ops without importing torch._dynamo: every fresh sandboxed process that checks a
reference on CUDA records once, and the import cost it seconds there.

The recorder only looks at tensors on a tensor-core device; these tests add "cpu" to
`TENSOR_CORE_DEVICES` in a fresh interpreter so that the CPU matmul counts, which is the same
code path a CUDA tensor takes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from pytest_kernelpro.measure import fp32_precision

    fp32_precision.TENSOR_CORE_DEVICES = ("cuda", "cpu")
    if sys.argv[1] == "dynamo-loaded":
        import torch._dynamo  # noqa: F401  (a process that already has it, e.g. the gate's)
    torch.backends.cuda.matmul.allow_tf32 = sys.argv[2] == "tf32"
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    out, reduced = fp32_precision.run_recording_precision(torch, lambda: a @ b, "cpu")
    assert torch.equal(out, a @ b)
    # The same op outside any recording: the mode must be gone.
    _, none = fp32_precision.run_recording_precision(torch, lambda: a + b, "cpu")
    print(json.dumps({"reduced": reduced, "add": none,
                      "dynamo": "torch._dynamo" in sys.modules}))
    """
)


def _run(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_recording_a_matmul_does_not_import_dynamo() -> None:
    got = _run("fresh", "tf32")
    assert got == {"reduced": "tf32", "add": None, "dynamo": False}


def test_recording_without_tf32_finds_full_precision() -> None:
    assert _run("fresh", "ieee") == {"reduced": None, "add": None, "dynamo": False}


def test_recording_still_works_when_dynamo_is_loaded() -> None:
    assert _run("dynamo-loaded", "tf32") == {"reduced": "tf32", "add": None, "dynamo": True}
