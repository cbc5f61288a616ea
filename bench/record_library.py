"""Which library should hold the typed record: msgspec or pydantic v2, on the record's real shape.

Both models are made from the record's own parts (`pytest_kernelpro.record`: every part class
and field), typed part by part, leaves as they are typed today. Each library reads the JSON
text of real H200 records (tests/data/record/h200_records.json) into its typed model and
writes it back; today's dataclass parts (`KernelRecord.from_json` / `to_json`) are timed the
same way. The figure is the median of `--repeats` timings of `--batch` records.

    python bench/record_library.py [--batch 2000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

import msgspec
import pydantic

from pytest_kernelpro import record as record_module
from pytest_kernelpro.record import PARTS, KernelRecord, Part

RECORDS = Path(__file__).parents[1] / "tests/data/record/h200_records.json"


def part_fields(cls: type[Part]) -> list[str]:
    return [f.name for f in fields(cls) if f.name not in ("unknown", "key_order")]


def msgspec_model() -> type[msgspec.Struct]:
    parts = {
        name: msgspec.defstruct(
            cls.__name__, [(f, Any, None) for f in part_fields(cls)], omit_defaults=True
        )
        for name, cls in PARTS.items()
    }
    top = [
        (f.name, Optional[parts[f.name]] if f.name in parts else Any, None)  # noqa: UP045
        for f in fields(KernelRecord)
    ]
    return msgspec.defstruct("Record", top, omit_defaults=True)


def pydantic_model() -> type[pydantic.BaseModel]:
    parts = {
        name: pydantic.create_model(cls.__name__, **{f: (Any, None) for f in part_fields(cls)})
        for name, cls in PARTS.items()
    }
    top = {
        f.name: ((Optional[parts[f.name]], None) if f.name in parts else (Any, None))  # noqa: UP045
        for f in fields(KernelRecord)
    }
    return pydantic.create_model("Record", **top)


def timed(work: Any, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    texts = [json.dumps(r).encode() for r in json.loads(RECORDS.read_text())]
    batch = (texts * (args.batch // len(texts) + 1))[: args.batch]

    ms_type = msgspec_model()
    decoder, encoder = msgspec.json.Decoder(ms_type), msgspec.json.Encoder()
    pd_type = pydantic_model()
    ms_objs = [decoder.decode(t) for t in batch]
    pd_objs = [pd_type.model_validate_json(t) for t in batch]
    dc_objs = [KernelRecord.from_json(t.decode()) for t in batch]
    source = json.loads(batch[0])
    for written in (encoder.encode(ms_objs[0]), pd_objs[0].model_dump_json(exclude_unset=True)):
        assert json.loads(written)["timing"] == source["timing"]  # the samples came back

    rows = {
        "msgspec": (
            timed(lambda: [decoder.decode(t) for t in batch], args.repeats),
            timed(lambda: [encoder.encode(o) for o in ms_objs], args.repeats),
        ),
        "pydantic": (
            timed(lambda: [pd_type.model_validate_json(t) for t in batch], args.repeats),
            timed(lambda: [o.model_dump_json(exclude_unset=True) for o in pd_objs], args.repeats),
        ),
        "dataclass parts (today)": (
            timed(lambda: [KernelRecord.from_json(t.decode()) for t in batch], args.repeats),
            timed(lambda: [o.to_json() for o in dc_objs], args.repeats),
        ),
    }
    print(
        f"{args.batch} records ({sum(map(len, texts)) // len(texts)} bytes of JSON each), "
        f"median of {args.repeats}; msgspec {msgspec.__version__}, pydantic {pydantic.__version__}"
    )
    print("| library | read µs/record | write µs/record |")
    print("|---|---:|---:|")
    for name, (read_s, write_s) in rows.items():
        print(f"| {name} | {read_s / args.batch * 1e6:.1f} | {write_s / args.batch * 1e6:.1f} |")
    print(f"record module: {Path(record_module.__file__).name}")


if __name__ == "__main__":
    main()
