"""optimize/sandbox/output_channel.py: a worker's checked outputs reach the judge as raw tensor
bytes in mapped files; the judge validates the manifest and unpickles nothing."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.optimize.sandbox import judge  # noqa: E402
from pytest_kernelpro.optimize.sandbox.output_channel import (  # noqa: E402
    OutputChannelError,
    check_room,
    read_output,
    write_output,
)


def test_round_trip_keeps_every_leaf(tmp_path: Path) -> None:
    leaves = [
        torch.randn(3, 5),
        torch.arange(7, dtype=torch.int64),
        torch.randn(4, dtype=torch.bfloat16),
        torch.tensor([True, False]),
        torch.empty(0, 3),
        2.5,
        None,
    ]
    write_output(torch, tmp_path / "trial-1", leaves)
    back = read_output(torch, tmp_path / "trial-1")
    for got, want in zip(back, leaves, strict=True):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype
            assert got.shape == want.shape
            assert torch.equal(got, want)
        else:
            assert got == want


def test_a_non_contiguous_output_is_written_in_its_logical_order(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    write_output(torch, tmp_path / "t", [base.t()])
    assert torch.equal(read_output(torch, tmp_path / "t")[0], base.t())


def _manifest(tmp_path: Path, entries: list) -> Path:
    (tmp_path / "trial-1.json").write_text(json.dumps(entries))
    return tmp_path / "trial-1"


def test_a_manifest_naming_another_file_is_refused(tmp_path: Path) -> None:
    """The attack: a candidate's manifest points the judge at a file outside its output
    (a path climbing out, an absolute path, another output's file)."""
    secret = tmp_path / "elsewhere.bin"
    torch.zeros(4).numpy().tofile(secret)
    for name in ("../elsewhere.bin", str(secret), "trial-2.0.bin"):
        stem = _manifest(
            tmp_path, [{"kind": "tensor", "dtype": "float32", "shape": [4], "file": name}]
        )
        with pytest.raises(OutputChannelError, match="names file"):
            read_output(torch, stem)


def test_a_linked_or_short_file_and_an_unknown_dtype_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "real.bin"
    torch.zeros(4).numpy().tofile(target)
    (tmp_path / "trial-1.0.bin").symlink_to(target)
    entry = {"kind": "tensor", "dtype": "float32", "shape": [4], "file": "trial-1.0.bin"}
    with pytest.raises(OutputChannelError, match="missing"):
        read_output(torch, _manifest(tmp_path, [entry]))
    (tmp_path / "trial-1.0.bin").unlink()
    torch.zeros(3).numpy().tofile(tmp_path / "trial-1.0.bin")  # 12 bytes, the shape needs 16
    with pytest.raises(OutputChannelError, match="holds 12 bytes"):
        read_output(torch, _manifest(tmp_path, [entry]))
    for bad in ({**entry, "dtype": "object"}, {**entry, "shape": [-1]}, {**entry, "shape": [True]}):
        with pytest.raises(OutputChannelError):
            read_output(torch, _manifest(tmp_path, [bad]))
    with pytest.raises(OutputChannelError, match="plain value"):
        read_output(torch, _manifest(tmp_path, [{"kind": "value", "value": {"a": 1}}]))


class _Planted:
    def __reduce__(self):  # unpickling it would create the marker file
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(MARKER),))


MARKER = ""


def test_the_judge_never_unpickles_what_the_worker_left(tmp_path: Path) -> None:
    """The attack: a pickle planted where the old channel's file was. The judge reads only
    manifests and raw bytes: the pickle's code never runs and the output counts as missing."""
    global MARKER
    MARKER = str(tmp_path / "ran")
    (tmp_path / "trial-1.pt").write_bytes(pickle.dumps(_Planted()))
    with pytest.raises(FileNotFoundError, match="no output file trial-1.pt"):
        judge._load_output(tmp_path / "trial-1.pt")
    assert not Path(MARKER).exists()
    judge.save_output(tmp_path / "trial-1.pt", (torch.ones(2), 3))
    assert [
        x.tolist() if isinstance(x, torch.Tensor) else x
        for x in judge._load_output(tmp_path / "trial-1.pt")
    ] == [[1.0, 1.0], 3]


def test_an_output_larger_than_the_scratch_space_is_refused_with_both_sizes(tmp_path: Path) -> None:
    with pytest.raises(OutputChannelError, match=r"takes 1000000000\.00 GB .* GB free"):
        check_room(tmp_path, 10**18)
