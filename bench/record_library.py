"""The typed record's read and write speed on its real shape, msgspec against the dataclass
parts it replaced.

Reads the JSON text of real H200 records (tests/data/record/h200_records.json) into the
package's `KernelRecord` and writes it back, three ways: one record's text
(`decode_record` / `encode_record`: the xdist transport), the JSON values a report or the
records log holds (`record_from_builtins` / `record_builtins`), and, with `--before PATH`
(a `record.py` of an earlier commit, e.g. `git show 1d35629:pytest_kernelpro/record.py`),
the dataclass parts' `from_json` / `to_json`. Also times putting one measured timing on the
record: `part_of(TimingPart, result)` against the parts' `TimingPart.from_dict(result.to_dict())`.
The figure is the median of `--repeats` timings of `--batch` records.

    python bench/record_library.py [--batch 1000] [--repeats 7] [--before /tmp/record_before.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from pytest_kernelpro.measure.timing.budget import TimingResult
from pytest_kernelpro.record import (
    TimingPart,
    decode_record,
    encode_record,
    part_of,
    record_builtins,
    record_from_builtins,
)

RECORDS = Path(__file__).parents[1] / "tests/data/record/h200_records.json"


def timed(work: Any, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def load_before(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("record_before", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["record_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", help="record.py of an earlier commit (the dataclass parts)")
    args = parser.parse_args()
    stored = json.loads(RECORDS.read_text(encoding="utf-8"))
    texts = [json.dumps(r).encode() for r in stored]
    batch = (texts * (args.batch // len(texts) + 1))[: args.batch]
    values = [json.loads(t) for t in batch]

    records = [decode_record(t, source="bench") for t in batch]
    written = json.loads(encode_record(records[0]))["timing"]
    assert written["samples_s"] == stored[0]["timing"]["samples_s"]  # the samples came back
    rows = {
        "msgspec record, JSON text (transport)": (
            timed(lambda: [decode_record(t, source="bench") for t in batch], args.repeats),
            timed(lambda: [encode_record(r) for r in records], args.repeats),
        ),
        "msgspec record, JSON values (report, records log)": (
            timed(lambda: [record_from_builtins(v, source="b") for v in values], args.repeats),
            timed(lambda: [record_builtins(r) for r in records], args.repeats),
        ),
    }
    result = TimingResult.from_dict(stored[0]["timing"])
    conversions = {
        "part_of(TimingPart, result)": timed(
            lambda: [part_of(TimingPart, result) for _ in range(args.batch)], args.repeats
        )
    }
    if args.before:
        before = load_before(args.before)
        old = [before.KernelRecord.from_json(t.decode()) for t in batch]
        rows["dataclass parts (before), JSON text"] = (
            timed(lambda: [before.KernelRecord.from_json(t.decode()) for t in batch], args.repeats),
            timed(lambda: [o.to_json() for o in old], args.repeats),
        )
        conversions["TimingPart.from_dict(result.to_dict()) (before)"] = timed(
            lambda: [before.TimingPart.from_dict(result.to_dict()) for _ in range(args.batch)],
            args.repeats,
        )
    print(
        f"{args.batch} records ({sum(map(len, texts)) // len(texts)} bytes of JSON each), "
        f"median of {args.repeats}; msgspec {msgspec.__version__}"
    )
    print("| form | read µs/record | write µs/record |")
    print("|---|---:|---:|")
    for name, (read_s, write_s) in rows.items():
        print(f"| {name} | {read_s / args.batch * 1e6:.1f} | {write_s / args.batch * 1e6:.1f} |")
    print()
    print("| a measured timing onto the record | µs each |")
    print("|---|---:|")
    for name, seconds in conversions.items():
        print(f"| {name} | {seconds / args.batch * 1e6:.1f} |")


if __name__ == "__main__":
    main()
