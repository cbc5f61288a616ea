"""What decides a regression after the first comparison: the re-measurement that confirms
it, and what a difference of autotune picks does to it (the picks themselves, and a changed
environment named in the reason, are `run_differences.py`'s).

**Confirmation.** A "regressed" verdict is provisional: the plugin re-times the kernel and
`confirm` lets the regression stand only if that second measurement, by itself, is a
regression under the same rules; otherwise the kernel is "suspect" (reported, never failed).
One slow measurement (another process, a clock dip) cannot fail CI. On the CPU, against the
CPU anchor, the re-measurement need not clear a widened tolerance a second time: that
tolerance (35% on a busy machine) is there for the noise between a baseline and a run, which
the first measurement already cleared, and asking twice for it missed a kernel doing twice the
work in 3 of 10 sessions (bench/results/2026-12-02-cpu-gate-cpu.md). There the regression is
reproduced when the re-measurement is slower by more than the threshold and half the
tolerance (the bar the fastest decile meets), with p < alpha, and the anchor does not show it
unusable.

**Autotune picks.** An autotuned kernel's speed is its code and its pick, and the pick is made
per process by timing the candidates. When the head picked another config than the baseline
did, a slower median may be the pick, not the code; the verdict says so in words, and the
confirmation re-measures in a fresh process with the baseline's choice pinned: still slower
at the baseline's pick is a code regression; not slower there means the different pick made
the difference. What the gate does then is `--kernelpro-autotune-mismatch`:

- `pin` (default): the kernel is gated at the baseline's pick, i.e. by the pinned
  re-measurement: a pick that alone made it slower passes ("ok"), with the note.
- `warn`: reported as "suspect" with the note, never a failure.
- `fail`: the head's pick is what users get: a slowdown it causes fails like any other.

A code regression fails under every setting. When the baseline's config cannot be pinned
(it is no longer among the kernel's configs: the code changed them), the re-measurement runs
with its own pick and a reproduced regression fails, except under `warn`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from pytest_kernelpro.gate.baseline import pct_text
from pytest_kernelpro.gate.run_differences import AutotuneComparison, PickDifference
from pytest_kernelpro.gate.verdict import (
    IMPROVED,
    OK,
    REGRESSED,
    SUSPECT,
    decide_verdict,
    finish_verdict,
    floor_status,
    needs_confirmation,
    p_text,
    roofline_floor,
)
from pytest_kernelpro.gate.verdict_basis import CPU_ANCHOR_PREFIX, UNUSABLE_WORDS, lower_bar

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord, VerdictPart

# The actions of `--kernelpro-autotune-mismatch` on a pick difference (module docstring).
FAIL = "fail"
WARN = "warn"
PIN = "pin"
MISMATCH_ACTIONS = (PIN, WARN, FAIL)


# The confirmation: an independent re-measurement settles a provisional change.


def slower_again_on_the_cpu(first: VerdictPart, second: VerdictPart) -> bool:
    """True when a CPU-anchored regression's re-measurement shows the slowdown again by the
    module docstring's rule; False for any other comparison, which needs its own verdict."""
    if first.change_status != REGRESSED or not (second.anchor or "").startswith(CPU_ANCHOR_PREFIX):
        return False
    if second.change is None or second.p_value is None or UNUSABLE_WORDS in second.reason:
        return False
    bar = lower_bar(second.threshold, second.tolerance)
    return second.change > bar and second.p_value < second.alpha


def confirm(
    first: VerdictPart,
    record_after_remeasure: KernelRecord,
    entry: BaselineEntry,
    *,
    cross_cpu: str = "info",
    where: str = "a re-measurement",
) -> VerdictPart:
    """Settle a provisional regression with an independent re-measurement, made as `where`
    says (module docstring); verdicts that need no confirmation are returned unchanged."""
    if not needs_confirmation(first):
        return first
    second = decide_verdict(
        record_after_remeasure,
        entry,
        threshold=first.threshold,
        cross_device_tolerance=first.cross_device_tolerance,
        alpha=first.alpha,
        cross_cpu=cross_cpu,
    )
    reproduced = second.change_status == first.change_status or slower_again_on_the_cpu(
        first, second
    )
    confirmation = {
        "reproduced": reproduced,
        "change": second.change,
        "raw_change": second.raw_change,
        "anchor_change": second.anchor_change,
        "basis": second.basis,
        "p_value": second.p_value,
        "current_median_s": second.current_median_s,
        "n": second.n_current,
        "status": second.change_status,
        # The re-measurement's own gated time, where its verdict was not on the wall median.
        "gated_label": second.gated_label,
        "gated_now_s": second.gated_now_s,
        "gated_baseline_s": second.gated_baseline_s,
    }
    core = first.reason.split("; needs a confirmation")[0]
    if reproduced:
        core = (
            f"{core}; confirmed by {where} "
            f"({pct_text(second.change or 0.0)}, p = {p_text(second.p_value or 1.0)})"
        )
        status = first.change_status
    else:
        again = "not timed" if second.change is None else pct_text(second.change)
        if second.p_value is not None:
            again += f", p = {p_text(second.p_value)}"
        what = "an improvement" if first.change_status == IMPROVED else "a regression"
        core = (
            f"{core}, but {where.replace('a re-measurement', 'the re-measurement', 1)} did "
            f"not reproduce it ({again}): "
            f"treated as noise, not {what}"
        )
        status = OK if first.change_status == IMPROVED else SUSPECT
    _, floor_reason = roofline_floor(first.min_roofline, first.efficiency, True)
    decided = ("status", "change_status", "reason", "confirmed", "confirmation")
    kept = {name: getattr(first, name) for name in first.__struct_fields__ if name not in decided}
    return finish_verdict(
        change_status=status,
        reason=core,
        floor_reason=floor_reason,
        confirmed=reproduced,
        confirmation=confirmation,
        **kept,
    )


@dataclass(frozen=True)
class Remeasurement:
    """How the confirmation re-measured: where, with which pins applied, what it cost."""

    fresh: bool
    wall_s: float | None = None
    # The re-measurement's own choices (`measure.environment`), with source "pinned" where the
    # baseline's choice was imposed, and why a pin could not be applied.
    choices: tuple[dict[str, Any], ...] = ()
    pin_problems: tuple[str, ...] = ()
    fallback: str | None = None  # why a fresh process was wanted but not used
    pinned_requested: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def words(self) -> str:
        """How the re-measurement was made, for the confirmation sentence."""
        where = "a re-measurement in a fresh process" if self.fresh else "a re-measurement"
        if self.fallback:
            where = "a re-measurement in this process (the fresh process gave no timing)"
        if self.fresh and self.pinned_requested and not self.pin_problems:
            where += " with the baseline's autotune picks pinned"
        return where

    def pinned(self, difference: PickDifference) -> bool:
        """True when the re-measurement ran this kernel and key at the baseline's config."""
        return any(
            c.get("kernel") == difference.kernel
            and (difference.key is None or c.get("key") == difference.key)
            and c.get("config") == difference.baseline
            for c in self.choices
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fresh_process": self.fresh, "wall_s": self.wall_s}
        if self.pinned_requested:
            out["pins_applied"] = sum(1 for c in self.choices if c.get("source") == "pinned")
        if self.pin_problems:
            out["pin_problems"] = list(self.pin_problems)
        if self.fallback:
            out["fallback"] = self.fallback
        out.update(self.extra)
        return out


def _with_status(verdict: VerdictPart, change_status: str, **changes: Any) -> VerdictPart:
    """`verdict` with a new change status; the min_roofline floor still decides the status
    of a kernel below it (`verdict.floor_status`)."""
    status = floor_status(change_status, verdict.below_roofline)
    return replace(verdict, change_status=change_status, status=status, **changes)


def settle(
    confirmed: VerdictPart,
    picks: AutotuneComparison,
    remeasured: Remeasurement,
    action: str,
    first_change: float | None,
) -> VerdictPart:
    """The confirmed verdict with the pick difference decided by `action` (module
    docstring); `first_change` is the change of the first, unpinned measurement."""
    if action not in MISMATCH_ACTIONS:
        raise ValueError(f"autotune mismatch action {action!r}; use one of {MISMATCH_ACTIONS}")
    data = {**picks.to_dict(), "action": action, "remeasurement": remeasured.to_dict()}
    if not picks.differ:
        if picks.head_choices == 0 and not remeasured.fresh and not remeasured.fallback:
            return confirmed
        return replace(confirmed, autotune=data)
    reproduced = confirmed.change_status == REGRESSED
    again = "–" if confirmed.confirmation is None else confirmed.confirmation.get("change")
    again_text = pct_text(again) if isinstance(again, (int, float)) else "not timed"
    pinned = remeasured.fresh and all(remeasured.pinned(d) for d in picks.differences)
    head = picks.words()
    if not pinned:
        why = "; ".join(remeasured.pin_problems) or remeasured.fallback
        if not why and not remeasured.fresh:
            why = (
                "the re-measurement ran in this process (--kernelpro-confirm-process=same), "
                "with this process's picks"
            )
        why = why or "the re-measurement did not run at the baseline's picks"
        note = f"{head}; the baseline's pick could not be pinned ({why})"
        data["decided"] = "unpinned"
        if reproduced and action == WARN:
            return _with_status(
                confirmed,
                SUSPECT,
                reason=f"{confirmed.reason}; {note}; reported, not failed "
                "(--kernelpro-autotune-mismatch=warn)",
                autotune=data,
                autotune_note=note,
            )
        return replace(
            confirmed, reason=f"{confirmed.reason}; {note}", autotune=data, autotune_note=note
        )
    if reproduced:
        note = (
            f"{head}; with the baseline's pick pinned in a fresh process it is still "
            f"{again_text}: a code regression, not the pick"
        )
        data["decided"] = "code"
        return replace(
            confirmed, reason=f"{confirmed.reason}; {note}", autotune=data, autotune_note=note
        )
    note = (
        f"{head}; with the baseline's pick pinned in a fresh process it is {again_text}: "
        "the slowdown is the different pick, not the code"
    )
    data["decided"] = "pick"
    first = f"{abs(first_change):.1%}" if first_change is not None else "more than the tolerance"
    if action == FAIL:
        reason = (
            f"slower by {first} with autotune's own pick; {note}. Failed because "
            "--kernelpro-autotune-mismatch=fail gates the pick the head makes (pin gates at "
            "the baseline's pick)"
        )
        return _with_status(
            confirmed, REGRESSED, confirmed=True, reason=reason, autotune=data, autotune_note=note
        )
    if action == WARN:
        reason = (
            f"slower by {first} with autotune's own pick; {note}. Reported, not failed "
            "(--kernelpro-autotune-mismatch=warn)"
        )
        return _with_status(confirmed, SUSPECT, reason=reason, autotune=data, autotune_note=note)
    # pin: the pinned re-measurement is the verdict; one that was itself unclear stays suspect.
    second = (confirmed.confirmation or {}).get("status")
    status = OK if second in (OK, IMPROVED) else SUSPECT
    reason = (
        f"{note}; gated at the baseline's pick (--kernelpro-autotune-mismatch=pin): "
        f"{again_text} there, slower by {first} with the head's own pick"
    )
    pinned_change = again if isinstance(again, (int, float)) else confirmed.change
    conf = confirmed.confirmation or {}
    return _with_status(
        confirmed,
        status,
        change=pinned_change,
        # The number shown is the number gated: the pinned re-measurement's.
        gated_label=f"{conf.get('gated_label') or 'wall'}, fresh process, baseline's pick",
        gated_now_s=conf.get("gated_now_s") or conf.get("current_median_s"),
        gated_baseline_s=conf.get("gated_baseline_s") or confirmed.baseline_median_s,
        reason=reason,
        autotune={**data, "unpinned_change": first_change},
        autotune_note=note,
    )
