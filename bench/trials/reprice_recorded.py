"""Price recorded kernel timings with today's peak logic (`measure/roofline.py`), on the CPU.

No GPU: reads what H200 runs recorded and applies `price_measured` to it.

- `--report`: JSON reports (full records, with the roofline's ops): the analysis's paths are
  rebuilt from each record's ops on the given ceilings (`roofline.matrix_paths`), then priced.
- `--sweep`: `bench/kernelbench_sweep.py` JSONL files (one line per problem: FLOPs, minimal bytes,
  bound, efficiency, median): no ops there, so no faster paths; the compute and memory times
  are rebuilt from the ceilings (memory = bytes / bandwidth; compute = the roofline time when
  compute-bound), which checks the margin: which recorded kernels beat their ceilings, by how
  much, and what the record would now say.

    python bench/trials/reprice_recorded.py --ceilings bench/results/raw/2026-11-30-ceilings-h200-run1.json \
        --report R1.json ... --sweep S1.jsonl ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pytest_kernelpro.measure.ceilings import Ceilings
from pytest_kernelpro.measure.flops import OpCost
from pytest_kernelpro.measure.roofline import matrix_paths, price_measured


def _row(name: str, recorded: float, roofline: dict[str, Any], median: float) -> dict[str, Any]:
    priced = price_measured(roofline, median)
    assert priced is not None
    return {
        "name": name,
        "recorded_efficiency": recorded,
        "efficiency": priced.efficiency,
        "inferred": priced.key if priced.inferred else None,
        "problem": priced.problem,
        "note": priced.note,
    }


def from_reports(paths: list[Path], ceilings: Ceilings, only: str | None) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        for rec in json.loads(path.read_text())["records"]:
            r, timing = rec.get("roofline"), rec.get("timing")
            if not r or not timing or (only and only not in rec["name"]):
                continue
            ops = [OpCost(**op) for op in r["ops"]]
            roofline = {
                **r,
                "paths": list(matrix_paths(ops, ceilings, r["flops"], r["memory_time_s"], "cuda")),
            }
            rows.append(
                _row(
                    f"{path.parent.name}/{path.name}: {rec['name']}",
                    rec["efficiency"],
                    roofline,
                    timing["stats"]["median_s"],
                )
            )
    return rows


def from_sweeps(paths: list[Path], ceilings: Ceilings) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        for line in path.read_text().splitlines():
            d = json.loads(line)
            if d.get("kind") != "problem" or not d.get("efficiency") or not d.get("median_s"):
                continue
            median, eff = float(d["median_s"]), float(d["efficiency"])
            t = eff * median
            memory = float(d.get("min_bytes") or 0.0) / ceilings.bandwidth_Bps
            compute = (
                t
                if d.get("bound") == "compute"
                else float(d.get("flops") or 0.0) / ceilings.flops["fp32"]
            )
            roofline = {
                "roofline_time_s": t, "compute_time_s": compute, "memory_time_s": memory,
                "flops": d.get("flops"), "min_bytes": d.get("min_bytes"), "peak_name": d.get("peak_name"),
                "bandwidth_Bps": ceilings.bandwidth_Bps,
            }  # fmt: skip
            rows.append(_row(f"{path.parent.name}: {d['problem']}", eff, roofline, median))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ceilings", type=Path, required=True)
    parser.add_argument("--report", type=Path, nargs="*", default=[])
    parser.add_argument("--only", help="report records whose name contains this")
    parser.add_argument("--sweep", type=Path, nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ceilings = Ceilings.from_dict(json.loads(args.ceilings.read_text()))
    rows = from_reports(args.report, ceilings, args.only) + from_sweeps(args.sweep, ceilings)
    above = [r for r in rows if r["recorded_efficiency"] > 1.0]
    summary = {
        "records": len(rows),
        "recorded_above_100pct": len(above),
        "now_above_100pct": sum(r["efficiency"] > 1.0 for r in rows),
        "now_above_110pct": sum(r["efficiency"] > 1.1 for r in rows),
        "inferred": sum(bool(r["inferred"]) for r in rows),
        "problems": sum(bool(r["problem"]) for r in rows),
        "max_recorded_within_margin": max(
            (r["recorded_efficiency"] for r in rows if not r["inferred"] and not r["problem"]),
            default=None,
        ),
    }
    for r in rows:
        if r["recorded_efficiency"] > 1.0 or r["inferred"] or r["problem"]:
            print(
                f"{r['name']}: {r['recorded_efficiency']:.1%} -> {r['efficiency']:.1%}; {r['note']}"
            )
    print(json.dumps(summary, indent=1))
    if args.out:
        noted = [r for r in rows if r["note"]]  # the rest: priced as recorded, no note
        args.out.write_text(json.dumps({"summary": summary, "rows_with_a_note": noted}, indent=1))


if __name__ == "__main__":
    main()
