"""Writing a baseline file (`--kernelpro-save-baseline`): the measured records' entries,
merged with the entries already in the file, written atomically under a lock, and the note
on entries too noisy to gate on (`too_noisy_note`). A check session only reads baselines
(`gate/baseline.py`) and never imports this.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.fileio import atomic_write_text
from pytest_kernelpro.gate.baseline import (
    Baseline,
    BaselineEntry,
    BaselineError,
    detect_commit,
    load_baseline,
)
from pytest_kernelpro.gate.render_session import NOTE_WIDTH, Note
from pytest_kernelpro.gate.verdict import RESOLVABLE_TOLERANCE, decide_verdict
from pytest_kernelpro.record import KernelRecord


def _session_device(records: list[KernelRecord]) -> str:
    devices = [r.device for r in records if r.device]
    return max(set(devices), key=devices.count) if devices else ""


def save_baseline(
    path: str | os.PathLike[str],
    records: Iterable[KernelRecord],
    *,
    commit: str | None = None,
    merge: bool = True,
) -> Baseline:
    """Write the baseline of the measured `records` to `path` atomically and return it.

    With `merge=True` the entries of kernels that are in the existing file but were not
    measured this time (deselected, failed, skipped) are kept, so a partial run does not
    erase the rest of the baseline. An unreadable existing file is replaced, with a warning.
    Records without timing samples are left out.
    """
    records = list(records)
    target = Path(path)
    # Read, merge and write under one lock: two processes saving the same file (xdist
    # controllers of two jobs, a save while another runs) must not lose either's entries.
    with _locked(target):
        return _save_locked(target, records, commit=commit, merge=merge)


def _save_locked(
    target: Path, records: list[KernelRecord], *, commit: str | None, merge: bool
) -> Baseline:
    entries: dict[str, BaselineEntry] = {}
    if merge and target.exists():
        try:
            entries.update(load_baseline(target).entries)
        except BaselineError as exc:
            warnings.warn(
                f"kernelpro: replacing the unreadable baseline {target} ({exc})",
                KernelproWarning,
                stacklevel=2,
            )
    measured = 0
    for record in records:
        entry = BaselineEntry.from_record(record)
        if entry is not None:
            entries[record.nodeid] = entry
            measured += 1
    if not entries:
        raise BaselineError(
            f"kernelpro baseline {target}: none of the {len(records)} kernel item(s) was "
            "measured (no timing samples), so there is nothing to save. Fix: make the kernel "
            "items pass (see their failures above) and save the baseline again."
        )
    baseline = Baseline(
        path=str(target),
        device=_session_device(records) or _session_device_from_entries(entries),
        commit=commit if commit is not None else detect_commit(),
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        tool=f"pytest-kernelpro {__version__}",
        entries=entries,
    )
    import yaml

    header = (
        "# pytest-kernelpro baseline: written by --kernelpro-save-baseline; "
        "read by --kernelpro-check --kernelpro-baseline\n"
    )
    text = yaml.safe_dump(baseline.to_dict(), sort_keys=False, default_flow_style=None, width=100)
    atomic_write_text(target, header + text)
    return baseline


def _session_device_from_entries(entries: Mapping[str, BaselineEntry]) -> str:
    devices = [e.device for e in entries.values() if e.device]
    return max(set(devices), key=devices.count) if devices else ""


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on the directory of `target` (POSIX flock; elsewhere none).

    The directory, not a lock file beside the baseline: it leaves nothing behind, and it
    stays the same object while `atomic_write_text` replaces the file itself.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks through fcntl
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def too_noisy_note(records: Iterable[KernelRecord]) -> Note | None:
    """The kernels whose saved entry could not catch a 1.5x change: each record compared
    with its own entry, as an unchanged next run would be, gets a tolerance above
    `verdict.RESOLVABLE_TOLERANCE` (a bimodal or widely scattered timing, a loaded machine),
    so every later check of it would read "unresolved". None when every entry is fine."""
    noisy: list[tuple[str, float, str]] = []
    for record in records:
        entry = BaselineEntry.from_record(record)
        if entry is None:
            continue
        try:
            verdict = decide_verdict(record, entry)
        except (KernelproError, ValueError):
            continue  # an entry the gate cannot read is said when it is compared
        if verdict.tolerance > RESOLVABLE_TOLERANCE:
            noisy.append((record.name, verdict.tolerance, verdict.reason))
    if not noisy:
        return None
    fix = "re-save it on a quiet machine or with a longer --kernelpro-time-budget"
    worst = max(noisy, key=lambda n: n[1])
    head = f"baseline: {len(noisy)} entr{'y' if len(noisy) == 1 else 'ies'} too noisy to catch 1.5x"
    tail = "; re-save it on a quiet machine"
    short = f"{head} ({worst[0]} ±{worst[1]:.0%}){tail}"
    if len(short) > NOTE_WIDTH:  # a long name gives way, the fix stays
        short = f"{head} (±{worst[1]:.0%}){tail}"
    full = (
        f"the saved baseline has {len(noisy)} entr{'y' if len(noisy) == 1 else 'ies'} too noisy "
        "to catch a 1.5x change; every check against it will read them 'unresolved': "
        + "; ".join(f"{name}: tolerance ±{tol:.0%} ({reason})" for name, tol, reason in noisy)
        + f". Fix: {fix}"
    )
    return Note(short, full)
