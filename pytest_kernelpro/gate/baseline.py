"""Baselines: one YAML file per device run, written atomically, validated when read.

Layout (schema 1)::

    schema_version: 1
    tool: pytest-kernelpro 0.1.0
    device: NVIDIA H200
    commit: 3f2a9c...            # or null
    created: '2026-11-30T12:00:00+00:00'
    kernels:
      tests/test_softmax.py::softmax[8192x4096]:
        name: softmax[8192x4096]
        kernel: softmax
        device: NVIDIA H200
        median_s: 5.21e-05
        q1_s: 5.19e-05
        q3_s: 5.24e-05
        n: 1840                  # samples behind median/q1/q3
        efficiency: 0.61
        roofline_time_s: 3.18e-05
        method: cuda-events
        sm_mhz: 1592.4           # GPU timings: the clock the samples ran at (clock_scale.py)
        max_sm_mhz: 1980.0
        clock_capped_share: 1.0
        bound: compute
        anchor: bf16 matmul 4096x4096x4096 (torch 2.11.0+cu130, CUDA 13.0)  # when the
        anchor_median_s: 0.000201                 # warm-up ran capped: the clock anchor
        anchor_ratios: [...]                      # paired with each sample (clock_anchor.py)
        samples_s: [...]         # <= BASELINE_SAMPLES order statistics (baseline_entry.py)

The clock and anchor keys are optional: files written before they existed load unchanged
(their comparisons fall back to the rules those files were made for). One entry's fields and
their parsing are `baseline_entry.py`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import subprocess
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.fileio import atomic_write_text
from pytest_kernelpro.gate.baseline_entry import BASELINE_SAMPLES, BaselineEntry, parse_entry
from pytest_kernelpro.record import KernelRecord

__all__ = [
    "BASELINE_SAMPLES",
    "BASELINE_SCHEMA_VERSION",
    "DEFAULT_BASELINE_PATH",
    "Baseline",
    "BaselineEntry",
    "BaselineError",
    "EntryMap",
    "detect_commit",
    "load_baseline",
    "save_baseline",
    "unmatched",
]

BASELINE_SCHEMA_VERSION = 1
DEFAULT_BASELINE_PATH = ".kernelpro/baseline.yaml"
_SAVE_HINT = "regenerate it with `pytest --kernelpro-save-baseline={path}` on the base commit"


class BaselineError(KernelproError):
    """A baseline file is missing, empty, corrupt or of another schema version."""


class EntryMap(dict[str, BaselineEntry]):
    """Entries keyed by node id; `get` with an item name also finds a uniquely named entry.

    So `entries.get(record.nodeid)` and `entries.get(record.name)` both work: a lookup by
    the wrong key must not turn every kernel into "new" (a silently passing gate).
    """

    def get(self, key: str, default: BaselineEntry | None = None) -> BaselineEntry | None:  # type: ignore[override]
        if key in self:
            return self[key]
        same_name = [e for e in self.values() if e.name == key]
        return same_name[0] if len(same_name) == 1 else default


@dataclass
class Baseline:
    """A loaded (or just written) baseline file."""

    path: str
    device: str
    commit: str | None
    created: str
    tool: str
    entries: EntryMap = field(default_factory=EntryMap)
    schema_version: int = BASELINE_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.entries, EntryMap):
            self.entries = EntryMap(self.entries)

    def entry_for(self, record: KernelRecord) -> BaselineEntry | None:
        """The entry of this record: by node id, else by item name when that is unique.

        The name fallback keeps a baseline usable after a test file was moved or renamed.
        """
        entry = self.entries.get(record.nodeid)
        return entry if entry is not None else self.entries.get(record.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "tool": self.tool,
            "device": self.device,
            "commit": self.commit,
            "created": self.created,
            "kernels": {key: e.to_dict() for key, e in sorted(self.entries.items())},
        }


def detect_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit being measured: KERNELPRO_COMMIT, else `git rev-parse HEAD`, else GITHUB_SHA.

    git comes before GITHUB_SHA on purpose: on `pull_request` events GITHUB_SHA is the
    synthetic merge commit, and in a base-commit checkout it is not the commit measured.
    """
    explicit = os.environ.get("KERNELPRO_COMMIT")
    if explicit:
        return explicit.strip()
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("GITHUB_SHA") or None


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


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Read and validate a baseline; every problem is a `BaselineError` naming the fix."""
    import yaml

    target = Path(path)
    hint = _SAVE_HINT.format(path=target)

    def fail(what: str) -> BaselineError:
        return BaselineError(f"kernelpro baseline {target}: {what}. Fix: {hint}.")

    if not target.exists():
        raise fail("the file does not exist")
    if target.is_dir():
        raise fail("is a directory, not a YAML file")
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot be read ({exc.__class__.__name__}: {exc})") from exc
    if not text.strip():
        raise fail("the file is empty")
    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise fail(f"is not valid YAML{at} ({getattr(exc, 'problem', exc)})") from exc
    if data is None:
        raise fail("the file is empty")
    if not isinstance(data, dict):
        raise fail(f"the top level is a {type(data).__name__}, expected a mapping")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise fail(f"schema_version is {version!r}, expected an integer")
    if version < BASELINE_SCHEMA_VERSION:
        raise fail(
            f"it has schema version {version}, older than the version "
            f"{BASELINE_SCHEMA_VERSION} this pytest-kernelpro {__version__} reads"
        )
    if version > BASELINE_SCHEMA_VERSION:
        raise BaselineError(
            f"kernelpro baseline {target}: it has schema version {version}, newer than the "
            f"version {BASELINE_SCHEMA_VERSION} this pytest-kernelpro {__version__} reads. "
            f"Fix: upgrade pytest-kernelpro, or {hint}."
        )
    kernels = data.get("kernels")
    if not isinstance(kernels, dict):
        raise fail(f"'kernels' is {type(kernels).__name__}, expected a mapping")
    if not kernels:
        raise fail("'kernels' is empty, so every kernel would pass as new")
    entries: dict[str, BaselineEntry] = {}
    for key, raw in kernels.items():
        try:
            entries[str(key)] = parse_entry(raw)
        except ValueError as exc:
            raise fail(f"kernel {key!r}: {exc}") from None
    for name in ("device", "created", "tool"):
        if data.get(name) is not None and not isinstance(data.get(name), str):
            raise fail(f"{name} is {data.get(name)!r}, expected a string")
    commit = data.get("commit")
    if commit is not None and not isinstance(commit, str):
        raise fail(f"commit is {commit!r}, expected a string or null")
    return Baseline(
        path=str(target),
        device=data.get("device") or "",
        commit=commit,
        created=str(data.get("created") or ""),
        tool=str(data.get("tool") or ""),
        entries=entries,
        schema_version=version,
    )


def _unique_key_loader() -> type:
    """A SafeLoader that refuses a mapping with the same key twice.

    PyYAML keeps the last of two equal keys without a word, so a baseline with a kernel
    entered twice (a bad merge) would gate against whichever copy came last.
    """
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key] + 1}); each kernel "
                    "may appear once",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping(node, deep=True)

    UniqueKeyLoader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
        construct_mapping,  # type: ignore[arg-type]
    )
    return UniqueKeyLoader


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


def unmatched(baseline: Baseline, records: Iterable[KernelRecord]) -> tuple[list[str], list[str]]:
    """(baseline entries no record of this run matched, records with no baseline entry).

    A kernel renamed or removed since the baseline leaves an entry behind; a new or renamed
    one has none. Both are reported by the check, so neither passes without a word.
    """
    records = list(records)
    matched: set[int] = set()
    without: list[str] = []
    by_id = {id(entry): key for key, entry in baseline.entries.items()}
    for record in records:
        entry = baseline.entry_for(record)
        if entry is None:
            if record.timing:
                without.append(record.name)
        else:
            matched.add(id(entry))
    left = sorted(key for ident, key in by_id.items() if ident not in matched)
    return left, sorted(without)
