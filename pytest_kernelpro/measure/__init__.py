"""What the gate measures of a kernel: correctness (`output_rule.py`, the rule;
`correctness_check.py`, the trials), time (`timing/`) and its place on the roofline
(`ceilings.py`, `flops.py`, `roofline.py`); each module's docstring says its one job. The
optimizer's sandbox decides correctness with these too (`optimize/sandbox/measurement.py`), so
the gate and the search cannot disagree.
"""
