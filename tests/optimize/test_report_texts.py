"""optimize/loop/report_texts.py: the search summary in the item section, the terminal's
section, the PR comment's optimize table (every string escaped) and the JUnit properties, all
shown by the gate from the record's `SectionPart` without knowing the optimizer."""

from __future__ import annotations

from pytest_kernelpro.gate.format import item_section
from pytest_kernelpro.gate.junit import junit_properties
from pytest_kernelpro.optimize.loop.report_texts import render_optimize_text, section_for
from pytest_kernelpro.record import KernelRecord, decode_record, encode_record, record_builtins
from pytest_kernelpro.review.comment import render_comment

SUMMARY = {
    "status": "faster candidate found",
    "reason": "candidate 4 measured 2.00x the current kernel",
    "interrupted": False,
    "kernel": "softmax",
    "budget": "20 evaluations",
    "evaluations": 6,
    "stop_reason": "evaluation budget spent (6/6)",
    "usd": 0.42,
    "elapsed_s": 31.0,
    "run_dir": "/r/.kernelpro/optimize/softmax/run-1",
    "current": {"speedup_vs_reference": 0.5, "efficiency": 0.2, "status": "correct"},
    "outcomes": {"correct": 2, "wrong": 3, "build_error": 1},
    "candidates": [
        {
            "rank": 1,
            "node_id": 4,
            "strategy": "one pass | <script>alert(1)</script>",
            "speedup_vs_current": 2.0,
            "speedup_vs_reference": 1.0,
            "efficiency_after": 0.4,
            "verdict": "not re-measured",
            "patch": "/r/.kernelpro/optimize/softmax/run-1/patches/candidate-4.patch",
        }
    ],
    "winner": 4,
    "best_patch": "/r/.kernelpro/optimize/softmax/run-1/patches/best.patch",
    "guidance": [{"node_id": 2, "guidance": ["[high] DRAM bound"]}],
}


def _record() -> KernelRecord:
    return KernelRecord(
        nodeid="t::softmax",
        name="softmax",
        kernel="softmax",
        outcome="passed",
        extra={"optimize": SUMMARY},
        sections=[section_for("softmax", SUMMARY)],
    )


def test_text_lists_ranked_candidates_patch_and_guidance() -> None:
    text = render_optimize_text(SUMMARY)
    assert "optimize: faster candidate found" in text
    assert "2.00x" in text
    assert "1.00x" in text
    assert "20.0% -> 40.0%" in text
    assert "best patch: /r/.kernelpro/optimize/softmax/run-1/patches/best.patch" in text
    assert "node 2: [high] DRAM bound" in text
    assert "1 build_error, 2 correct, 3 wrong" in text


def test_comment_has_an_escaped_optimize_table() -> None:
    body = render_comment({"records": [record_builtins(_record())], "meta": {}})
    assert "#### kernelpro optimize" in body
    row = next(line for line in body.splitlines() if line.startswith("| `softmax` | `faster"))
    # Report strings are literal text (code spans), and a pipe cannot split the cell.
    assert "| `one pass \\| <script>alert(1)</script>` |" in row
    assert "`softmax/run-1/patches/best.patch`" in row
    assert "| `2.00x` | `1.00x` | `20.0% → 40.0%` |" in row
    # The section's heading and note are plain words: no Markdown survives in them.
    assert "Apply a patch with git apply from the repository root" in body


def test_the_record_carries_the_section_through_its_json_form() -> None:
    """The gate shows what the record holds: after the JSON round trip (xdist, the report,
    the records log) the item section and the terminal lines are still there."""
    record = decode_record(encode_record(_record()), source="test")
    assert "optimize: faster candidate found" in item_section(record)
    (section,) = record.sections
    assert section.terminal_lines[0] == "softmax"
    assert section.title == "kernelpro optimize"


def test_junit_properties_carry_the_search() -> None:
    props = dict(junit_properties(_record()))
    assert props["kernelpro.optimize.status"] == "faster candidate found"
    assert props["kernelpro.optimize.best_speedup_vs_current"] == "2.0"
    assert props["kernelpro.optimize.efficiency_after"] == "0.4"
    assert "kernelpro.optimize.interrupted" not in props


def test_text_says_how_the_winner_was_confirmed() -> None:
    confirmed = {
        **SUMMARY,
        "confirmation": {
            "status": "confirmed",
            "median_s": 5.3e-5,
            "claimed_median_s": 5.27e-5,
            "tolerance": 1.25,
            "ncu_gpu_time_s": 4.8e-5,
        },
    }
    assert (
        "  winner confirmed: re-timed in a fresh process at 53 µs, 1.01x the search's 52.7 µs "
        "(tolerance 1.25x); ncu's kernels 48 µs per call"
    ) in render_optimize_text(confirmed).splitlines()
    lost = {
        **SUMMARY,
        "confirmation": {"status": "disqualified", "reason": "timing not confirmed: 2.2x"},
    }
    assert "  winner disqualified; timing not confirmed: 2.2x" in render_optimize_text(lost)
    assert "winner" not in render_optimize_text(SUMMARY)


def test_text_says_how_the_contenders_were_re_measured() -> None:
    """All contenders' workers alive through the rounds, or (a GPU holding one) one worker a
    turn, with what starting and stopping them cost apart from the rounds' timing."""
    cost = {"wall_s": 11.3, "start_s": 5.3, "rounds": 5, "rounds_s": 6.0,
            "samples": {"current": 51, "node3": 50}, "plan": {"budget_s": 6.0}}  # fmt: skip
    together = render_optimize_text({**SUMMARY, "ranking": {"cost": cost}})
    assert (
        "  re-measurement: 11.3 s (workers ready after 5.3 s, 5 rounds in 6.0 s for a 6 s "
        "timing budget); samples: current 51, node3 50"
    ) in together.splitlines()
    turns = {**cost, "start_s": 0.0, "rounds_s": 44.3, "one_at_a_time": True, "turn_start_s": 36.4}
    assert (
        "  re-measurement: 11.3 s (one worker at a time, 36.4 s starting and stopping workers, "
        "5 rounds in 44.3 s for a 6 s timing budget); samples: current 51, node3 50"
    ) in render_optimize_text({**SUMMARY, "ranking": {"cost": turns}}).splitlines()
