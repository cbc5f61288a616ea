"""Autotune picks and versions on the gate (gate/verdict.py, gate/confirmation.py), the
baseline entry that keeps them, and the texts that carry them (table, comment, JUnit)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from msgspec.structs import replace

from pytest_kernelpro.gate.baseline import load_baseline, parse_entry
from pytest_kernelpro.gate.baseline_save import entry_dict, entry_from_record, save_baseline
from pytest_kernelpro.gate.confirmation import FAIL, PIN, WARN, Remeasurement, settle
from pytest_kernelpro.gate.junit import junit_properties
from pytest_kernelpro.gate.render_session import render_terminal_table
from pytest_kernelpro.gate.report import build_report
from pytest_kernelpro.gate.run_differences import (
    compare_choices,
    name_environment,
    note_picks,
    version_changes,
)
from pytest_kernelpro.gate.verdict import OK, REGRESSED, SUSPECT
from pytest_kernelpro.record import (
    AutotunePart,
    EnvironmentPart,
    KernelRecord,
    TimingPart,
    VerdictPart,
)
from pytest_kernelpro.review.comment import render_comment

KERNEL = "mylib.ops.layer_norm._layer_norm_fwd"
KEY = [4096, "torch.float16", "torch.float16"]
W4 = {"num_warps": 4, "num_ctas": 1, "num_stages": 3}
W8 = {"num_warps": 8, "num_ctas": 1, "num_stages": 3}


def choice(config: dict, key: list | None = KEY, source: str = "tuned") -> dict:
    return {"kernel": KERNEL, "key": key, "config": config, "configs": 4, "source": source}


def test_a_different_pick_is_said_with_the_parameters_that_differ() -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    assert picks.differ
    assert picks.words() == (
        "autotune picked num_warps=4 for _layer_norm_fwd (key 4096, torch.float16, "
        "torch.float16), the baseline 8"
    )
    several = compare_choices(
        [choice({"BLOCK": 512, **W4})], [choice({"BLOCK": 1024, **W8})]
    ).words()
    assert "picked BLOCK=512, num_warps=4 for" in several
    assert several.endswith("the baseline BLOCK=1024, num_warps=8")


def test_the_same_pick_another_key_or_no_baseline_record_is_no_difference() -> None:
    assert not compare_choices([choice(W8)], [choice(W8)]).differ
    assert not compare_choices([choice(W4)], [choice(W8, key=[8192, "torch.float16"])]).differ
    older = compare_choices([choice(W4)], None)
    assert not older.differ
    assert not older.baseline_recorded
    # A baseline choice without a key matches the kernel at any key.
    assert compare_choices([choice(W4)], [choice(W8, key=None)]).differ


def verdict(change_status: str, *, confirmed_change: float | None, reproduced: bool) -> VerdictPart:
    return VerdictPart(
        status=change_status,
        change_status=change_status,
        basis="time (same device: NVIDIA H200)",
        reason="slower by 7.4% (tolerance 2%), ...; confirmed by a re-measurement",
        tolerance=0.02,
        threshold=0.02,
        cross_device_tolerance=0.06,
        alpha=0.01,
        change=0.074,
        confirmed=reproduced,
        confirmation={
            "reproduced": reproduced,
            "change": confirmed_change,
            "status": REGRESSED if reproduced else OK,
        },
    )


PINNED_RUN = Remeasurement(
    fresh=True, wall_s=9.5, choices=(choice(W8, source="pinned"),), pinned_requested=True
)


@pytest.mark.parametrize(
    ("action", "status", "fails"),
    [(PIN, OK, False), (WARN, SUSPECT, False), (FAIL, REGRESSED, True)],
)
def test_a_slowdown_that_is_the_pick_follows_the_setting(
    action: str, status: str, fails: bool
) -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    first = verdict(SUSPECT, confirmed_change=0.003, reproduced=False)
    settled = settle(first, picks, PINNED_RUN, action, first_change=0.074)
    assert settled.status == status
    assert settled.failed is fails
    assert "autotune picked num_warps=4" in settled.autotune_note
    assert "with the baseline's pick pinned in a fresh process it is +0.3%" in settled.reason
    assert "the slowdown is the different pick, not the code" in settled.reason
    assert settled.autotune["decided"] == "pick"
    assert settled.autotune["action"] == action
    assert settled.autotune["remeasurement"]["wall_s"] == 9.5


def test_pin_keeps_an_unclear_pinned_measurement_suspect() -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    first = verdict(SUSPECT, confirmed_change=0.04, reproduced=False)
    first = replace(first, confirmation={**first.confirmation, "status": SUSPECT})
    assert settle(first, picks, PINNED_RUN, PIN, first_change=0.074).status == SUSPECT


@pytest.mark.parametrize("action", [PIN, WARN, FAIL])
def test_still_slower_at_the_baselines_pick_is_a_code_regression_under_every_setting(
    action: str,
) -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    first = verdict(REGRESSED, confirmed_change=0.071, reproduced=True)
    settled = settle(first, picks, PINNED_RUN, action, first_change=0.074)
    assert settled.status == REGRESSED
    assert settled.failed
    assert "still +7.1%: a code regression, not the pick" in settled.reason


def test_a_pick_that_could_not_be_pinned_fails_except_under_warn() -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    unpinned = Remeasurement(
        fresh=True,
        choices=(choice(W4),),
        pin_problems=(
            "_layer_norm_fwd: the baseline's config ... is not among the kernel's configs now",
        ),
        pinned_requested=True,
    )
    first = verdict(REGRESSED, confirmed_change=0.07, reproduced=True)
    assert settle(first, picks, unpinned, PIN, 0.074).failed
    assert "could not be pinned (_layer_norm_fwd: the baseline's config" in (
        settle(first, picks, unpinned, PIN, 0.074).reason
    )
    warned = settle(first, picks, unpinned, WARN, 0.074)
    assert warned.status == SUSPECT
    assert not warned.failed


def test_a_same_process_confirmation_says_it_used_this_processs_picks() -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    first = verdict(REGRESSED, confirmed_change=0.07, reproduced=True)
    settled = settle(first, picks, Remeasurement(fresh=False, wall_s=2.0), PIN, 0.074)
    assert "(--kernelpro-confirm-process=same), with this process's picks" in settled.reason


def test_a_pick_difference_without_a_confirmation_is_recorded_and_named_when_suspect() -> None:
    picks = compare_choices([choice(W4)], [choice(W8)])
    ok = replace(verdict(OK, confirmed_change=None, reproduced=False), confirmation=None)
    noted = note_picks(ok, picks)
    assert noted.autotune_note
    assert noted.reason == ok.reason
    suspect = replace(ok, status=SUSPECT, change_status=SUSPECT)
    assert "autotune picked num_warps=4" in note_picks(suspect, picks).reason


def test_the_changed_versions_are_named_in_a_regression_only() -> None:
    now = {"torch": "2.11.0", "triton": "3.6.0", "driver": "580.65"}
    base = {"torch": "2.11.0", "triton": "3.5.1", "driver": "570.86"}
    assert version_changes(now, base) == {
        "triton": {"baseline": "3.5.1", "now": "3.6.0"},
        "driver": {"baseline": "570.86", "now": "580.65"},
    }
    assert version_changes(now, None) == {}
    assert version_changes({"torch": "2.11.0"}, {"triton": "3.5.1"}) == {}  # one side only
    regressed = verdict(REGRESSED, confirmed_change=0.07, reproduced=True)
    named = name_environment(regressed, now, base)
    assert "triton 3.5.1 -> 3.6.0, driver 570.86 -> 580.65" in named.reason
    ok = replace(regressed, status=OK, change_status=OK)
    quiet = name_environment(ok, now, base)
    assert quiet.reason == ok.reason
    assert quiet.environment_note


def _record(**gate_fields: object) -> KernelRecord:
    record = KernelRecord(nodeid="t.py::ln", name="ln[4096]", kernel="ln", device="NVIDIA H200",
                          device_kind="cuda", outcome="passed")  # fmt: skip
    record.timing = msgspec.convert({"samples_s": [1e-4, 1.1e-4, 1.05e-4], "stats": {"median_s": 1.05e-4, "n": 3},
                     "method": "cuda-events"}, TimingPart)  # fmt: skip
    record.autotune = AutotunePart(choices=(choice(W4),), library={"cudnn.benchmark": False})
    record.environment = EnvironmentPart(torch="2.11.0", triton="3.6.0")
    pick = compare_choices([choice(W4)], [choice(W8)])
    record.gate = VerdictPart(
        status=gate_fields.get("status", "ok"),
        change_status=gate_fields.get("status", "ok"),
        reason="r",
        change=0.003,
        autotune={**pick.to_dict(), "decided": "pick"},
        autotune_note=pick.words(),
        environment_change={"triton": {"baseline": "3.5.1", "now": "3.6.0"}},
        environment_note="the environment changed since the baseline (triton 3.5.1 -> 3.6.0): ...",
    )
    return record


def test_the_baseline_keeps_choices_library_and_versions(tmp_path: Path) -> None:
    record = _record()
    saved = save_baseline(tmp_path / "b.yaml", [record], commit="c")
    entry = load_baseline(saved.path).entries["t.py::ln"]
    assert entry.autotune == [choice(W4)]
    assert entry.library == {"cudnn.benchmark": False}
    assert entry.environment == {"torch": "2.11.0", "triton": "3.6.0"}
    old = entry_dict(entry_from_record(record))
    for key in ("autotune", "library", "environment"):
        old.pop(key)
    assert parse_entry(old).autotune is None  # a file from before reads as before


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("autotune", "num_warps=8", "expected a list of mappings with a kernel name and a config"),
        ("autotune", [{"kernel": "k", "config": {}, "key": "4096"}], "autotune key of k is"),
        ("environment", {"torch": 2.11}, "expected a mapping of names to version strings"),
        ("library", ["cudnn"], "library is ['cudnn'], expected a mapping"),
    ],
)
def test_a_malformed_entry_is_refused_with_the_field(key: str, value: object, words: str) -> None:
    raw = entry_dict(entry_from_record(_record()))
    raw[key] = value
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_entry(raw)


def test_table_comment_and_junit_carry_the_notes() -> None:
    record = _record()
    table = render_terminal_table([record], width=120)
    assert "ln[4096]: autotune picked num_warps=4 for _layer_norm_fwd" in table
    assert "environment changed since the baseline: triton 3.5.1 -> 3.6.0 (1 kernel)" in table
    comment = render_comment(build_report([record], meta={}))
    assert "🔧 `ln[4096]`: `autotune picked num_warps=4" in comment
    assert (
        "🌐 environment changed since the baseline: `triton 3.5.1 -> 3.6.0 (1 kernel)`" in comment
    )
    regressed = _record(status="regressed")
    details = render_comment(build_report([regressed], meta={}))
    assert "- **Autotune:** `autotune picked num_warps=4" in details
    assert "- **Environment:** `the environment changed since the baseline" in details
    props = dict(junit_properties(record))
    assert props["kernelpro.autotune_note"].startswith("autotune picked num_warps=4")
    assert '"num_warps":4' in props["kernelpro.autotune"]
    assert props["kernelpro.environment"] == '{"torch":"2.11.0","triton":"3.6.0"}'


def test_a_pick_within_tolerance_is_counted_not_listed() -> None:
    record = _record()
    record.gate = msgspec.structs.replace(record.gate, autotune={"differences": [1]})  # no decision
    table = render_terminal_table([record], width=120)
    assert "1 kernel(s) ran with other autotune picks than the baseline's" in table
    assert "ln[4096]: autotune picked" not in table


def test_a_note_from_the_artifact_is_literal_text_in_the_comment() -> None:
    record = _record(status="suspect")
    record.gate = msgspec.structs.replace(
        record.gate, autotune_note="<img src=x onerror=alert(1)> **x**"
    )
    comment = render_comment(build_report([record], meta={}))
    assert "<img" not in comment.replace("`<img src=x onerror=alert(1)> **x**`", "")


def test_the_item_section_lists_the_choices() -> None:
    from pytest_kernelpro.gate.format import item_section

    text = item_section(_record())
    assert (
        "autotune: _layer_norm_fwd (key 4096, torch.float16, torch.float16): num_warps=4, "
        "num_ctas=1, num_stages=3 (tuned)"
    ) in text


def test_the_offline_comparison_notes_picks_and_versions(tmp_path: Path) -> None:
    from pytest_kernelpro.review.offline_gate import gate_records

    base_record = _record()
    base_record.autotune = AutotunePart(choices=(choice(W8),))
    base_record.environment = EnvironmentPart(torch="2.10.0", triton="3.6.0")
    baseline = save_baseline(tmp_path / "b.yaml", [base_record], commit="c")
    head = _record()
    head.gate = None
    (gated,) = gate_records(load_baseline(baseline.path), [head])
    assert gated.gate.autotune_note.startswith("autotune picked num_warps=4")
    assert gated.gate.environment_change == {"torch": {"baseline": "2.10.0", "now": "2.11.0"}}


def test_a_fresh_process_that_failed_is_said_in_the_confirmation_words() -> None:
    fallback = Remeasurement(fresh=False, fallback="the fresh process gave no timing (boom)")
    assert fallback.words() == (
        "a re-measurement in this process (the fresh process gave no timing)"
    )
    assert PINNED_RUN.words() == (
        "a re-measurement in a fresh process with the baseline's autotune picks pinned"
    )
    assert Remeasurement(fresh=True).words() == "a re-measurement in a fresh process"


def test_changed_library_settings_and_cudnn_benchmark_are_named() -> None:
    regressed = verdict(REGRESSED, confirmed_change=0.07, reproduced=True)
    lib_base = {"cuda.matmul.allow_tf32": False, "cudnn.benchmark": False}
    lib_now = {"cuda.matmul.allow_tf32": True, "cudnn.benchmark": True}
    named = name_environment(regressed, None, None, lib_now, lib_base)
    assert "library settings changed since the baseline (cuda.matmul.allow_tf32 False -> True" in (
        named.reason
    )
    assert "cuDNN picks its algorithms per process" in named.reason
    assert named.environment_change == {
        "library": {
            "cuda.matmul.allow_tf32": {"baseline": False, "now": True},
            "cudnn.benchmark": {"baseline": False, "now": True},
        }
    }
    record = _record(status="regressed")
    record.gate = msgspec.structs.replace(record.gate, environment_change=named.environment_change)
    table = render_terminal_table([record], width=140)
    assert "environment changed since the baseline: cuda.matmul.allow_tf32 False -> True" in table
    same = name_environment(regressed, None, None, {"cudnn.benchmark": False}, lib_base)
    assert same is regressed  # nothing changed, nothing said


# The item imports `run_differences` only where `BaselineEntry.differs_beside_code` says
# something may differ: every pair it passes over must be one the module leaves as it is.
CHOICES = ((), (choice(W4),))
ENTRY_CHOICES = (None, [], [choice(W8)])
VERSIONS = (None, {"torch": "2.11.0"}, {"torch": "2.12.0"}, {"torch": "2.11.0", "triton": "3.5"})
LIBRARIES = (
    None,
    {"cuda.matmul.allow_tf32": False},
    {"cuda.matmul.allow_tf32": True},
    {"cuda.matmul.allow_tf32": False, "cudnn.benchmark": True},
)


def test_a_run_said_to_differ_in_nothing_gets_nothing_named() -> None:
    from itertools import product

    from gate_factories import make_record

    passed_over = named = 0
    for status in (OK, SUSPECT, REGRESSED):
        first = verdict(status, confirmed_change=0.07, reproduced=status == REGRESSED)
        for head, base, now_v, base_v, now_l, base_l in product(
            CHOICES, ENTRY_CHOICES, VERSIONS, VERSIONS, LIBRARIES, LIBRARIES
        ):
            record = make_record("ln[1]")
            record.autotune = AutotunePart(choices=head, library=now_l)
            record.environment = None if now_v is None else EnvironmentPart(**now_v)
            entry = entry_from_record(make_record("ln[1]"))
            assert entry is not None
            entry.autotune, entry.environment, entry.library = base, base_v, base_l
            after = name_environment(
                note_picks(first, compare_choices(head, base)), now_v, base_v, now_l, base_l
            )
            if not entry.differs_beside_code(record):
                passed_over += 1
                assert after == first, (head, base, now_v, base_v, now_l, base_l)
            elif after != first:
                named += 1
    # Both sides of the rule are reached: runs passed over, and runs with something named.
    assert passed_over > 0
    assert named > 0
