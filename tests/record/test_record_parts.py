"""The record's typed parts: stored records read back value for value, each measured result
goes onto the record as its part without a JSON form between, and the part has a field for
every key its producer writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from result_forms import PARTS, correctness_json

from pytest_kernelpro.measure.correctness_check import CorrectnessResult
from pytest_kernelpro.record import (
    CorrectnessPart,
    KernelRecord,
    ProfilePart,
    RecordDecodeError,
    StatsPart,
    TimingPart,
    VerdictPart,
    decode_record,
    encode_record,
    part_of,
    record_builtins,
    record_from_builtins,
)

torch = pytest.importorskip("torch")

STORED = Path(__file__).parent.parent / "data" / "record" / "h200_records.json"


def _stored() -> list[dict[str, Any]]:
    return json.loads(STORED.read_text(encoding="utf-8"))


def _subset_equal(written: Any, read: Any, where: str = "$") -> None:
    """Every key of `written` is in `read` with the same value (lists item for item); keys
    `read` has beyond them are fields the source lacked."""
    if isinstance(written, dict):
        assert isinstance(read, dict), where
        for key, value in written.items():
            assert key in read, f"{where}.{key} lost"
            _subset_equal(value, read[key], f"{where}.{key}")
    elif isinstance(written, list):
        assert isinstance(read, list), where
        assert len(read) == len(written), where
        for i, (a, b) in enumerate(zip(written, read, strict=True)):
            _subset_equal(a, b, f"{where}[{i}]")
    else:
        assert written == read, f"{where}: {written!r} became {read!r}"


def test_stored_h200_records_read_back_value_for_value() -> None:
    """Records the dataclass parts wrote (H200 check and profile reports) read into the typed
    record and write back every key they had, with its value; a field they lacked is written
    as null (the JSON form is the old one plus those keys)."""
    stored = _stored()
    assert {"gate", "profile"} <= {k for d in stored for k in PARTS if d.get(k)}
    for data in stored:
        record = record_from_builtins(data, source="h200_records.json")
        for name, part in PARTS.items():
            if data.get(name):
                assert isinstance(getattr(record, name), part), name
        again = json.loads(encode_record(record))
        _subset_equal(data, again)
        assert again["sections"] == []
        assert again["autotune"] is None
        assert decode_record(encode_record(record), source="again") == record


def test_the_parts_are_typed_and_frozen() -> None:
    saxpy = record_from_builtins(_stored()[0], source="h200_records.json")
    assert isinstance(saxpy.timing.stats, StatsPart)
    assert saxpy.median_s == saxpy.timing.stats.median_s == saxpy.timing.median_s
    assert saxpy.roofline_time_s == saxpy.roofline.roofline_time_s > 0
    assert isinstance(saxpy.gate, VerdictPart)
    assert saxpy.gate.status == "ok"
    assert isinstance(saxpy.correctness, CorrectnessPart)
    assert saxpy.correctness.passed
    assert saxpy.correctness.tolerance.source.startswith("default for torch.float32")
    assert isinstance(saxpy.timing.samples_s, tuple)
    with pytest.raises(AttributeError):
        saxpy.timing.method = "other"  # type: ignore[misc]
    softmax = record_from_builtins(_stored()[1], source="h200_records.json")
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
                timing=TimingPart(samples_s=(1e-3, 1.1e-3, 0.9e-3), stats=StatsPart(median_s=1e-3)),
            ),
            None,
        ),
        "profile": ProfileReport(
            arch="sm_90",
            kernels=[KernelProfile(name="k")],
            not_collected=[NotCollected("ncu", "not on PATH")],
        ),
    }


def _json_form(result: Any) -> dict[str, Any]:
    """A producer's own JSON form; the gate's verdict is its part already (`VerdictPart`)."""
    if isinstance(result, VerdictPart):
        return msgspec.structs.asdict(result)
    if isinstance(result, CorrectnessResult):
        return correctness_json(result)
    data: dict[str, Any] = result.to_dict()
    return data


def test_each_part_knows_every_key_its_producer_writes() -> None:
    """A field added to a producer without its part fails here (`part_of` would drop it)."""
    for name, result in _producers().items():
        data = _json_form(result)
        assert set(data) <= set(PARTS[name].__struct_fields__), name
        if name == "timing":
            assert set(data["stats"]) <= set(StatsPart.__struct_fields__)


def test_a_measured_result_goes_onto_the_record_as_its_json_form_said() -> None:
    """`part_of` reads the result's attributes into the part; the part's JSON form holds
    every key of the producer's own JSON form with its value (the form the report had)."""
    record = KernelRecord(nodeid="t.py::neg", name="neg", kernel="neg", device="cpu")
    results = _producers()
    for name, result in results.items():
        setattr(record, name, part_of(PARTS[name], result))
    written = json.loads(encode_record(record))
    for name, result in results.items():
        _subset_equal(json.loads(json.dumps(_json_form(result), default=str)), written[name])
    assert isinstance(record.gate, VerdictPart)
    assert record.gate.failed is False
    assert isinstance(record.timing.stats, StatsPart)
    assert record.median_s == results["timing"].median_s
    # The xdist transport: JSON there and back gives the same record.
    assert decode_record(encode_record(record), source="transport") == record


def test_a_non_finite_float_is_none_or_text_never_lost_to_invalid_json() -> None:
    """JSON has no infinity: a correctness error keeps it as text ("inf" is a finding), any
    other non-finite float is None; the record's JSON is then valid JSON."""
    part = CorrectnessPart(max_abs_err=math.inf, max_rel_err=math.nan, factor=math.inf)
    assert (part.max_abs_err, part.max_rel_err, part.factor) == ("inf", "nan", None)
    stats = StatsPart(median_s=1e-3, rel_ci_halfwidth=math.inf)
    assert stats.rel_ci_halfwidth is None
    record = KernelRecord(nodeid="n", name="n", kernel="n", correctness=part)
    text = encode_record(record).decode()
    assert '"max_abs_err":"inf"' in text
    assert json.loads(text)["correctness"]["factor"] is None
    assert decode_record(text, source="t") == record


def test_a_value_of_the_wrong_type_is_an_error_naming_the_source_and_the_field() -> None:
    data = record_builtins(KernelRecord(nodeid="n", name="n", kernel="n"))
    data["timing"] = {"samples_s": "fast", "method": "cpu"}
    with pytest.raises(RecordDecodeError, match=r"report\.json: records\[3\].*samples_s"):
        record_from_builtins(data, source="report.json: records[3]")
    with pytest.raises(RecordDecodeError, match=r"worker gw1.*not JSON"):
        decode_record('{"nodeid": "n", "name"', source="worker gw1")
    with pytest.raises(RecordDecodeError, match="nodeid"):  # a required field missing
        record_from_builtins({"name": "n", "kernel": "n"}, source="log")


def test_a_part_of_the_wrong_shape_is_refused_at_the_edge() -> None:
    """A part is a typed object: a dict where a part belongs does not pass for one when the
    record is written or read (the dict form is the file's, never the record's)."""
    with pytest.raises(RecordDecodeError, match="gate"):
        record_from_builtins(
            {"nodeid": "n", "name": "n", "kernel": "n", "gate": [1, 2]}, source="f"
        )
    record = record_from_builtins(
        {"nodeid": "n", "name": "n", "kernel": "n", "gate": {"status": "ok"}}, source="f"
    )
    assert record.gate == VerdictPart(status="ok")
    assert msgspec.structs.asdict(record.gate)["status"] == "ok"
