"""Every tool on every H200 capture in tests/data: the snapshot the tools' refactors are held to.

`snapshot()` runs the registered built-in tools on
- every kernel of the probe and profile-capture folders (`tests/data/tools/h200-probe`,
  `h200-capture`) with their Stage 1 and roofline facts, in both affinity modes;
- the same probe page without its roofline facts (`tests/data/profile`: Stage 1 from the
  counters alone);
- the example repository's three `--kernelpro-profile` records, through
  `analysis.analyze_report` exactly as a kernel item is analyzed (findings, the prompt
  guidance, the raw counters and the report text);
and returns a JSON-ready dict. `tests/data/tools/golden/findings.json` holds what the code
gave before the tools were restructured; regenerate it only for an intended change:

    PYTHONPATH=$PWD python tests/tools/golden_findings.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"
GOLDEN = DATA / "tools" / "golden" / "findings.json"
CAPTURES = (
    DATA / "tools" / "h200-probe",
    DATA / "tools" / "h200-capture",
    DATA / "profile",
)


def _compact(run: Any) -> dict[str, Any]:
    """A ToolRun's findings in full; which tools stayed quiet and why the others were skipped
    in one line each (the findings are what the snapshot is for)."""
    data = run.to_dict()
    return {
        "findings": data["findings"],
        "quiet": sorted(r["tool"] for r in data["ran"] if not r["triggered"]),
        "skipped": sorted(
            f"{s['tool']}: {s['reason']} {','.join(s['missing'])} {s['detail']}".strip()
            for s in data["skipped"]
        ),
        "stage1": data["stage1"],
    }


def _capture_runs(folder: Path) -> dict[str, Any]:
    from capture_folder import load_capture_dir, theoretical_class

    from pytest_kernelpro.tools.registry import run_tools
    from pytest_kernelpro.tools.stage1 import classify

    out: dict[str, Any] = {}
    for k in load_capture_dir(folder):
        kernel = k.report.kernels[0]
        metrics = kernel.metrics
        device = None if metrics is None else metrics.text("device__attribute_display_name")
        theo, _ = theoretical_class(k.meta, device)
        s1 = classify(theo, metrics)
        facts = dict(
            op_category=k.meta.get("op"),
            min_bytes=k.meta.get("min_bytes"),
            flops=k.meta.get("flops"),
            dtype=k.meta.get("dtype"),
        )
        entry = {"final": _compact(run_tools(k.report, s1, **facts))}
        if s1.measured is not None and s1.measured != s1.cls:
            entry["both"] = _compact(run_tools(k.report, s1, affinity_mode="both", **facts))
        out[kernel.name] = entry
    return out


def _example_runs() -> dict[str, Any]:
    from pytest_kernelpro.analysis import RooflineFacts, analyze_report, report_from_dict

    data = json.loads((DATA / "tools" / "h200-example-repo" / "profile_records.json").read_text())
    out: dict[str, Any] = {}
    for record in data["records"]:
        facts = RooflineFacts.from_roofline(
            record["roofline"],
            median_s=record["timing"]["stats"]["median_s"],
            efficiency=record["efficiency"],
        )
        analysis = analyze_report(report_from_dict(record["profile"]), facts)
        out[record["name"]] = {
            "stage1": analysis.stage1.to_dict(),
            "tools": _compact(analysis.tool_run),
            "guidance_md": analysis.guidance_md,
            "raw_md": analysis.raw_md,
            "text": analysis.text,
        }
    return out


def snapshot() -> dict[str, Any]:
    """Every tool's findings (and skips) on every capture, JSON-normalized."""
    data = {
        "captures": {
            folder.relative_to(DATA).as_posix(): _capture_runs(folder) for folder in CAPTURES
        },
        "example_repo": _example_runs(),
    }
    return json.loads(json.dumps(data, sort_keys=True))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=$PWD python tests/tools/golden_findings.py --write")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(snapshot(), indent=0, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(f"wrote {GOLDEN}\n")
