"""What differs between the baseline's run and this one beside the kernel's code, named in
the verdict's reason: the autotune picks (what a difference does to a regression:
`confirmation.py`) and the versions and library settings that change generated code.

A new torch, Triton, CUDA runtime, cuDNN, nvcc or driver changes the machine code without a
line of the kernel changing: a regression that comes with one is named with it ("triton 3.5.1
-> 3.6.0"), so the first suspect is on the page. A version one side does not record (an older
baseline, a CPU run) is not a change.

A run whose picks, versions and library settings equal the baseline's has nothing here to say:
the item imports this module only when `BaselineEntry.differs_beside_code` says one may differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec.structs import replace

from pytest_kernelpro.gate.verdict import BELOW_ROOFLINE, IMPROVED, REGRESSED, SUSPECT
from pytest_kernelpro.record import VerdictPart

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
NAMED_IN = (REGRESSED, SUSPECT, BELOW_ROOFLINE)


def _short_kernel(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _key_words(key: Sequence[Any] | None) -> str:
    return "key unknown" if key is None else "key " + ", ".join(str(v) for v in key)


@dataclass(frozen=True)
class PickDifference:
    """One autotuned kernel and key whose config differs from the baseline's."""

    kernel: str
    key: list[Any] | None
    now: dict[str, Any]
    baseline: dict[str, Any]

    def words(self) -> str:
        """'autotune picked num_warps=4 for _layer_norm_fwd (key 4096, torch.float16), the
        baseline num_warps=8': the parameters that differ, each side's value."""
        names = [n for n in self.now if self.now.get(n) != self.baseline.get(n)]
        names += [n for n in self.baseline if n not in self.now]
        now = ", ".join(f"{n}={self.now.get(n, '(unset)')}" for n in names)
        base = ", ".join(str(self.baseline.get(n, "(unset)")) for n in names)
        if len(names) > 1:
            base = ", ".join(f"{n}={self.baseline.get(n, '(unset)')}" for n in names)
        return (
            f"autotune picked {now} for {_short_kernel(self.kernel)} ({_key_words(self.key)}), "
            f"the baseline {base}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "key": self.key, "now": self.now, "baseline": self.baseline}


@dataclass(frozen=True)
class AutotuneComparison:
    """The head's choices against the baseline entry's."""

    differences: tuple[PickDifference, ...] = ()
    baseline_choices: tuple[dict[str, Any], ...] = ()
    head_choices: int = 0
    baseline_recorded: bool = True  # False: an older baseline without choices

    @property
    def differ(self) -> bool:
        return bool(self.differences)

    def words(self) -> str:
        return "; ".join(d.words() for d in self.differences)

    def to_dict(self) -> dict[str, Any]:
        return {
            "differences": [d.to_dict() for d in self.differences],
            "head_choices": self.head_choices,
            "baseline_choices": len(self.baseline_choices),
            "baseline_recorded": self.baseline_recorded,
        }


def _choices(value: Any) -> list[Mapping[str, Any]]:
    return [c for c in value or () if isinstance(c, Mapping) and isinstance(c.get("config"), dict)]


def compare_choices(
    head: Iterable[Mapping[str, Any]] | None, baseline: Iterable[Mapping[str, Any]] | None
) -> AutotuneComparison:
    """The kernels and keys both sides tuned whose configs differ. A key only one side tuned
    (another shape) is no difference of pick; a baseline choice without a key matches the
    kernel's choices at any key."""
    head_list = _choices(head)
    if baseline is None:
        return AutotuneComparison(head_choices=len(head_list), baseline_recorded=False)
    base_list = _choices(baseline)
    differences: list[PickDifference] = []
    for choice in head_list:
        for old in base_list:
            if old.get("kernel") != choice.get("kernel"):
                continue
            if old.get("key") is not None and old.get("key") != choice.get("key"):
                continue
            if dict(old["config"]) != dict(choice["config"]):
                differences.append(
                    PickDifference(
                        kernel=str(choice["kernel"]),
                        key=choice.get("key"),
                        now=dict(choice["config"]),
                        baseline=dict(old["config"]),
                    )
                )
            break
    return AutotuneComparison(
        differences=tuple(differences),
        baseline_choices=tuple(dict(c) for c in base_list),
        head_choices=len(head_list),
    )


def note_picks(verdict: VerdictPart, picks: AutotuneComparison) -> VerdictPart:
    """A verdict that needed no re-measurement, with a pick difference recorded (and named in
    the reason of a suspect or improved kernel, where it may be the cause)."""
    if not picks.differ and picks.baseline_recorded:
        return verdict
    data = picks.to_dict()
    if not picks.differ:
        return replace(verdict, autotune=data)
    note = picks.words()
    reason = verdict.reason
    if verdict.change_status in (SUSPECT, IMPROVED):
        reason = f"{reason}; {note}"
    return replace(verdict, reason=reason, autotune=data, autotune_note=note)


# A changed environment: the code-changing versions and library settings that differ
# between the baseline and now, in words.


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
    """Library settings (`measure.environment.library_choices`) both sides recorded that differ."""
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
    verdict: VerdictPart,
    now: Mapping[str, Any] | None,
    baseline: Mapping[str, Any] | None,
    library_now: Mapping[str, Any] | None = None,
    library_baseline: Mapping[str, Any] | None = None,
) -> VerdictPart:
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
