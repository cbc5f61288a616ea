"""The record's typed parts: the JSON form goes in and comes back key for key, in order."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kernelpro.record import (
    PARTS,
    CorrectnessPart,
    KernelRecord,
    ProfilePart,
    RooflinePart,
    StatsPart,
    TimingPart,
    VerdictPart,
)

torch = pytest.importorskip("torch")

STORED = Path(__file__).parent.parent / "data" / "record" / "h200_records.json"


def _stored() -> list[dict[str, Any]]:
    return json.loads(STORED.read_text(encoding="utf-8"))


def test_stored_h200_records_read_back_key_for_key() -> None:
    """Records written before the parts were typed (H200 check and profile reports) give
    the same JSON text back: same keys, same order, same values."""
    stored = _stored()
    assert {"gate", "profile"} <= {k for d in stored for k in PARTS if d.get(k)}
    for data in stored:
        data.pop("settings", None)  # the key came later; a record without it reads as None
        record = KernelRecord.from_dict(data)
        assert isinstance(record.timing, TimingPart)
        assert isinstance(record.roofline, RooflinePart)
        again = record.to_dict()
        again.pop("settings")
        assert again.pop("peak_used") is None  # came later too: an old record reads as None
        for later in ("autotune", "environment"):  # autotune choices, versions: later still
            assert again.pop(later) is None
        assert again.pop("sections") == []  # other plugins' sections: later again
        assert again == data
        assert json.dumps(again) == json.dumps(data)
        for name, part in PARTS.items():
            if data.get(name):
                assert getattr(record, name).unknown == {}, f"{name}: a key the part lacks"
                assert isinstance(getattr(record, name), part)


def test_the_parts_are_typed_and_frozen() -> None:
    saxpy = KernelRecord.from_dict(_stored()[0])
    assert isinstance(saxpy.timing.stats, StatsPart)
    assert saxpy.median_s == saxpy.timing.stats.median_s == saxpy.timing.median_s
    assert saxpy.roofline_time_s == saxpy.roofline.roofline_time_s > 0
    assert isinstance(saxpy.gate, VerdictPart)
    assert saxpy.gate.status == "ok"
    assert isinstance(saxpy.correctness, CorrectnessPart)
    assert saxpy.correctness.passed
    assert saxpy.correctness.tolerance.source.startswith("default for torch.float32")
    assert isinstance(saxpy.timing.samples_s, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        saxpy.timing.method = "other"  # type: ignore[misc]
    softmax = KernelRecord.from_dict(_stored()[1])
    assert isinstance(softmax.profile, ProfilePart)
    assert softmax.profile.arch


def _producers() -> dict[str, Any]:
    """One result of every producer of a part, measured here on the CPU."""
    from pytest_kernelpro.gate.verdict import decide_verdict
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.correctness_check import check_correctness
    from pytest_kernelpro.measure.roofline import analyze_reference
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
    from pytest_kernelpro.profile.model import KernelProfile, NotCollected, ProfileReport

    x = torch.randn(256)
    ceilings = Ceilings("cpu (synthetic)", 100e9, {"fp32": 1e12}, "measured", "t", "2", {})
    return {
        "correctness": check_correctness(
            torch.neg, torch.neg, lambda seed: (torch.randn(64),), device="cpu", trials=2
        ),
        "timing": time_kernel(
            lambda: torch.neg(x),
            device="cpu",
            budget=TimingBudget(warmup_ms=1, max_time_s=0.05, min_samples=5, max_samples=20),
        ),
        "roofline": analyze_reference(torch.neg, (x,), ceilings=ceilings),
        "gate": decide_verdict(
            KernelRecord(
                nodeid="t.py::neg",
                name="neg",
                kernel="neg",
                device="cpu",
                timing={"samples_s": [1e-3, 1.1e-3, 0.9e-3], "stats": {"median_s": 1e-3}},
            ),
            None,
        ),
        "profile": ProfileReport(
            arch="sm_90",
            kernels=[KernelProfile(name="k")],
            not_collected=[NotCollected("ncu", "not on PATH")],
        ),
    }


def test_each_part_knows_every_key_its_producer_writes() -> None:
    """A field added to a producer without its part fails here (else it would travel in
    `unknown`, untyped)."""
    for name, result in _producers().items():
        data = result.to_dict()
        part = PARTS[name].from_dict(data)
        assert set(data) <= set(PARTS[name].field_names()), name
        assert part.unknown == {}
        assert part.to_dict() == data, name
        if name == "timing":
            assert set(data["stats"]) <= set(StatsPart.field_names())


def test_a_record_built_as_the_stages_build_it_gives_the_old_dict_form() -> None:
    """The record the stages fill (parts from the producers' JSON form) gives the report
    exactly the dict the bag-of-dicts record gave: each part its producer's `to_dict`."""
    results = _producers()
    record = KernelRecord(nodeid="t.py::neg", name="neg", kernel="neg", device="cpu")
    for name, result in results.items():
        setattr(record, name, PARTS[name].from_dict(result.to_dict()))
    record.efficiency = 0.5
    old_form = {
        **{f.name: getattr(record, f.name) for f in dataclasses.fields(record)},
        **{name: result.to_dict() for name, result in results.items()},
    }
    assert record.to_dict() == old_form
    assert record.to_json() == json.dumps(old_form, default=str)
    # The xdist transport and the records log: JSON there and back.
    assert KernelRecord.from_json(record.to_json()).to_dict() == json.loads(record.to_json())


def test_unknown_keys_are_kept_and_absent_keys_stay_absent() -> None:
    data = {"stats": {"median_s": 1e-3, "new_stat": 7}, "method": "x", "from_the_future": [1]}
    part = TimingPart.from_dict(data)
    assert part.unknown == {"from_the_future": [1]}
    assert part.stats.unknown == {"new_stat": 7}
    assert part.to_dict() == data
    assert list(part.to_dict()) == list(data)
    changed = dataclasses.replace(part, stop_reason="converged")  # set after: written too
    assert changed.to_dict() == {**data, "stop_reason": "converged"}


def test_an_empty_part_is_false_like_the_empty_dict_was() -> None:
    record = KernelRecord(nodeid="n", name="n", kernel="n", gate={})
    assert isinstance(record.gate, VerdictPart)
    assert not record.gate
    assert VerdictPart(status="ok")


def test_a_part_given_as_a_dict_is_read_into_its_type() -> None:
    record = KernelRecord(nodeid="n", name="n", kernel="n", timing={"stats": {"median_s": 2.0}})
    assert record.timing == TimingPart(stats=StatsPart(median_s=2.0))
    record.roofline = {"roofline_time_s": 1.0, "bound": "memory"}
    assert record.roofline_time_s == 1.0
    assert record.median_s == 2.0
