import sys
sys.path.insert(0, "/work/wt-user/tests/gate")
from gate_factories import make_record
from pytest_kernelpro.gate.baseline import BaselineEntry
from pytest_kernelpro.gate.report import render_terminal_table
from pytest_kernelpro.gate.verdict import compare

def gated(name, scale):
    entry = BaselineEntry.from_record(make_record(name, seed=99))
    rec = make_record(name, median_s=50e-6 * scale, seed=1)
    rec.gate = compare(rec, entry).to_dict()
    return rec

reg = gated("fused_attention_with_a_long_name[8x16x4096x128]", 1.2)
reg.peak_used = {"note": "faster than any ceiling", "problem": "count"}
recs = [reg, gated("matmul[4096]", 0.8)]
width = None if sys.argv[1] == "None" else int(sys.argv[1])
print(render_terminal_table(recs, width=width))
