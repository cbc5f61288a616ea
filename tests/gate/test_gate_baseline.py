"""Baselines: round trip, merging, commit detection, and every bad-baseline case."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from gate_factories import make_record

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.gate.baseline import (
    BASELINE_SCHEMA_VERSION,
    BaselineError,
    detect_commit,
    load_baseline,
)
from pytest_kernelpro.gate.baseline_save import BASELINE_SAMPLES, save_baseline


@pytest.fixture
def records() -> list:
    return [
        make_record("softmax[8192x4096]", median_s=52e-6, n=1500, seed=1),
        make_record("rmsnorm[16384x1024]", median_s=31e-6, n=120, seed=2),
    ]


def test_round_trip(tmp_path: Path, records: list) -> None:
    path = tmp_path / "base" / "kernelpro-baseline.yaml"
    saved = save_baseline(path, records, commit="abc123")
    loaded = load_baseline(path)
    assert loaded.schema_version == BASELINE_SCHEMA_VERSION
    assert loaded.commit == "abc123"
    assert loaded.device == "NVIDIA H200"
    assert loaded.created == saved.created
    assert set(loaded.entries) == {r.nodeid for r in records}
    big = loaded.entries[records[0].nodeid]
    assert big.name == "softmax[8192x4096]"
    assert big.n == 1500
    assert len(big.samples_s) == BASELINE_SAMPLES  # subsampled from 1500
    assert big.median_s == pytest.approx(records[0].median_s, rel=1e-5)
    assert float(np.median(big.samples_s)) == pytest.approx(big.median_s, rel=0.005)
    assert big.efficiency == pytest.approx(records[0].efficiency, rel=1e-5)
    assert big.roofline_time_s == pytest.approx(30e-6)
    assert big.q1_s < big.median_s < big.q3_s
    small = loaded.entries[records[1].nodeid]
    assert len(small.samples_s) == 120  # fewer than the cap: all kept
    assert loaded.entry_for(records[1]) is small
    # Plain YAML a person can read, with a header saying what wrote it.
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# pytest-kernelpro baseline")
    assert yaml.safe_load(text)["kernels"][records[0].nodeid]["median_s"] == big.median_s
    assert [p.name for p in path.parent.iterdir()] == ["kernelpro-baseline.yaml"]  # no temp


def test_entry_for_falls_back_to_a_unique_name(tmp_path: Path, records: list) -> None:
    save_baseline(tmp_path / "b.yaml", records, commit=None)
    moved = make_record("softmax[8192x4096]")
    moved.nodeid = "kernels/test_moved.py::softmax[8192x4096]"
    loaded = load_baseline(tmp_path / "b.yaml")
    # A lookup by item name must not miss (every kernel "new" would be a passing gate).
    assert loaded.entry_for(moved) is loaded.entries[records[0].nodeid]
    assert loaded.entry_for(make_record("nope[1]")) is None


def test_merge_keeps_kernels_not_run(tmp_path: Path, records: list) -> None:
    path = tmp_path / "b.yaml"
    save_baseline(path, records, commit="one")
    rerun = make_record("softmax[8192x4096]", median_s=40e-6, seed=9)
    save_baseline(path, [rerun], commit="two")
    merged = load_baseline(path)
    assert merged.commit == "two"
    assert set(merged.entries) == {r.nodeid for r in records}
    assert merged.entries[rerun.nodeid].median_s == pytest.approx(rerun.median_s, rel=1e-5)


def test_unmeasured_records_are_not_saved(tmp_path: Path, records: list) -> None:
    failed = make_record("broken[1]", timed=False, outcome="failed")
    baseline = save_baseline(tmp_path / "b.yaml", [*records, failed], commit="x")
    assert failed.nodeid not in baseline.entries
    with pytest.raises(BaselineError, match="nothing to save"):
        save_baseline(tmp_path / "c.yaml", [failed], commit="x")
    assert not (tmp_path / "c.yaml").exists()


def test_saving_over_a_corrupt_baseline_replaces_it_with_a_warning(
    tmp_path: Path, records: list
) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("kernels: [unclosed\n", encoding="utf-8")
    with pytest.warns(KernelproWarning, match="replacing the unreadable baseline"):
        save_baseline(path, records, commit="x")
    assert len(load_baseline(path).entries) == 2


def test_commit_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNELPRO_COMMIT", raising=False)
    monkeypatch.setenv("GITHUB_SHA", "f" * 40)
    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert detect_commit(outside) == "f" * 40  # no git repository: the CI variable
    if shutil.which("git"):
        repo = tmp_path / "repo"
        repo.mkdir()
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
        env["GIT_COMMITTER_EMAIL"] = "t@t"
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True)
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert detect_commit(repo) == head  # git wins over GITHUB_SHA (the merge commit)
    monkeypatch.setenv("KERNELPRO_COMMIT", "explicit")
    assert detect_commit(outside) == "explicit"


GOOD_ENTRY = {"name": "k", "median_s": 5e-5, "samples_s": [5e-5, 5.1e-5], "n": 2}


def _doc(**over: object) -> str:
    doc: dict[str, object] = {
        "schema_version": BASELINE_SCHEMA_VERSION,
        "device": "NVIDIA H200",
        "commit": None,
        "created": "2026-11-30T00:00:00+00:00",
        "kernels": {"t.py::k": dict(GOOD_ENTRY)},
    }
    doc.update(over)
    return yaml.safe_dump(doc)


def _entry(**over: object) -> dict[str, object]:
    entry = dict(GOOD_ENTRY)
    entry.update(over)
    return {"t.py::k": entry}


BAD_BASELINES = {
    "empty": ("", "the file is empty"),
    "whitespace": ("  \n\n", "the file is empty"),
    "only a comment": ("# nothing\n", "the file is empty"),
    "corrupt yaml": ("kernels: [unclosed\n  - x: {\n", "not valid YAML at line"),
    "top-level list": ("- 1\n- 2\n", "top level is a list"),
    "no schema": (yaml.safe_dump({"kernels": _entry()}), "schema_version is None"),
    "schema is text": (_doc(schema_version="one"), "schema_version is 'one'"),
    "older schema": (_doc(schema_version=0), "schema version 0, older than"),
    "newer schema": (_doc(schema_version=99), "upgrade pytest-kernelpro"),
    "kernels not a mapping": (_doc(kernels=["a"]), "'kernels' is list"),
    "no kernels": (_doc(kernels={}), "'kernels' is empty"),
    "entry not a mapping": (_doc(kernels={"k": 3}), "the entry is a int"),
    "median is text": (_doc(kernels=_entry(median_s="fast")), "median_s is 'fast'"),
    "median negative": (_doc(kernels=_entry(median_s=-1.0)), "median_s is -1.0"),
    "median bool": (_doc(kernels=_entry(median_s=True)), "median_s is True"),
    "no samples": (_doc(kernels=_entry(samples_s=[])), "samples_s is []"),
    "samples not a list": (_doc(kernels=_entry(samples_s="1,2")), "samples_s is '1,2'"),
    "bad sample": (_doc(kernels=_entry(samples_s=[1e-5, "x"])), "samples_s is [1e-05, 'x']"),
    "n negative": (_doc(kernels=_entry(n=-3)), "n is -3"),
    # msgspec's bounds stand for "finite": an infinite or NaN time is refused, not compared.
    "median infinite": (_doc(kernels=_entry(median_s=float("inf"))), "median_s is inf"),
    "NaN sample": (_doc(kernels=_entry(samples_s=[1e-5, float("nan")])), "at `$.samples_s[1]`"),
    "quartile infinite": (_doc(kernels=_entry(q3_s=float("inf"))), "q3_s is inf"),
    "n bool": (_doc(kernels=_entry(n=True)), "n is True, expected a positive integer"),
    "no median": (_doc(kernels={"t.py::k": {"samples_s": [1e-5]}}), "median_s is missing"),
    "efficiency text": (_doc(kernels=_entry(efficiency="high")), "efficiency is 'high'"),
    "device not text": (_doc(kernels=_entry(device=7)), "device is 7"),
    "commit not text": (_doc(commit=123), "commit is 123"),
}


@pytest.mark.parametrize("case", list(BAD_BASELINES))
def test_bad_baseline_is_a_clear_error(tmp_path: Path, case: str) -> None:
    text, what = BAD_BASELINES[case]
    path = tmp_path / "kernelpro-baseline.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    message = str(info.value)
    assert what in message
    assert str(path) in message  # which file
    assert "--kernelpro-save-baseline" in message  # and the fix
    assert isinstance(info.value, KernelproError)


def test_missing_and_directory_baselines(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="does not exist.*--kernelpro-save-baseline"):
        load_baseline(tmp_path / "nope.yaml")
    with pytest.raises(BaselineError, match="is a directory"):
        load_baseline(tmp_path)


def test_good_minimal_document_loads(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(_doc(), encoding="utf-8")
    loaded = load_baseline(path)
    assert loaded.entries["t.py::k"].samples_s == [5e-5, 5.1e-5]
    assert loaded.entries["t.py::k"].efficiency is None


def test_binary_garbage_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BaselineError, match="cannot be read|not valid YAML"):
        load_baseline(path)
