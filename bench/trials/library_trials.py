"""Two library trials of issue 25, on the CPU: the record's JSON form through msgspec or
pydantic instead of the hand-written `to_dict`/`json`, and `--kernelpro-isolate` against
pytest-xdist's worker restarts.

    python bench/trials/library_trials.py [--records 250] [--repeats 7] [--skip-isolate]

1. Serialization. 250 records made from the records of a real `--kernelpro-check` run on an
   H200 (`bench/results/raw/h200-example-repo/check.json` and `profile.json`, cycled with
   distinct node ids). For each way, the best of `--repeats` runs of: records -> JSON text,
   and JSON text -> records; and whether the round trip gives back the report's JSON form
   key for key (a part keeps keys it does not know, in the source's order: a stored record
   of another version must survive being read and written).
   - current: `KernelRecord.to_dict` + `json.dumps`; `json.loads` + `KernelRecord.from_dict`
   - msgspec encoder: the same dicts through `msgspec.json.encode` / `msgspec.json.decode`
   - msgspec structs: the record and its parts as `msgspec.Struct`s (generated from the
     dataclass fields), `msgspec.json.encode` / `msgspec.json.decode(type=list[Record])`
   - pydantic: the record and its parts as `BaseModel`s with `extra="allow"` (unknown keys
     kept), `TypeAdapter(list[Record]).dump_json` / `.validate_json`
2. Isolation. A project of three kernels, the second of which kills its own process
   (SIGSEGV) while running: `--kernelpro-isolate` against `-n 1` (pytest-xdist replaces a
   crashed worker, `--max-worker-restart`). Per mode: the outcomes pytest reports, whether the
   crashed kernel has a record in the JSON report, what its failure says, and the wall time.

Prints a table at the end; `--out FILE` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pytest_kernelpro.record import PARTS, KernelRecord, Part  # noqa: E402

SOURCES = (
    ROOT / "bench/results/raw/h200-example-repo/check.json",
    ROOT / "bench/results/raw/h200-example-repo/profile.json",
)


def sample_records(n: int) -> list[dict[str, Any]]:
    stored: list[dict[str, Any]] = []
    for path in SOURCES:
        stored.extend(json.loads(path.read_text(encoding="utf-8"))["records"])
    out = []
    for i in range(n):
        data = json.loads(json.dumps(stored[i % len(stored)]))
        data["nodeid"] = f"{data['nodeid']}#{i}"
        out.append(data)
    return out


def best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def _part_classes() -> dict[type[Part], list[tuple[str, Part | None]]]:
    """Each part class with its fields (a nested part's class where the field nests one)."""
    found: dict[type[Part], list[tuple[str, Any]]] = {}

    def visit(cls: type[Part]) -> None:
        if cls in found:
            return
        found[cls] = [(name, cls.NESTED.get(name)) for name in cls.field_names()]
        for nested in cls.NESTED.values():
            visit(nested)

    for part in PARTS.values():
        visit(part)
    return found


def msgspec_types() -> Any:
    import msgspec

    structs: dict[type[Part], Any] = {}
    classes = _part_classes()

    def struct(cls: type[Part]) -> Any:
        if cls not in structs:
            fields = []
            for name, nested in classes[cls]:
                kind = Any if nested is None else struct(nested) | None
                fields.append((name, kind, None))
            structs[cls] = msgspec.defstruct(cls.__name__ + "S", fields, omit_defaults=True)
        return structs[cls]

    record_fields = []
    for f in dataclasses.fields(KernelRecord):
        part = PARTS.get(f.name)
        kind = Any if part is None else struct(part) | None
        record_fields.append((f.name, kind, None))
    return msgspec.defstruct("RecordS", record_fields, omit_defaults=True)


def pydantic_types() -> Any:
    from pydantic import ConfigDict, create_model

    models: dict[type[Part], Any] = {}
    classes = _part_classes()
    config = ConfigDict(extra="allow")

    def model(cls: type[Part]) -> Any:
        if cls not in models:
            fields: dict[str, Any] = {}
            for name, nested in classes[cls]:
                kind = Any if nested is None else model(nested) | None
                fields[name] = (kind, None)
            models[cls] = create_model(cls.__name__ + "M", __config__=config, **fields)
        return models[cls]

    fields: dict[str, Any] = {}
    for f in dataclasses.fields(KernelRecord):
        part = PARTS.get(f.name)
        fields[f.name] = (Any if part is None else model(part) | None, None)
    return create_model("RecordM", __config__=config, **fields)


def trial_serialization(n: int, repeats: int) -> list[dict[str, Any]]:
    import msgspec
    from pydantic import TypeAdapter

    stored = sample_records(n)
    records = [KernelRecord.from_dict(d) for d in stored]
    reference = json.loads(json.dumps([r.to_dict() for r in records]))
    rows: list[dict[str, Any]] = []

    def row(name: str, encode: Any, decode: Any, back_to_json: Any) -> None:
        text = encode()
        decoded = decode(text)
        same = json.loads(back_to_json(decoded)) == reference
        rows.append(
            {
                "way": name,
                "encode_ms": 1e3 * best(encode, repeats),
                "decode_ms": 1e3 * best(lambda: decode(text), repeats),
                "bytes": len(text),
                "round_trip_exact": same,
            }
        )

    row(
        "current (to_dict + json)",
        lambda: json.dumps([r.to_dict() for r in records]),
        lambda text: [KernelRecord.from_dict(d) for d in json.loads(text)],
        lambda recs: json.dumps([r.to_dict() for r in recs]),
    )
    row(
        "msgspec encoder on to_dict",
        lambda: msgspec.json.encode([r.to_dict() for r in records]),
        lambda text: [KernelRecord.from_dict(d) for d in msgspec.json.decode(text)],
        lambda recs: msgspec.json.encode([r.to_dict() for r in recs]),
    )
    record_struct = msgspec_types()
    structs = msgspec.json.decode(json.dumps(stored), type=list[record_struct])
    row(
        "msgspec structs",
        lambda: msgspec.json.encode(structs),
        lambda text: msgspec.json.decode(text, type=list[record_struct]),
        lambda recs: msgspec.json.encode(recs),
    )
    adapter = TypeAdapter(list[pydantic_types()])
    models = adapter.validate_json(json.dumps(stored))
    row(
        "pydantic models (extra=allow)",
        lambda: adapter.dump_json(models),
        lambda text: adapter.validate_json(text),
        lambda recs: adapter.dump_json(recs, exclude_unset=True),
    )
    return rows


ISOLATE_PROJECT = """
import os, signal
import pytest
import torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, trials=2)
def first(x):
    return -x

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, trials=2)
def crashes(x):
    os.kill(os.getpid(), signal.SIGSEGV)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, trials=2)
def third(x):
    return -x
"""


def trial_isolation() -> list[dict[str, Any]]:
    rows = []
    modes = {
        "--kernelpro-isolate": ["--kernelpro-isolate"],
        "xdist -n 1 (worker restart)": ["-n", "1"],
    }
    for name, args in modes.items():
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "test_kernels.py").write_text(textwrap.dedent(ISOLATE_PROJECT))
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                cwd=folder,
                capture_output=True,
                text=True,
                env={**os.environ, "KERNELPRO_TIME_BUDGET": "0.2"},
            )
            wall = time.perf_counter() - started
            report = Path(folder, ".kernelpro/kernelpro-report.json")
            records = json.loads(report.read_text())["records"] if report.exists() else []
            crashed = [r for r in records if r["name"] == "crashes"]
            rows.append(
                {
                    "mode": name,
                    "pytest": done.stdout.strip().splitlines()[-1] if done.stdout else "",
                    "records": sorted(f"{r['name']}:{r['outcome']}" for r in records),
                    "crashed_kernel_record": bool(crashed),
                    "crash_message": (crashed[0].get("message") or "")[:160] if crashed else None,
                    "wall_s": round(wall, 1),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-isolate", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"serialization": trial_serialization(args.records, args.repeats)}
    if not args.skip_isolate:
        result["isolation"] = trial_isolation()
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(f"serialization of {args.records} records (best of {args.repeats}):")
    for r in result["serialization"]:
        print(
            f"  {r['way']:32} encode {r['encode_ms']:8.2f} ms  decode {r['decode_ms']:8.2f} ms"
            f"  {r['bytes']:9d} B  round trip exact: {r['round_trip_exact']}"
        )
    for r in result.get("isolation", []):
        print(
            f"  {r['mode']:28} {r['pytest']!r}  records {r['records']}  "
            f"crash record: {r['crashed_kernel_record']} ({r['crash_message']!r})  "
            f"{r['wall_s']} s"
        )


if __name__ == "__main__":
    main()
