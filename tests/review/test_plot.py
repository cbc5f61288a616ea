"""The roofline plot's content: one ceiling per peak, verdict markers, labels, legend place.

The records reproduce what the H200 example-repo check report of 2026-11-30
(bench/results/raw/h200-example-repo/check.json, in git at 08d3359) fed the plot: the same measured FP32 peak
arriving as 50931005505996.53 and ...52 FLOP/s (it drew two identical legend entries), a
peak name that already carries its value, and a "suspect" kernel at 1% of its roofline whose
label the in-axes legend covered.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from gate_factories import make_record
from matplotlib.colors import to_rgba

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import VerdictPart, part_of
from pytest_kernelpro.review.plot import roofline_figure, roofline_plot, roofline_points

BW = 4257636247457.1606
PEAK_NAME = "FP32 CUDA core (measured 50.9 TFLOP/s)"


def _h200(name: str, peak: float, *, median_s: float, flops: float, min_bytes: float):
    rec = make_record(name, median_s=median_s, flops=flops, min_bytes=min_bytes, seed=3)
    rec.roofline = msgspec.structs.replace(
        rec.roofline, peak_flops=peak, bandwidth_Bps=BW, peak_name=PEAK_NAME
    )
    return rec


def _records() -> list:
    add = _h200("triton_add", 50931005505996.53, median_s=190e-6, flops=6.7e7, min_bytes=8.05e8)
    rms = _h200("cuda_row_rms", 50931005505996.52, median_s=41.7e-6, flops=5e7, min_bytes=1.3e8)
    gelu = _h200(
        "bias_gelu[512x1024]", 50931005505996.53, median_s=111e-6, flops=1.05e6, min_bytes=4.2e6
    )
    # A bimodal slowdown: the median doubles, the fastest calls do not move -> suspect.
    entry = entry_from_record(make_record("bias_gelu[512x1024]", median_s=57e-6))
    fast = make_record("x", median_s=30e-6, seed=5).timing.samples_s
    slow = make_record("x", median_s=115e-6, seed=6).timing.samples_s
    gelu.timing = msgspec.structs.replace(gelu.timing, samples_s=fast[:100] + slow[:300])
    gelu.gate = part_of(VerdictPart, decide_verdict(gelu, entry, threshold=0.1))
    assert gelu.gate.status == "suspect"
    reg = _h200("softmax[1]", 50931005505996.53, median_s=80e-6, flops=1.7e8, min_bytes=2.7e8)
    reg.gate = part_of(
        VerdictPart, decide_verdict(reg, entry_from_record(make_record("softmax[1]")))
    )
    assert reg.gate.status == "regressed"
    return [add, rms, gelu, reg]


def test_equal_ceilings_are_drawn_once_and_not_named_twice() -> None:
    fig = roofline_figure(_records())
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    ceilings = [t for t in legend if "GB/s" in t]
    assert ceilings == [f"H200 {PEAK_NAME}, 4258 GB/s"]  # one entry, value said once
    assert len(ax.get_lines()) == 2  # one ceiling polyline and its ridge line


def test_verdicts_are_marked_and_labelled() -> None:
    points, _ = roofline_points(_records())
    by_name = {p.label: p for p in points}
    assert by_name["bias_gelu[512x1024]"].status == "suspect"
    assert by_name["bias_gelu[512x1024]"].change == pytest.approx(111 / 57 - 1, rel=0.05)
    fig = roofline_figure(_records())
    (ax,) = fig.axes
    texts = {t.get_text() for t in ax.texts}
    gelu = next(t for t in texts if t.startswith("bias_gelu[512x1024]"))
    assert gelu.startswith("bias_gelu[512x1024] (")
    assert ", suspect +9" in gelu
    assert any(t.startswith("softmax[1] (") and ", regressed +" in t for t in texts)
    assert any(t.startswith("triton_add (") and "," not in t for t in texts)  # ok: no verdict
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "suspect (not failed)" in legend
    assert "regressed" in legend
    assert "improved" not in legend  # only verdicts that occur get a legend entry
    edges = sorted(tuple(c.get_edgecolor()[0]) for c in ax.collections)
    assert edges == sorted(
        [to_rgba("black"), to_rgba("black"), to_rgba("goldenrod"), to_rgba("red")]
    )


def test_legend_is_below_the_axes(tmp_path: Path) -> None:
    fig = roofline_figure(_records())
    (ax,) = fig.axes
    fig.canvas.draw()
    legend_box = ax.get_legend().get_window_extent()
    axes_box = ax.get_window_extent()
    assert legend_box.y1 < axes_box.y0  # entirely below: it cannot hide a point or label
    path = roofline_plot(_records(), tmp_path / "r.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_empty_plot_names_the_target(tmp_path: Path) -> None:
    with pytest.raises(KernelproError, match=r"r\.png.*nothing to draw"):
        roofline_plot([make_record("x[1]", timed=False)], tmp_path / "r.png")
    with pytest.raises(KernelproError, match="not timed"):
        roofline_figure([make_record("x[1]", timed=False)])


def test_labels_of_crowded_points_do_not_overlap() -> None:
    # Six kernels within a factor 1.6 of each other on both axes, as the example repo's
    # memory-bound kernels are (softmax_rows, RMSNorm, cuda_saxpy, ...).
    recs = [
        _h200(f"k{i}[{i}]", 50931005505996.53, median_s=m, flops=f, min_bytes=2.7e8)
        for i, (m, f) in enumerate(
            [(351e-6, 1.7e8), (167e-6, 0.7e8), (199e-6, 1.3e8), (190e-6, 1.1e8), (120e-6, 1.5e8)]
        )
    ]
    recs.append(_h200("mm", 50931005505996.53, median_s=2.7e-3, flops=1.4e11, min_bytes=2e8))
    fig = roofline_figure(recs)
    (ax,) = fig.axes
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 6
    frame = ax.get_window_extent(renderer)
    for i, a in enumerate(boxes):
        assert frame.x0 <= a.x0
        assert a.x1 <= frame.x1
        assert frame.y0 <= a.y0
        assert a.y1 <= frame.y1
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
