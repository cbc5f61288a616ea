"""Which code-changing versions differ between the baseline and now, in words.

A new torch, Triton, CUDA runtime, cuDNN, nvcc or driver changes the machine code a kernel
runs without a line of the kernel changing; a regression that comes with one is named with
it ("triton 3.5.1 -> 3.6.0"), so the first suspect is on the page instead of found by
bisecting. A version one side does not record (an older baseline, a CPU run) is not a change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.gate.verdict import Verdict

# Display names, in the order a change is named (the compiler side first).
LABELS = {
    "triton": "triton",
    "torch": "torch",
    "cuda_runtime": "CUDA runtime",
    "hip_runtime": "HIP runtime",
    "cudnn": "cuDNN",
    "nvcc": "nvcc",
    "driver": "driver",
}
# Statuses whose reason names a changed environment (a slower or unclear kernel).
NAMED_IN = ("regressed", "suspect", "below-roofline")


def version_changes(
    now: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None
) -> dict[str, dict[str, str]]:
    """{name: {"baseline": old, "now": new}} for every version both sides recorded that
    differs."""
    if not now or not baseline:
        return {}
    names = [n for n in LABELS if n in now or n in baseline]
    names += sorted(n for n in {*now, *baseline} if n not in LABELS and n not in names)
    out: dict[str, dict[str, str]] = {}
    for name in names:
        new, old = now.get(name), baseline.get(name)
        if isinstance(new, str) and isinstance(old, str) and new != old:
            out[name] = {"baseline": old, "now": new}
    return out


def changes_words(changes: Mapping[str, Mapping[str, str]]) -> str:
    """'triton 3.5.1 -> 3.6.0, driver 570.86 -> 580.65' (library settings under "library")."""
    words = []
    for name, change in changes.items():
        if name == "library":
            words += [f"{n} {c['baseline']} -> {c['now']}" for n, c in change.items()]
        else:
            words.append(f"{LABELS.get(name, name)} {change['baseline']} -> {change['now']}")
    return ", ".join(words)


def environment_note(changes: Mapping[str, Mapping[str, str]]) -> str | None:
    """The sentence a verdict carries, or None without a change."""
    if not changes:
        return None
    return (
        f"the environment changed since the baseline ({changes_words(changes)}): a new "
        "compiler, library or driver changes the generated code by itself"
    )


def library_changes(
    now: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """The library algorithm settings (`measure.environment.library_choices`) both sides recorded
    that differ: TF32 on or off, cuDNN's benchmark mode, the BLAS library, ..."""
    if not now or not baseline:
        return {}
    return {
        name: {"baseline": baseline[name], "now": now[name]}
        for name in now
        if name in baseline and now[name] != baseline[name]
    }


def library_note(changes: Mapping[str, Mapping[str, Any]], now: Mapping[str, Any] | None) -> str:
    """The library part of the note: settings that changed, and cuDNN's per-process pick."""
    parts = []
    if changes:
        words = ", ".join(f"{n} {c['baseline']} -> {c['now']}" for n, c in changes.items())
        parts.append(f"library settings changed since the baseline ({words})")
    if now and now.get("cudnn.benchmark") is True:
        parts.append(
            "cuDNN benchmark mode is on (torch.backends.cudnn.benchmark): cuDNN picks its "
            "algorithms per process by timing them"
        )
    return "; ".join(parts)


def name_environment(
    verdict: Verdict,
    now: Mapping[str, Any] | None,
    baseline: Mapping[str, Any] | None,
    library_now: Mapping[str, Any] | None = None,
    library_baseline: Mapping[str, Any] | None = None,
) -> Verdict:
    """The verdict with the changed versions and library settings recorded, and named in the
    reason of a regressed or suspect kernel."""
    changes: dict[str, Any] = dict(version_changes(now, baseline))
    library = library_changes(library_now, library_baseline)
    extra = library_note(library, library_now)
    if not changes and not extra:
        return verdict
    note = "; ".join(n for n in (environment_note(changes), extra) if n)
    if library:
        changes["library"] = library
    reason = verdict.reason
    if verdict.status in NAMED_IN or verdict.change_status in NAMED_IN:
        reason = f"{reason}; {note}"
    return replace(verdict, reason=reason, environment_change=changes, environment_note=note)
