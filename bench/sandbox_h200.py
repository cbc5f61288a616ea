"""The candidate sandbox with a real CUDA candidate: isolated, still runs on the GPU, judged,
timed, its time confirmed, and (where ncu works inside the sandbox) profiled.

    python bench/sandbox_h200.py --out $OUT            # on the GPU machine
    python bench/sandbox_h200.py --out /tmp/sb --device cpu   # dry run (PyTorch candidate)
    python bench/sandbox_h200.py --out $OUT --security  # issue 23's checks only (below)

`--security` runs, with default settings: the cost of the sandbox per candidate (a bare
`python -c pass` unsandboxed, in the namespaces with the old deny-list view, and with the
allow-list view; then the candidate's evaluation with each view, alternated), a candidate
whose `load_inline` flags carry a shell command (built ahead by the search), and a
candidate that reads the home directory's credential files, the repository's `.env` and
its parent's environment and raises with what it read.

The candidate is a fast-path CUDA kernel (`pytest_kernelpro.optimize.build.load_cuda`: nvcc to a cubin,
driver-API launch) for `a + b` on 16M floats. At import it also probes its sandbox and prints
what it found (`PROBE ...` lines in the worker log): the processes it can see, whether the
NVIDIA device nodes are there, a write into the repository, a socket to the session's
loopback listener, and the environment variable the session holds as a canary. Every step
appends one JSON line to OUT/sandbox.jsonl as it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kernelpro.optimize.sandbox.evaluator import (  # noqa: E402
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation  # noqa: E402
from pytest_kernelpro.optimize.search.interfaces import Candidate  # noqa: E402

CANARY = "kp-bench-canary-5d1e"

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


N = @@N@@


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
"""

PROBE = r"""
import os, socket
print("PROBE pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
print("PROBE nvidia_nodes", sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")))
print("PROBE canary_in_env", any("@@CANARY@@" in v for v in os.environ.values()))
try:
    open("@@REPO_FILE@@", "a").close()
    print("PROBE repo_write ESCAPED")
except OSError as exc:
    print("PROBE repo_write blocked:", exc.strerror)
try:
    socket.create_connection(("127.0.0.1", @@PORT@@), timeout=2).close()
    print("PROBE socket ESCAPED")
except OSError as exc:
    print("PROBE socket blocked:", exc.strerror)
"""

CUDA_CANDIDATE = (
    PROBE
    + r'''
import torch
import torch.nn as nn
from pytest_kernelpro.optimize.build import load_cuda

kernels = load_cuda(r"""
extern "C" __global__ void add4(const float4* a, const float4* b, float4* out, long long n4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 x = a[i], y = b[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}
""", name="kp_sandbox_add4")


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n4 = a.numel() // 4
        kernels.add4(a, b, out, n4, grid=(n4 + 255) // 256, block=256)
        return out
'''
)

CPU_CANDIDATE = (
    PROBE
    + """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.add(a, b)
"""
)

NCU_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from pytest_kernelpro.optimize.sandbox.loader import load_source
mod = load_source(open(sys.argv[2]).read(), "kp_candidate")
a = torch.randn(@@N@@, device="cuda"); b = torch.randn(@@N@@, device="cuda")
m = mod.ModelNew()
m(a, b); torch.cuda.synchronize()
print("ran under ncu")
"""


class Listener:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                continue


def log(out: Path, record: dict) -> None:
    record = {"t": round(time.time(), 1), **record}
    with open(out / "sandbox.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
    print(json.dumps(record, default=str)[:1500], flush=True)


def probe_lines(logs: str) -> list[str]:
    return [line for line in logs.splitlines() if line.startswith("PROBE ")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--ncu-timeout", type=float, default=40.0)
    parser.add_argument("--security", action="store_true", help="issue 23's checks only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.security:
        from sandbox_security import run_security  # bench/sandbox_security.py

        return run_security(args.out, args.device, log)
    started = time.monotonic()
    os.environ["KERNELPRO_BENCH_API_TOKEN"] = CANARY  # must not reach the candidate
    import torch

    cuda = args.device == "cuda"
    n = 1 << 24 if cuda else 1 << 16
    iso = Isolation.probe()
    if cuda:
        # The sandbox the evaluator uses for a CUDA task: the first rung of the CUDA ladder
        # under which CUDA initialises (or the fallback, with what each rung said).
        iso = Isolation.probe(cuda=True)
    log(
        args.out,
        {
            "step": "machine",
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if cuda else None,
            "python": sys.version.split()[0],
            "euid": os.geteuid(),
            "isolation": iso.level,
            "describe": iso.describe(),
            "why": iso.why,
        },
    )
    listener = Listener()
    repo_file = ROOT / "README.md"
    before = repo_file.read_bytes()
    fill = {
        "@@CANARY@@": CANARY,
        "@@REPO_FILE@@": str(repo_file),
        "@@PORT@@": str(listener.port),
    }
    code = CUDA_CANDIDATE if cuda else CPU_CANDIDATE
    for key, value in fill.items():
        code = code.replace(key, value)
    task = KernelBenchTask(
        REFERENCE.replace("@@N@@", str(n)),
        name="add_16m",
        device=args.device,
        timing={"warmup_ms": 20.0, "max_time_s": 0.3},
        correct_trials=3,
    )
    limits = SandboxLimits(build_timeout_s=120, run_timeout_s=90)
    evaluator = SandboxEvaluator(task, limits)
    candidate = Candidate(code)
    t0 = time.monotonic()
    ev = evaluator.evaluate(candidate)
    log(
        args.out,
        {
            "step": "evaluate",
            "status": ev.status,
            "reason": ev.reason,
            "speedup": ev.speedup,
            "candidate_median_s": (ev.timing.get("candidate") or {}).get("median_s"),
            "reference_median_s_trusted": (ev.timing.get("reference") or {}).get("median_s"),
            "reference_median_s_in_worker": (ev.timing.get("reference_in_worker") or {}).get(
                "median_s"
            ),
            "verified_by": ev.correctness.get("verified_by"),
            "sandbox": ev.metrics.get("sandbox"),
            "probe": probe_lines(ev.logs),
            "canary_in_evaluation": CANARY in json.dumps(ev.to_dict(), default=str),
            "wall_s": round(time.monotonic() - t0, 2),
        },
    )
    if ev.status != "correct":
        (args.out / "evaluate_logs.txt").write_text(ev.logs + "\n" + ev.build_log)
    t0 = time.monotonic()
    confirmed = evaluator.confirm(candidate, ev)
    log(
        args.out,
        {
            "step": "confirm",
            "status": confirmed.status,
            "reason": confirmed.reason,
            "confirmed": confirmed.timing.get("confirmed"),
            "wall_s": round(time.monotonic() - t0, 2),
        },
    )
    listener.stop.set()
    log(
        args.out,
        {
            "step": "attacks",
            "listener_connections": listener.connections,
            "repo_file_unchanged": repo_file.read_bytes() == before,
        },
    )
    if cuda and iso.isolated:
        ncu_inside(args, iso, code, n, started)
    log(args.out, {"step": "done", "total_s": round(time.monotonic() - started, 1)})
    evaluator.close()
    return 0


def ncu_inside(args: argparse.Namespace, iso: Isolation, code: str, n: int, started: float) -> None:
    """ncu inside the same sandbox (no capabilities): does it still read the counters?"""
    import shutil

    ncu = shutil.which("ncu")
    if ncu is None:
        log(args.out, {"step": "ncu", "result": "no ncu on PATH"})
        return
    scratch = Path(tempfile.mkdtemp(prefix="kernelpro-ncu-"))
    (scratch / "candidate.py").write_text(code)
    (scratch / "run.py").write_text(NCU_SCRIPT.replace("@@N@@", str(n)))
    command = [
        ncu,
        "--clock-control",
        "none",
        "--metrics",
        "gpu__time_duration.sum",
        "--csv",
        sys.executable,
        str(scratch / "run.py"),
        str(ROOT),
        str(scratch / "candidate.py"),
    ]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH", "HOME")}
    env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONPATH=str(ROOT))
    wrapped = iso.wrap(command, scratch=scratch)
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            wrapped, cwd=scratch, env=env, capture_output=True, text=True,
            timeout=args.ncu_timeout, check=False,
        )  # fmt: skip
        text = out.stdout + out.stderr
        durations = [line for line in text.splitlines() if "gpu__time_duration" in line]
        log(
            args.out,
            {
                "step": "ncu",
                "rc": out.returncode,
                "counter_permission_error": "ERR_NVGPUCTRPERM" in text,
                "duration_rows": durations[:6],
                "tail": text[-1500:],
                "wall_s": round(time.monotonic() - t0, 2),
            },
        )
    except subprocess.TimeoutExpired:
        log(args.out, {"step": "ncu", "result": f"timed out after {args.ncu_timeout} s"})


if __name__ == "__main__":
    sys.exit(main())
