"""The sandboxed evaluator on real candidates, in one search: every one classified right,
this process alive, the GPU usable after each.

    python bench/evaluator_gpu.py --out $OUT

On a GPU (the H200 run), the candidates are KernelBench solutions for `a + b` on 16M
floats. One `load_inline` extension ("kp_eval_shared") holds every CUDA kernel they need,
so it is compiled once and the later workers load it from the shared build cache; one
more extension does not compile:

  correct            a correct CUDA kernel                          -> correct
  wrong              subtracts instead of adding                    -> wrong
  does_not_compile   a CUDA syntax error                            -> build_error
  illegal_address    out-of-bounds write (index + 2^40)             -> run_error (illegal memory access)
  hangs              a kernel spinning on a volatile flag           -> timeout (group killed)
  correct_again      the correct kernel after the crash and the hang -> correct (GPU usable)
  gpu_oom            allocates 2 TB on the device                   -> run_error (out of memory)
  side_stream        runs the kernel on its own stream              -> cheat
  forbidden_op       torch's `a + b` (aten.add is forbidden)        -> cheat
  calls_reference    calls Model.forward                            -> cheat
  cached             returns its first answer forever               -> cheat

Without a GPU (a dry run), pure-PyTorch candidates exercise the same sandbox: correct,
wrong, raising, os._exit crash, hang, memory hog, environment reader (a secret set here
must not reach it).

Writes results.json, trajectory.jsonl and tree.txt under --out and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kernelpro.optimize.sandbox.evaluator import (  # noqa: E402
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.base import Candidate  # noqa: E402
from pytest_kernelpro.optimize.search.mcts import MCTS  # noqa: E402
from pytest_kernelpro.optimize.search.restore import render_tree  # noqa: E402

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


N = 1 << 24


def get_inputs():
    return [torch.rand(N), torch.rand(N)]


def get_init_inputs():
    return []
"""

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void add_kernel(const float* a, const float* b, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
__global__ void sub_kernel(const float* a, const float* b, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] - b[i];
}
__global__ void oob_kernel(const float* a, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i + (1L << 40)] = a[i];  // far outside any allocation
}
__global__ void spin_kernel(const volatile int* flag, float* out) {
    while (flag[0] == 0) { }  // the flag is zero and nobody sets it
    out[0] = 1.0f;
}

static int blocks(long n) { return (int)((n + 255) / 256); }

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    add_kernel<<<blocks(a.numel()), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}
torch::Tensor sub(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    sub_kernel<<<blocks(a.numel()), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}
torch::Tensor oob(torch::Tensor a) {
    auto out = torch::empty_like(a);
    oob_kernel<<<blocks(a.numel()), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}
torch::Tensor spin(torch::Tensor a) {
    auto flag = torch::zeros({1}, a.options().dtype(torch::kInt));
    auto out = torch::empty_like(a);
    spin_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(flag.data_ptr<int>(),
                                                                out.data_ptr<float>());
    return out;
}
"""

CPP_DECLS = """
torch::Tensor add(torch::Tensor a, torch::Tensor b);
torch::Tensor sub(torch::Tensor a, torch::Tensor b);
torch::Tensor oob(torch::Tensor a);
torch::Tensor spin(torch::Tensor a);
"""

FLAGS = "['-O3', '-gencode=arch=compute_90a,code=sm_90a']"


def _with_ext(
    body: str, *, name: str = "kp_eval_shared", cuda: str = CUDA_SOURCE, header: str = ""
) -> str:
    """A candidate module that builds the shared extension, then defines ModelNew."""
    return f"""
import sys
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
{header}
ext = load_inline(
    name={name!r},
    cpp_sources={CPP_DECLS!r},
    cuda_sources={cuda!r},
    functions=["add", "sub", "oob", "spin"],
    extra_cuda_cflags={FLAGS},
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, a, b):
{body}
"""


def gpu_candidates() -> list[tuple[str, str, str, Candidate]]:
    """(name, expected status, expected reason fragment, candidate)."""
    broken = CUDA_SOURCE.replace("out[i] = a[i] + b[i];", "out[i] = a[i] + b[i]  // missing ;")
    plain = "import sys\nimport torch\nimport torch.nn as nn\n"
    rows = [
        ("correct", "correct", "", _with_ext("        return ext.add(a, b)")),
        ("wrong", "wrong", "wrong result", _with_ext("        return ext.sub(a, b)")),
        (
            "does_not_compile",
            "build_error",
            "",
            _with_ext("        return ext.add(a, b)", name="kp_eval_broken", cuda=broken),
        ),
        (
            "illegal_address",
            "run_error",
            "illegal memory access",
            _with_ext("        return ext.oob(a)"),
        ),
        ("hangs", "timeout", "timeout", _with_ext("        return ext.spin(a)")),
        ("correct_again", "correct", "", _with_ext("        return ext.add(a, b)")),
        (
            "gpu_oom",
            "run_error",
            "out of memory",
            plain
            + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        hoard = torch.empty(2 * 1024 ** 4 // 4, device=a.device)  # 2 TB
        return a + b + hoard[:1]
""",
        ),
        (
            "side_stream",
            "cheat",
            "stream",
            _with_ext(
                "        with torch.cuda.stream(self.side):\n            return ext.add(a, b)",
                header="SIDE = torch.cuda.Stream()",
            ).replace(
                "class ModelNew(nn.Module):\n", "class ModelNew(nn.Module):\n    side = SIDE\n"
            ),
        ),
        (
            "forbidden_op",
            "cheat",
            "forbidden",
            plain
            + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.add(a, b)
""",
        ),
        (
            "calls_reference",
            "cheat",
            "calls the reference",
            plain
            + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        return sys.modules["kernelpro_reference"].Model.forward(self, a, b)
""",
        ),
        (
            "cached",
            "cheat",
            "cached",
            _with_ext(
                "        if self.saved is None:\n            self.saved = ext.add(a, b)\n"
                "        return self.saved.clone()"
            ).replace(
                "class ModelNew(nn.Module):\n", "class ModelNew(nn.Module):\n    saved = None\n"
            ),
        ),
    ]
    return [(n, s, r, Candidate(code=c, strategy=n)) for n, s, r, c in rows]


CPU_REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(a) + b


def get_inputs():
    return [torch.randn(64, 256), torch.randn(64, 256)]


def get_init_inputs():
    return []
"""


def cpu_candidates() -> list[tuple[str, str, str, Candidate]]:
    head = (
        "import os\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, a, b):\n"
    )
    rows = [
        ("correct", "correct", "", "        return a.clamp_min(0) + b\n"),
        ("wrong", "wrong", "wrong result", "        return a + b\n"),
        (
            "raising",
            "run_error",
            "RuntimeError",
            "        raise RuntimeError('CUDA error: invalid argument (simulated)')\n",
        ),
        ("exit_crash", "run_error", "exit code 7", "        os._exit(7)\n"),
        ("hangs", "timeout", "timeout", "        while True:\n            pass\n"),
        (
            "memory_hog",
            "run_error",
            "out of memory",
            "        hoard = []\n        while True:\n"
            "            hoard.append(torch.ones(64 * 1024 * 1024))\n",
        ),
        (
            "env_reader",
            "correct",
            "",
            "        print('SECRET_SEEN=' + os.environ.get('KERNELPRO_BENCH_API_KEY', 'absent'))\n"
            "        return a.clamp_min(0) + b\n",
        ),
    ]
    return [(n, s, r, Candidate(code=head + body, strategy=n)) for n, s, r, body in rows]


class ScriptedGenerator:
    """Serves the prepared candidates in order, whatever the node's mode."""

    def __init__(self, candidates: list[Candidate]) -> None:
        self.queue = list(candidates)

    def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
        taken, self.queue = self.queue[:max_candidates], self.queue[max_candidates:]
        return taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run-timeout", type=float, default=20.0)
    parser.add_argument("--build-timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    gpu = torch.cuda.is_available()
    if gpu:
        rows = gpu_candidates()
        task = KernelBenchTask(
            REFERENCE, name="vector_add", device="cuda", forbidden_ops=("aten.add",)
        )
        memory_mb = None  # let the default (half of RAM) apply
    else:
        rows = cpu_candidates()
        task = KernelBenchTask(
            CPU_REFERENCE,
            name="relu_add",
            device="cpu",
            cpu_threads=1,
            timing={"warmup_ms": 5, "max_time_s": 0.1, "min_samples": 10, "flush_l2": False},
        )
        memory_mb = 1024
    os.environ["KERNELPRO_BENCH_API_KEY"] = "sk-bench-must-not-leak"
    # Workers share one build cache (TORCH_EXTENSIONS_DIR, else a kernelpro folder in the
    # temp directory), so the shared extension is compiled once.
    limits = SandboxLimits(
        build_timeout_s=args.build_timeout,
        run_timeout_s=args.run_timeout,
        **({"memory_limit_mb": memory_mb} if memory_mb else {}),
    )
    evaluator = SandboxEvaluator(task, limits)
    trajectory = args.out / "trajectory.jsonl"
    trajectory.unlink(missing_ok=True)
    start = time.perf_counter()
    result = MCTS(seed=0).run(
        ScriptedGenerator([c for *_, c in rows]),
        evaluator,
        str(len(rows)),
        trajectory=trajectory,
        meta={"bench": "evaluator_gpu", "gpu": gpu},
    )
    elapsed = time.perf_counter() - start
    parent_gpu_ok = None
    if gpu:  # this process is alive and can still use the GPU
        parent_gpu_ok = float(torch.ones(1024, device="cuda").sum().item()) == 1024.0

    # Match by evaluation order, not by code: two candidates may share their code.
    evaluated = sorted((n for n in result.nodes if n.candidate is not None), key=lambda n: n.id)
    report = []
    for index, (name, want, fragment, _cand) in enumerate(rows):
        node = evaluated[index] if index < len(evaluated) else None
        ev = node.evaluation if node else None
        got = ev.status if ev else "not evaluated"
        reason = (ev.reason or "") if ev else ""
        ok = got == want and fragment.lower() in (
            reason.lower() + (" timeout" if got == "timeout" else "")
        )
        if name == "env_reader" and ev is not None:
            ok = ok and "SECRET_SEEN=absent" in ev.logs and "sk-bench" not in ev.logs
        report.append(
            {
                "name": name,
                "expected": want,
                "status": got,
                "ok": ok,
                "reason": reason,
                "speedup": ev.speedup if ev else None,
                "wall_s": round(ev.wall_s, 1) if ev else None,
                "node": node.id if node else None,
            }
        )
    summary = {
        "device": torch.cuda.get_device_name(0) if gpu else f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "candidates": len(rows),
        "classified_right": sum(r["ok"] for r in report),
        "search_stop_reason": result.stop_reason,
        "search_seconds": round(elapsed, 1),
        "parent_process_alive": True,
        "parent_gpu_ok": parent_gpu_ok,
        "rows": report,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "tree.txt").write_text(render_tree(trajectory))

    print(
        f"evaluator_gpu: {summary['device']}, torch {summary['torch']}, "
        f"{elapsed:.0f}s, stop: {result.stop_reason}"
    )
    print(f"{'candidate':<18} {'expected':<12} {'got':<12} {'ok':<4} {'wall':>6}  reason")
    for r in report:
        note = r["reason"] or (f"{r['speedup']:.2f}x" if r["speedup"] else "")
        print(
            f"{r['name']:<18} {r['expected']:<12} {r['status']:<12} "
            f"{'yes' if r['ok'] else 'NO':<4} {r['wall_s'] or 0:>5.1f}s  {note[:70]}"
        )
    print(
        f"classified right: {summary['classified_right']}/{len(rows)}; this process alive; "
        f"GPU usable here afterwards: {parent_gpu_ok}"
    )
    return 0 if summary["classified_right"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
