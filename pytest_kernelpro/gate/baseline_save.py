"""Writing a baseline file (`--kernelpro-save-baseline`), merged with the entries already in
the file, written atomically under a lock. A check session only reads baselines
(`gate/baseline.py`) and never imports this.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.fileio import atomic_write_text
from pytest_kernelpro.gate.baseline import (
    Baseline,
    BaselineEntry,
    BaselineError,
    anchor_of_timing,
    detect_commit,
    finite_positive,
    load_baseline,
    quantile_subsample,
    record_clock_facts,
    record_cpu_anchor,
)
from pytest_kernelpro.gate.format import NOTE_WIDTH, Note, finite_float
from pytest_kernelpro.gate.verdict import RESOLVABLE_TOLERANCE, decide_verdict
from pytest_kernelpro.record import KernelRecord

# Up to 200 samples: at that size the regression test (Mann-Whitney U at alpha 0.01,
# `verdict.py`) already resolves a shift far under the smallest threshold, so more would only
# make the file bigger. The kept values are the sample's quantiles
# (`quantile_subsample`); `median_s`, `q1_s`, `q3_s` and `n` come from all samples.
BASELINE_SAMPLES = 200


def entry_from_record(record: KernelRecord) -> BaselineEntry | None:
    """The entry for a measured record; None when the record has no timing samples."""
    timing, stats = record.timing, record.timing.stats if record.timing else None
    if timing is None or stats is None:
        return None
    samples = [float(v) for v in timing.samples_s or () if finite_positive(v)]
    med = stats.median_s
    if not samples or med is None or not finite_positive(med):
        return None
    clock = record_clock_facts(record)
    anchor = anchor_of_timing(timing.anchor)
    cpu = record_cpu_anchor(record)
    return BaselineEntry(
        name=record.name,
        kernel=record.kernel,
        device=record.device,
        median_s=float(med),
        q1_s=finite_float(stats.q1_s),
        q3_s=finite_float(stats.q3_s),
        n=int(stats.n or len(samples)),
        efficiency=finite_float(record.efficiency),
        roofline_time_s=finite_float(record.roofline_time_s),
        method=timing.method,
        samples_s=quantile_subsample(samples, BASELINE_SAMPLES),
        sm_mhz=clock.sm_mhz,
        max_sm_mhz=clock.max_sm_mhz,
        clock_capped_share=clock.capped_share,
        bound=clock.bound,
        anchor=None if anchor is None else anchor.name,
        anchor_median_s=None if anchor is None else anchor.anchor_median_s,
        anchor_ratios=None
        if anchor is None
        else quantile_subsample(list(anchor.ratios), BASELINE_SAMPLES),
        autotune=None if record.autotune is None else list(record.autotune.choices),
        library=None if record.autotune is None else record.autotune.library,
        environment=None if record.environment is None else record.environment.versions(),
        cpu_kernel_s=None if cpu is None else quantile_subsample(cpu.kernel_s, BASELINE_SAMPLES),
        cpu_anchor_s=None if cpu is None else quantile_subsample(cpu.anchor_s, BASELINE_SAMPLES),
        cpu_busy=None if cpu is None else cpu.busy,
        cpu_memory_s=quantile_subsample(cpu.memory_s, BASELINE_SAMPLES)
        if cpu is not None and cpu.memory_s
        else None,
    )


def _sig(value: float | None) -> float | None:
    """Six significant digits: below the timers' resolution, and a third the size."""
    if value is None:
        return None
    return float(f"{float(value):.6g}")


def _known(**values: Any) -> dict[str, Any]:
    """`values` without those that are None."""
    return {key: value for key, value in values.items() if value is not None}


def entry_dict(entry: BaselineEntry) -> dict[str, Any]:
    """The entry in plain types only, in a stable key order, for YAML (clock and anchor keys
    only when known, so a baseline without them reads as before)."""
    clock = _known(
        sm_mhz=_sig(entry.sm_mhz),
        max_sm_mhz=_sig(entry.max_sm_mhz),
        clock_capped_share=_sig(entry.clock_capped_share),
        bound=entry.bound,
    )
    if entry.anchor and entry.anchor_ratios:
        clock.update(
            anchor=entry.anchor,
            anchor_median_s=_sig(entry.anchor_median_s),
            anchor_ratios=[_sig(v) for v in entry.anchor_ratios],
        )
    process = _known(autotune=entry.autotune, library=entry.library, environment=entry.environment)
    if entry.cpu_kernel_s and entry.cpu_anchor_s:
        clock.update(
            cpu_kernel_s=[_sig(v) for v in entry.cpu_kernel_s],
            cpu_anchor_s=[_sig(v) for v in entry.cpu_anchor_s],
        )
        if entry.cpu_busy:
            clock["cpu_busy"] = entry.cpu_busy
        if entry.cpu_memory_s:
            clock["cpu_memory_s"] = [_sig(v) for v in entry.cpu_memory_s]
    return {
        "name": entry.name,
        "kernel": entry.kernel,
        "device": entry.device,
        "median_s": _sig(entry.median_s),
        "q1_s": _sig(entry.q1_s),
        "q3_s": _sig(entry.q3_s),
        "n": int(entry.n),
        "efficiency": _sig(entry.efficiency),
        "roofline_time_s": _sig(entry.roofline_time_s),
        "method": entry.method,
        **clock,
        **process,
        "samples_s": [_sig(v) for v in entry.samples_s],
    }


def baseline_dict(baseline: Baseline) -> dict[str, Any]:
    """The baseline file's content, its entries in node id order."""
    return {
        "schema_version": baseline.schema_version,
        "tool": baseline.tool,
        "device": baseline.device,
        "commit": baseline.commit,
        "created": baseline.created,
        "kernels": {key: entry_dict(e) for key, e in sorted(baseline.entries.items())},
    }


def _most_common_device(devices: Iterable[str]) -> str:
    named = [device for device in devices if device]
    return max(set(named), key=named.count) if named else ""


def save_baseline(
    path: str | os.PathLike[str],
    records: Iterable[KernelRecord],
    *,
    commit: str | None = None,
) -> Baseline:
    """Write the baseline of the measured `records` (those with timing samples) to `path`
    atomically and return it. The entries of kernels in the existing file but not measured this
    time (deselected, failed, skipped) are kept, so a partial run does not erase the rest of the
    baseline. An unreadable existing file is replaced, with a warning."""
    records = list(records)
    target = Path(path)
    # Read, merge and write under one lock: two processes saving the same file (xdist
    # controllers of two jobs, a save while another runs) must not lose either's entries.
    with _locked(target):
        return _save_locked(target, records, commit=commit)


def _save_locked(target: Path, records: list[KernelRecord], *, commit: str | None) -> Baseline:
    entries: dict[str, BaselineEntry] = {}
    if target.exists():
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
        entry = entry_from_record(record)
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
        device=_most_common_device(r.device for r in records)
        or _most_common_device(e.device for e in entries.values()),
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
    text = yaml.safe_dump(
        baseline_dict(baseline), sort_keys=False, default_flow_style=None, width=100
    )
    atomic_write_text(target, header + text)
    return baseline


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on the directory of `target` (POSIX flock; elsewhere none): it
    leaves nothing behind, and stays the same object while the file itself is replaced."""
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
        entry = entry_from_record(record)
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
