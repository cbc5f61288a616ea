"""`--kernelpro-optimize` as a new user runs it on a project of their own, on the CPU.

Makes a fresh git repository holding one kernel test file written the way the README shows
(a KernelBench level-2 problem, `14_Gemm_Divide_Sum_Scaling`, at 128x8192 @ 8192^T, with the
user's kernel as a straight PyTorch port of the reference), serves an OpenAI-compatible model
on 127.0.0.1 that answers with scripted candidates (a wrong one, a slower one, and the exact
matvec rewrite `x @ colsum(W)`), and runs the plugin as a user would:

1. `pytest --kernelpro-optimize=3 --kernelpro-llm=openai --kernelpro-llm-base-url=URL`
2. `git apply` of the `best.patch` it hands back (if any) in the user's repository;
3. `pytest --kernelpro-only` on the patched repository (the patched kernel must pass its check).

`--layout split` lays the project out as a library would: the kernel in `mykernels/gemm.py`,
the reference in `mykernels/reference.py`, and a test file `tests/test_gemm.py` that imports
both and marks the imported kernel; `--dim` sets the GEMM's K = N (8192 by default). No
`--kernelpro-model` is given: the server serves one model and the plugin takes it.

Prints one JSON line per step (exit status, wall seconds, what was found) and writes them to
`--out`. Usage: `python bench/new_user_optimize.py --out RESULT.json [--layout split --dim 2048]`
(the plugin installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

KERNEL_TEST = """
import pytest
import torch

BATCH, IN, OUT = 128, DIM, DIM


def make_inputs(device):
    x = torch.randn(BATCH, IN, device=device)
    weight = torch.randn(OUT, IN, device=device) * 0.01
    return (x, weight)


def reference(x, weight):
    y = torch.matmul(x, weight.T)
    y = y / 2
    y = torch.sum(y, dim=1, keepdim=True)
    return y * 1.5


@pytest.mark.kernelpro(reference=reference, inputs=make_inputs)
def gemm_divide_sum_scaling(x, weight):
    y = x @ weight.T
    return (y / 2).sum(dim=1, keepdim=True) * 1.5
"""

SPLIT_KERNEL = """
def gemm_divide_sum_scaling(x, weight):
    y = x @ weight.T
    return (y / 2).sum(dim=1, keepdim=True) * 1.5
"""

SPLIT_REFERENCE = """
import torch


def reference(x, weight):
    y = torch.matmul(x, weight.T)
    y = y / 2
    y = torch.sum(y, dim=1, keepdim=True)
    return y * 1.5
"""

SPLIT_TEST = """
import pytest
import torch

from mykernels.gemm import gemm_divide_sum_scaling
from mykernels.reference import reference

BATCH, IN, OUT = 128, DIM, DIM


def make_inputs(device):
    x = torch.randn(BATCH, IN, device=device)
    weight = torch.randn(OUT, IN, device=device) * 0.01
    return (x, weight)


gemm = pytest.mark.kernelpro(reference=reference, inputs=make_inputs)(gemm_divide_sum_scaling)
"""


def write_project(repo: Path, layout: str, dim: int) -> None:
    """The user's repository: one test file, or a package with a test file beside it."""
    if layout == "single":
        (repo / "test_gemm.py").write_text(KERNEL_TEST.replace("DIM", str(dim)), encoding="utf-8")
        return
    (repo / "mykernels").mkdir()
    (repo / "mykernels" / "__init__.py").write_text("", encoding="utf-8")
    (repo / "mykernels" / "gemm.py").write_text(SPLIT_KERNEL, encoding="utf-8")
    (repo / "mykernels" / "reference.py").write_text(SPLIT_REFERENCE, encoding="utf-8")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_gemm.py").write_text(
        SPLIT_TEST.replace("DIM", str(dim)), encoding="utf-8"
    )
    (repo / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\npythonpath = ["."]\n', encoding="utf-8"
    )


MATVEC = """### Strategy: sum the weight's rows first, then one matrix-vector product
The sum over the GEMM's output columns equals x @ colsum(W): K*N multiply-adds become K+N.
```python
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x, weight):
        return (x @ weight.sum(dim=0, keepdim=True).T) * 0.75
```
"""

WRONG = """### Strategy: drop the division (wrong on purpose: the check must refuse it)
```python
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x, weight):
        return (x @ weight.sum(dim=0, keepdim=True).T) * 1.5
```
"""

SLOWER = """### Strategy: the same GEMM in float64 (slower: must not win)
```python
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x, weight):
        y = (x.double() @ weight.double().T) / 2
        return (y.sum(dim=1, keepdim=True) * 1.5).float()
```
"""


def serve(replies: list[str]) -> tuple[ThreadingHTTPServer, list[dict[str, Any]]]:
    """An OpenAI-compatible endpoint on loopback answering chat completions in turn."""
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            requests.append({"path": self.path})
            self._send(200, {"object": "list", "data": [{"id": "local-coder", "object": "model"}]})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            json.loads(self.rfile.read(length) or b"{}")
            requests.append({"path": self.path})
            text = replies[(len([r for r in requests if r["path"].endswith("/completions")]) - 1)
                           % len(replies)]  # fmt: skip
            self._send(
                200,
                {
                    "id": f"c{len(requests)}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "local-coder",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
                },
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, requests


def step(name: str, command: list[str], cwd: Path, log: list[dict[str, Any]]) -> str:
    started = time.monotonic()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    entry = {
        "step": name,
        "command": " ".join(command),
        "exit": proc.returncode,
        "wall_s": round(time.monotonic() - started, 1),
    }
    log.append(entry)
    print(json.dumps(entry), flush=True)
    return proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layout", choices=("single", "split"), default="single")
    parser.add_argument("--dim", type=int, default=8192)
    args = parser.parse_args()
    log: list[dict[str, Any]] = []
    server, requests = serve([WRONG, SLOWER, MATVEC])
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "my-kernels"
        repo.mkdir()
        write_project(repo, args.layout, args.dim)
        git = ["git", "-c", "user.name=u", "-c", "user.email=u@example.invalid"]
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run([*git, "add", "."], cwd=repo, check=True)
        subprocess.run([*git, "commit", "-qm", "my kernel"], cwd=repo, check=True)
        pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        out = step(
            "optimize",
            [*pytest, "--kernelpro-optimize=3", "--kernelpro-llm=openai",
             f"--kernelpro-llm-base-url={url}", "--kernelpro-candidates=1", "-rA"],
            repo,
            log,
        )  # fmt: skip
        found = sorted(repo.glob(".kernelpro/optimize/*/run-*/patches/*.patch"))
        best = [p for p in found if p.name == "best.patch"]
        summary_lines = [ln for ln in out.splitlines() if "optimize" in ln.lower()][-12:]
        log.append(
            {
                "patches": [str(p.relative_to(repo)) for p in found],
                "model_requests": len(requests),
                "summary": summary_lines,
            }
        )
        print("\n".join(summary_lines))
        if best:
            step("git apply", ["git", "apply", str(best[0])], repo, log)
            diff = subprocess.run(
                ["git", "diff", "--stat"], cwd=repo, capture_output=True, text=True, check=False
            ).stdout
            log.append({"diff_stat": diff.strip()})
            print(diff.strip())
            out = step("check patched", [*pytest, "--kernelpro-only", "-rA"], repo, log)
            log.append({"patched_check_tail": out.strip().splitlines()[-3:]})
    server.shutdown()
    args.out.write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
