"""Two synthetic records (the test factories') rendered by whichever pytest_kernelpro is on
the path: `python old_vs_new_render.py 80` (a terminal of 80 columns) or `None` (a log).
Run from the repository root, or with PYTHONPATH at an old checkout to see the old table."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests" / "gate"))

from gate_factories import make_record  # noqa: E402

from pytest_kernelpro.gate.baseline import BaselineEntry  # noqa: E402
from pytest_kernelpro.gate.report import render_terminal_table  # noqa: E402
from pytest_kernelpro.gate.verdict import compare  # noqa: E402


def gated(name: str, scale: float):  # noqa: ANN201
    entry = BaselineEntry.from_record(make_record(name, seed=99))
    rec = make_record(name, median_s=50e-6 * scale, seed=1)
    rec.gate = compare(rec, entry).to_dict()
    return rec


reg = gated("fused_attention_with_a_long_name[8x16x4096x128]", 1.2)
reg.peak_used = {"note": "faster than any ceiling", "problem": "count"}
records = [reg, gated("matmul[4096]", 0.8)]
width = None if sys.argv[1] == "None" else int(sys.argv[1])
print(render_terminal_table(records, width=width))
