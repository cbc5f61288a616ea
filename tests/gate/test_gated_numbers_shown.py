"""The number shown is the number gated (record.py `VerdictPart.gated_*`, gate/format.py
`gated_times`): where a verdict compared another time than the wall median, the terminal
table, the PR comment, the JUnit properties and `kernelpro compare` show that time and its
baseline, labelled, with the wall time second, and gated now / gated baseline - 1 is the
change the verdict shows.

The loaded-CPU case this mends: the table read `layer_norm 2.19 ms -> 27.9 ms ... ok -4.9%`
(wall times of a busy machine beside a verdict made on on-CPU time).
"""

from __future__ import annotations

from statistics import median

import msgspec
import pytest
from test_gate_cpu_anchor import MS, cpu_record, entry

from pytest_kernelpro.gate.baseline import Baseline
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.junit import junit_properties
from pytest_kernelpro.gate.render_session import render_terminal_table
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import KernelRecord, VerdictPart, part_of
from pytest_kernelpro.review.comment import comment_details, comment_row
from pytest_kernelpro.review.offline_gate import compare_row, render_compare_table


def _gated(record: KernelRecord, base: KernelRecord) -> KernelRecord:
    verdict = decide_verdict(record, entry(base))
    record.gate = part_of(VerdictPart, verdict)
    return record


def _loaded_cpu_pair() -> tuple[KernelRecord, KernelRecord]:
    """The baseline timed quiet; now the same kernel on-CPU, its wall time 12.7x from
    run-queue waits (2.19 ms -> 27.9 ms of wall time)."""
    base = cpu_record(2.19 * MS, seed=11)
    now = cpu_record(2.1 * MS, seed=12, wall_factor=27.9 / 2.1)
    return base, now


def test_a_cpu_anchored_verdict_names_the_on_cpu_times_it_compared() -> None:
    base, now = _loaded_cpu_pair()
    verdict = decide_verdict(now, entry(base))
    assert verdict.gated_label in ("on-CPU", "on-CPU, anchor-scaled")
    assert verdict.gated_now_s is not None
    assert verdict.gated_baseline_s is not None
    assert verdict.change == pytest.approx(verdict.gated_now_s / verdict.gated_baseline_s - 1)
    assert now.timing is not None
    assert now.timing.anchor is not None
    assert base.timing is not None
    assert base.timing.anchor is not None
    assert verdict.gated_baseline_s == pytest.approx(median(base.timing.anchor["kernel_s"]))
    on_cpu_now = median(now.timing.anchor["kernel_s"])
    if verdict.gated_label == "on-CPU":
        assert verdict.gated_now_s == pytest.approx(on_cpu_now)
    else:
        assert verdict.gated_now_s == pytest.approx(on_cpu_now / (1 + verdict.anchor_change))
    # The wall medians are far apart; the gated times are not.
    assert now.median_s / base.median_s > 10
    assert abs(verdict.change) < 0.35


def test_the_terminal_table_shows_the_gated_times_first_and_the_wall_median_second() -> None:
    base, now = _loaded_cpu_pair()
    gated = _gated(now, base)
    gate = gated.gate
    assert gate is not None
    text = render_terminal_table([gated], width=160)
    header = text.splitlines()[0]
    assert header.index("gated: baseline → now") < header.index("wall median")
    row = next(line for line in text.splitlines() if line.startswith("add[1M]"))
    from pytest_kernelpro.gate.format import format_change, format_time

    shown = (
        f"{gate.gated_label} {format_time(gate.gated_baseline_s)} → {format_time(gate.gated_now_s)}"
    )
    assert shown in row
    assert format_change(gate.change) in row
    assert row.index(shown) < row.index(format_time(now.median_s))


def test_a_wall_time_verdict_keeps_the_plain_table() -> None:
    base = cpu_record(1 * MS, seed=1, anchor=None)
    now = _gated(cpu_record(1 * MS, seed=2, anchor=None), base)
    assert now.gate is not None
    assert now.gate.gated_label is None
    text = render_terminal_table([now], width=160)
    assert "gated" not in text
    assert "median ±IQR/2" in text.splitlines()[0]


def test_the_comment_row_and_details_show_the_gated_times_with_the_wall_second() -> None:
    from pytest_kernelpro.gate.format import format_time

    base, now = _loaded_cpu_pair()
    gated = _gated(now, base)
    gate = gated.gate
    assert gate is not None
    row = comment_row(gated)
    cells = [c.strip() for c in row.strip("|").split("|")]
    label = gate.gated_label
    assert cells[1] == (
        f"{format_time(gate.gated_baseline_s)} {label} (wall {format_time(gate.baseline_median_s)})"
    )
    assert cells[2] == f"{format_time(gate.gated_now_s)} {label} (wall {format_time(now.median_s)})"
    details = comment_details(gated, with_guidance=False)
    assert f"| Gated ({label}) | {format_time(gate.gated_baseline_s)} |" in details


def test_a_forged_label_in_the_artifact_is_literal_text_in_the_comment() -> None:
    base, now = _loaded_cpu_pair()
    gated = _gated(now, base)
    assert gated.gate is not None
    forged = {"gated_label": "[click](https://evil.example) @team"}
    gated.gate = msgspec.structs.replace(gated.gate, **forged)
    row = comment_row(gated)
    assert "`[click](https://evil.example) @team`" in row


def test_junit_properties_carry_the_gated_times() -> None:
    base, now = _loaded_cpu_pair()
    gated = _gated(now, base)
    gate = gated.gate
    assert gate is not None
    props = dict(junit_properties(gated))
    assert props["kernelpro.gated_label"] == gate.gated_label
    assert float(props["kernelpro.gated_median_s"]) == pytest.approx(gate.gated_now_s)
    assert float(props["kernelpro.gated_baseline_median_s"]) == pytest.approx(gate.gated_baseline_s)


def test_kernelpro_compare_shows_the_gated_times_and_their_speedup() -> None:
    from pytest_kernelpro.gate.format import format_time

    base, now = _loaded_cpu_pair()
    gated = _gated(now, base)
    gate = gated.gate
    assert gate is not None
    _, base_cell, head_cell, speedup, verdict, _ = compare_row(gated, base.median_s)
    label = gate.gated_label
    assert base_cell.startswith(f"{format_time(gate.gated_baseline_s)} {label} (wall ")
    assert (
        head_cell == f"{format_time(gate.gated_now_s)} {label} (wall {format_time(now.median_s)})"
    )
    assert speedup == f"{gate.gated_baseline_s / gate.gated_now_s:.2f}× {label}"
    # The speedup agrees with the verdict's change, not with the wall times' 0.08x.
    assert gate.gated_baseline_s / gate.gated_now_s == pytest.approx(1 / (1 + gate.change))
    table = render_compare_table(
        Baseline(path="b", device="", commit=None, created="", tool="", entries={}),
        [gated],
        width=200,
    )
    assert "on-CPU" in table


def test_a_pinned_re_measurement_that_decides_shows_its_own_gated_time() -> None:
    """--kernelpro-autotune-mismatch=pin gates on the re-measurement: its change and gated
    time are shown, not the first measurement's (gate/confirmation.py `settle`)."""
    from pytest_kernelpro.gate.confirmation import Remeasurement, confirm, settle
    from pytest_kernelpro.gate.run_differences import AutotuneComparison, PickDifference

    base = cpu_record(1 * MS, seed=21)
    first = decide_verdict(cpu_record(2 * MS, seed=22), entry(base))
    again = cpu_record(1.01 * MS, seed=23)
    confirmed = confirm(first, again, entry(base))
    difference = PickDifference("k", [1], {"num_warps": 4}, {"num_warps": 8})
    picks = AutotuneComparison(differences=(difference,), head_choices=1)
    pinned = Remeasurement(
        fresh=True,
        choices=({"kernel": "k", "key": [1], "config": {"num_warps": 8}, "source": "pinned"},),
        pinned_requested=True,
    )
    settled = settle(confirmed, picks, pinned, "pin", first.change)
    conf = confirmed.confirmation or {}
    assert settled.change == pytest.approx(conf["change"])
    assert settled.gated_now_s == pytest.approx(conf["gated_now_s"])
    assert settled.gated_baseline_s == pytest.approx(conf["gated_baseline_s"])
    assert settled.change == pytest.approx(settled.gated_now_s / settled.gated_baseline_s - 1)
    assert "fresh process" in str(settled.gated_label)


def test_every_basis_that_is_not_the_wall_median_names_its_time_and_matches_its_change() -> None:
    """GPU clock anchor ("anchor-scaled"), another device ("roofline-scaled"): gated now /
    gated baseline - 1 is the change the verdict shows."""
    import test_gate_clock_anchor as anchored
    from gate_factories import make_record

    cases = [
        (
            "anchor-scaled",
            decide_verdict(
                anchored.capped(206e-6, 1648.0, seed=4),
                anchored.entry_from(anchored.capped(200e-6, 1600.0, seed=3)),
                threshold=0.02,
            ),
        ),
    ]
    other = make_record("k", median_s=2e-3, seed=5, device="NVIDIA A100", roofline_time_s=1e-3)
    base = entry_from_record(
        make_record("k", median_s=1e-3, seed=6, device="NVIDIA H200", roofline_time_s=0.6e-3)
    )
    assert base is not None
    cases.append(("roofline-scaled", decide_verdict(other, base)))
    for label, verdict in cases:
        assert verdict.gated_label == label, verdict.basis
        assert verdict.gated_now_s is not None
        assert verdict.gated_baseline_s is not None
        assert verdict.change == pytest.approx(
            verdict.gated_now_s / verdict.gated_baseline_s - 1, rel=1e-9, abs=1e-12
        )
