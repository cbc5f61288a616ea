"""The judge's own memory while it checks the output its truth is made on, above what it held
before (the handed-over output): the judge's part of an evaluation's correctness phase,
which `bench/optimizer_handles.py` cannot show (an evaluation's peak is its timing phase).

    PYTHONPATH=TREE python bench/judge_truth_peak.py ROWS COLS

Runs `judge.judge` in this process on a ROWSxCOLS fp32 softmax's re-timing task (one
output, on the call the float64 truth is made on, and no reference timing after it), the
honest output handed in; the peak is the kernel's VmHWM, reset (`/proc/self/clear_refs`)
once the output is made. Prints one JSON line: the peak above that level in MB and in
copies of the output (= copies of the input for a softmax).
"""

from __future__ import annotations

import ctypes
import json
import sys

import torch

from pytest_kernelpro.optimize.sandbox import judge

ROWS, COLS = int(sys.argv[1]), int(sys.argv[2])
REFERENCE = (
    "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.softmax(x, dim=-1)\n\n\n"
    f"def get_inputs():\n    return [torch.randn({ROWS}, {COLS})]\n\n\n"
    "def get_init_inputs():\n    return []\n"
)
TASK = {"reference": REFERENCE, "device": "cpu", "seed": 42, "retime": True, "cpu_threads": 1}


def status(key: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key):
                return int(line.split()[1]) / 1024.0
    raise KeyError(key)


name, seed = judge.required_outputs(TASK)[0]
maker = judge._Reference(TASK)
handed = maker.output(seed, truth=False)  # the honest output, as handed over
del maker
sys.modules.pop("kernelpro_reference", None)
torch.set_num_threads(1)
ctypes.CDLL(None).malloc_trim(0)
base = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # the peak (VmHWM) starts again from here
verdict = judge.judge(TASK, iter([(name, handed)]))
peak = status("VmHWM:")
unit = ROWS * COLS * 4 / 2**20
summary = {
    "ok": verdict["ok"], "rows": ROWS, "cols": COLS, "base_mb": round(base),
    "peak_mb": round(peak), "above_mb": round(peak - base),
    "above_in_outputs": round((peak - base) / unit, 2),
}  # fmt: skip
print(json.dumps(summary))
