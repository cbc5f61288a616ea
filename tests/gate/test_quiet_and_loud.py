"""Quiet by default, loud on failure, as pure functions: the "unresolved" verdict, the rule
that a check compared nothing, `kernelpro compare`'s exit, a noisy baseline said at save, the
short note lines, the middle ellipsis of kernel names, and the error texts of a wrong inputs=
return and a misspelled marker keyword."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from gate_factories import make_record
from msgspec.structs import replace

from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.baseline import BaselineEntry
from pytest_kernelpro.gate.baseline_save import entry_from_record, save_baseline, too_noisy_note
from pytest_kernelpro.gate.format import NOTE_WIDTH, Note, fit, plain_note
from pytest_kernelpro.gate.render_session import (
    MIN_NAME,
    middle_ellipsis,
    note_lines,
    nothing_checked_line,
    session_conditions,
    session_line,
)
from pytest_kernelpro.gate.report import build_report
from pytest_kernelpro.gate.verdict import RESOLVABLE_TOLERANCE, decide_verdict
from pytest_kernelpro.measure.timing.on_cpu import summarize_cpu_pairs
from pytest_kernelpro.problem.model import did_you_mean, wrong_inputs_return
from pytest_kernelpro.record import KernelRecord
from pytest_kernelpro.review.comment import render_comment
from pytest_kernelpro.review.offline_gate import compare_main

MS = 1e-3


def session_notes(
    settings: Any,
    records: Sequence[KernelRecord],
    notes: Sequence[str | Note] = (),
    *,
    verbose: bool = False,
) -> list[str]:
    """The lines under the table as the session prints them (`run.session.summary_notes`)."""
    return note_lines(session_conditions(settings, records, notes), verbose=verbose)


CPU = "cpu (AMD EPYC, 1 thread)"
ANCHOR = "cpu anchor: fp32 matmul 128x128x128, on-CPU time (torch 2.13.0+cpu, 1 thread(s))"


def cpu_record(name: str, *, scale: float = 1.0, bimodal: bool = False, seed: int) -> KernelRecord:
    """A CPU kernel timed in pairs with the anchor around `scale` ms; `bimodal`: every other
    sample 2.3x (the two-peaked kernel that hid a doubled one behind a 121% tolerance)."""
    rng = np.random.default_rng(seed)
    kernel = scale * MS * np.exp(0.03 * rng.standard_normal(120))
    if bimodal:
        kernel[1::2] *= 2.3
    anchors = 0.1 * MS * np.exp(0.03 * rng.standard_normal(120))
    record = make_record(name, median_s=float(np.median(kernel)), n=120, seed=seed, device=CPU)
    assert record.timing is not None
    pairs = summarize_cpu_pairs(
        ANCHOR, [float(v) for v in kernel], [float(v) for v in anchors],
        kernel_wall_s=[float(v) for v in kernel], anchor_wall_s=[float(v) for v in anchors],
    )  # fmt: skip
    record.timing = msgspec.structs.replace(record.timing, anchor=pairs)
    return record


def entry_of(record: KernelRecord) -> BaselineEntry:
    made = entry_from_record(record)
    assert made is not None
    return made


# -- "unresolved" --


def test_an_unchanged_kernel_against_a_two_peaked_baseline_is_unresolved_not_ok() -> None:
    base = entry_of(cpu_record("k[1]", bimodal=True, seed=1))
    verdict = decide_verdict(cpu_record("k[1]", seed=2), base)
    assert verdict.status == "unresolved"
    assert verdict.tolerance > RESOLVABLE_TOLERANCE
    assert "scattered" in verdict.reason  # the cause: the baseline's own calls
    assert "re-save the baseline on a quiet machine" in verdict.reason
    assert not verdict.failed  # not a regression: the session decides (nothing_checked)


@pytest.mark.parametrize("factor", [1.5, 2.0])
def test_a_slower_kernel_against_a_two_peaked_baseline_is_never_ok(factor: float) -> None:
    base = entry_of(cpu_record("k[1]", bimodal=True, seed=1))
    verdict = decide_verdict(cpu_record("k[1]", scale=factor, bimodal=True, seed=3), base)
    assert verdict.status != "ok"


def test_a_quiet_baseline_still_reads_ok_and_catches_a_doubled_kernel() -> None:
    """The rule must not turn every CPU verdict unresolved: the 25% floor is resolvable."""
    base = entry_of(cpu_record("k[1]", seed=1))
    same = decide_verdict(cpu_record("k[1]", seed=2), base)
    assert same.status == "ok"
    assert same.tolerance <= RESOLVABLE_TOLERANCE
    assert decide_verdict(cpu_record("k[1]", scale=2.0, seed=4), base).status == "regressed"


def test_a_baseline_too_noisy_to_catch_1_5x_is_said_when_saved() -> None:
    quiet, noisy = cpu_record("quiet[1]", seed=1), cpu_record("noisy[1]", bimodal=True, seed=2)
    assert too_noisy_note([quiet]) is None
    note = too_noisy_note([quiet, noisy])
    assert note is not None
    assert note.short.startswith("baseline: 1 entry too noisy to catch 1.5x (noisy[1] ±")
    assert note.short.endswith("re-save it on a quiet machine")
    assert len("kernelpro: " + note.short) < 100
    assert "noisy[1]: tolerance ±" in note.full
    assert "quiet[1]" not in note.full
    assert note.full.endswith("longer --kernelpro-time-budget")


# -- the rule: a check that compared nothing --


def gated(record: KernelRecord, status: str) -> KernelRecord:
    verdict = decide_verdict(record, entry_of(record))
    record.gate = replace(verdict, status=status, change_status=status)
    return record


@pytest.mark.parametrize(
    ("statuses", "fails"),
    [
        (["incomparable", "incomparable"], True),
        (["unresolved"], True),
        (["incomparable", "unresolved", "new", "unmeasured"], True),  # new/not timed: not counted
        (["incomparable", "ok"], False),  # one kernel compared for real is a check
        (["incomparable", "regressed"], False),  # the regression fails the session itself
        (["incomparable", "suspect"], False),
        (["new", "new"], False),  # a bootstrap: the coverage line says it
        (["unmeasured"], False),  # the item failures say it
        ([], False),
    ],
)
def test_nothing_checked_rule(statuses: list[str], fails: bool) -> None:
    records = [gated(make_record(f"k{i}[1]", seed=i), s) for i, s in enumerate(statuses)]
    line = nothing_checked_line(records)
    assert (line is not None) is fails
    if line is not None:
        assert line.startswith("kernelpro: checked nothing: ")
        assert line.endswith(", or pass --kernelpro-allow-incomparable")
    assert nothing_checked_line([make_record("plain[1]")]) is None  # no --kernelpro-check


def test_the_session_line_follows_the_check_and_the_resolved_allow_setting() -> None:
    """The session's line reads the setting resolved once at configure (no re-resolution at
    session finish): a check that checked nothing fails unless allowed; no check, no line."""
    records = [gated(make_record("k[1]"), "incomparable")]
    assert session_line(records, check=True, allow_incomparable=False) == (
        nothing_checked_line(records)
    )
    assert session_line(records, check=True, allow_incomparable=True) is None
    assert session_line(records, check=False, allow_incomparable=False) is None


def test_compare_with_every_kernel_incomparable_fails_unless_no_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = save_baseline(tmp_path / "base.yaml", [make_record("a[1]", device=CPU, seed=1)])
    assert base.entries
    head = [make_record("a[1]", device="cpu (Other CPU 9000, 1 thread)", seed=2)]
    path = atomic_write_json(tmp_path / "head.json", build_report(head, meta={}))
    assert compare_main([str(tmp_path / "base.yaml"), str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "kernelpro compare: checked nothing: all 1 compared kernel(s) incomparable with the "
        "baseline; save the baseline on this machine, or pass --no-fail"
    )
    assert compare_main([str(tmp_path / "base.yaml"), str(path), "--no-fail"]) == 0


# -- short notes --


def test_fit_never_passes_its_width_and_cuts_at_a_word() -> None:
    text = "word " * 60
    assert fit(text) == fit(text, NOTE_WIDTH)
    assert len(fit(text)) <= NOTE_WIDTH
    assert fit(text).endswith("…")
    assert fit("short") == "short"
    one_long_word = "x" * 500  # no space to cut at: still within the width
    assert len(fit(one_long_word)) <= NOTE_WIDTH


def test_a_plain_note_is_cut_to_one_line_that_points_to_verbose() -> None:
    long = "ceilings of cpu re-probed (a exceeded them): " + "fp32 1 -> 2 TFLOP/s; " * 10
    note = plain_note(long)
    assert note.full == long
    assert note.short.endswith("(-v)")
    assert len(note.short) <= NOTE_WIDTH
    assert plain_note("short").short == "short"


def test_every_condition_is_one_short_line_and_whole_under_verbose() -> None:
    """An adversarial session: hundreds of kernels with long names under every condition."""
    names = [f"fused_attention_{'x' * 80}_{i}[8x16x4096x128]" for i in range(300)]
    records = []
    for i, name in enumerate(names):
        record = cpu_record(name, seed=i % 7)
        assert record.timing is not None
        record.timing = msgspec.structs.replace(
            record.timing,
            budget_note="the time budget of 1 s was overrun (3.1 s): " + "why " * 80,
            cpu_load={
                "oversubscribed": True,
                "others_cores": 1.9,
                "cores": 2,
                "cpus": 2,
                "threads": 4,
            },
        )
        record.extra = {"profile_skipped": True, "invalid_marker": True}
        records.append(record)
    settings = type("S", (), {"correctness_only": False, "check": True, "profile": True,
                              "save_baseline": None})()  # fmt: skip
    short = session_notes(settings, records, ["another part's note " * 20])
    assert len(short) == 5
    assert all(len("kernelpro: " + line) < 100 for line in short), short
    full = session_notes(settings, records, ["another part's note " * 20], verbose=True)
    assert len(full) == 5
    assert any("why why why" in line for line in full)


def test_the_comment_has_the_full_notes_in_a_details_block() -> None:
    report = build_report([make_record("a[1]")], meta={"notes": ["the whole text " * 30]})
    body = render_comment(report)
    assert "<details><summary>1 session note(s)</summary>" in body
    details = body.split("<details><summary>1 session note(s)</summary>", 1)[1]
    assert ("the whole text " * 30).strip() in details.split("</details>", 1)[0]  # whole


# -- kernel names in a narrow terminal --


@pytest.mark.parametrize("width", [12, 13, 20, 47])
def test_middle_ellipsis_keeps_both_ends_within_the_width(width: int) -> None:
    name = "fused_attention_with_a_long_name[8x16x4096x128]"
    short = middle_ellipsis(name, width)
    assert len(short) == min(width, len(name))
    if width < len(name):
        head, tail = short.split("…")
        assert name.startswith(head)
        assert name.endswith(tail)
        assert tail  # the shape end is kept
    assert middle_ellipsis("abc", 12) == "abc"
    assert MIN_NAME == 12


# -- errors that point at the cause --


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (None, "None (a missing `return`?)"),
        ({"x": 1, "y": 2}, "a dict with keys 'x', 'y': keyword inputs are not passed"),
        ("tensor", "a str ('tensor')"),
        ({1, 2}, "a set ({1, 2})"),
        (iter([1]), "a list_iterator"),
    ],
)
def test_a_wrong_inputs_return_is_named(value: object, said: str) -> None:
    problem = wrong_inputs_return(value)
    assert problem is not None
    assert problem.startswith(said)


@pytest.mark.parametrize("value", [(1, 2), [1], 3.0, (None,), ()])
def test_what_can_be_a_kernel_s_arguments_passes(value: object) -> None:
    import torch

    assert wrong_inputs_return(value) is None
    assert wrong_inputs_return(torch.ones(2)) is None


def test_did_you_mean_only_for_a_close_keyword() -> None:
    assert did_you_mean("refrence") == "refrence (did you mean reference?)"
    assert did_you_mean("INPUTS") == "INPUTS (did you mean inputs?)"
    assert did_you_mean("bogus") == "bogus"
    assert did_you_mean("") == ""


def test_the_compare_table_shortens_a_long_name_in_a_narrow_terminal() -> None:
    from pytest_kernelpro.gate.baseline import Baseline
    from pytest_kernelpro.review.offline_gate import gate_records, render_compare_table

    name = "fused_attention_with_a_long_name[8x16x4096x128]"
    base_records = [make_record(name, seed=1), make_record("b[1]", seed=2)]
    entries = {r.nodeid: entry_of(r) for r in base_records}
    base = Baseline(path="b.json", device="", commit=None, created="", tool="", entries=entries)
    gated_head = gate_records(base, [make_record(name, seed=3), make_record("b[1]", seed=4)])
    narrow = render_compare_table(base, gated_head, width=60).splitlines()
    row = next(line for line in narrow if line.startswith("fused_"))
    assert "…" in row.split()[0]
    assert row.split()[0].endswith("128]")
    assert max(len(line) for line in narrow) <= 60
    whole = render_compare_table(base, gated_head, width=None)
    assert name in whole  # a log: whole names


def test_kernels_skipped_for_the_same_first_reason_share_one_line() -> None:
    """The example repository's CUDA and Triton kernels: two reasons, one condition."""
    records = []
    for name, language in (("cuda_saxpy", "cuda"), ("triton_add", "triton"), ("t2", "triton")):
        record = make_record(name, timed=False, outcome="skipped")
        record.message = f"needs a CUDA GPU ({language} kernel) and none is visible"
        records.append(record)
    settings = type("S", (), {"correctness_only": False, "check": False, "profile": False,
                              "save_baseline": None})()  # fmt: skip
    assert session_notes(settings, records) == ["3 kernel(s) skipped: needs a CUDA GPU (-v)"]
    (full,) = session_notes(settings, records, verbose=True)
    assert "(cuda kernel)" in full
    assert "(triton kernel)" in full
    assert full.count("(triton kernel)") == 1


def test_a_kernel_named_like_a_word_of_its_skip_reason_keeps_the_reason_whole() -> None:
    """The kernel's own name is taken out of its reason only where it stands as a name: a
    kernel named `a` or `GPU` does not turn "needs a CUDA GPU" into "needs it CUDA it"."""
    settings = type("S", (), {"correctness_only": False, "check": False, "profile": False,
                              "save_baseline": None})()  # fmt: skip
    records = []
    for name in ("a", "GPU", "CUDA"):
        record = make_record(name, timed=False, outcome="skipped")
        record.message = "needs a CUDA GPU (cuda kernel) and none is visible"
        records.append(record)
    named = make_record("a", timed=False, outcome="skipped")
    named.message = "a is a cuda kernel that needs a CUDA GPU, but the device setting is 'cpu'"
    records.append(named)
    assert session_notes(settings, records) == [
        "3 kernel(s) skipped: needs a CUDA GPU (-v)",
        "1 kernel(s) skipped: it is a cuda kernel that needs a CUDA GPU (-v)",
    ]
    (whole, led) = session_notes(settings, records, verbose=True)
    assert "needs a CUDA GPU (cuda kernel) and none is visible" in whole
    assert "it is a cuda kernel that needs a CUDA GPU, but" in led
