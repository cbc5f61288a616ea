"""`kernelpro compare BASE HEAD`: gate two saved runs against each other, offline.

BASE is a JSON report (with its timing samples) or a baseline YAML; HEAD is a JSON report.
Every kernel of HEAD gets the same verdict `--kernelpro-check` would give it, except that
no confirmation re-measurement is possible offline: a regression is shown as unconfirmed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.baseline import Baseline, BaselineEntry, load_baseline
from pytest_kernelpro.gate.report import load_report, records_of
from pytest_kernelpro.gate.verdict import DEFAULT_ALPHA, REGRESSED, compare
from pytest_kernelpro.results import KernelRecord


def _base_entries(path: str) -> Baseline:
    if path.lower().endswith((".yaml", ".yml")):
        return load_baseline(path)
    entries = {}
    for record in records_of(load_report(path)):
        entry = BaselineEntry.from_record(record)
        if entry is not None:
            entries[record.nodeid] = entry
    if not entries:
        raise KernelproError(f"kernelpro compare: the base report {path} has no timed kernels")
    return Baseline(path=path, device="", commit=None, created="", tool="", entries=entries)


def gate_records(
    base: Baseline,
    head: Sequence[KernelRecord],
    *,
    threshold: float | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> list[KernelRecord]:
    """HEAD's records with `gate` set by comparing them with BASE (no confirmation)."""
    out = []
    for record in head:
        verdict = compare(record, base.entry_for(record), threshold=threshold, alpha=alpha)
        record.gate = verdict.to_dict()
        out.append(record)
    return out


def compare_main(argv: Sequence[str] | None = None) -> int:
    """Print the table (or Markdown) of HEAD against BASE; exit 1 on a regression with
    --fail, 0 otherwise; 2 on bad usage."""
    parser = argparse.ArgumentParser(
        prog="kernelpro compare",
        description="Compare two kernelpro runs (base vs head) with the gate's statistics.",
    )
    parser.add_argument("base", metavar="BASE.json|BASELINE.yaml")
    parser.add_argument("head", metavar="HEAD.json")
    parser.add_argument(
        "--threshold", type=float, default=None, help="default: each kernel's own threshold"
    )
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--markdown", action="store_true", help="print the PR-comment Markdown")
    parser.add_argument("--fail", action="store_true", help="exit 1 when a kernel regressed")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        base = _base_entries(args.base)
        head = records_of(load_report(args.head))
        gated = gate_records(base, head, threshold=args.threshold, alpha=args.alpha)
    except KernelproError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    if args.markdown:
        from pytest_kernelpro.gate.comment import render_comment
        from pytest_kernelpro.gate.report import build_report

        sys.stdout.write(render_comment(build_report(gated, meta={"compared": args.base})))
    else:
        from pytest_kernelpro.gate.report import render_terminal_table

        width = shutil.get_terminal_size((100, 24)).columns
        sys.stdout.write(render_terminal_table(gated, width=width, color=sys.stdout.isatty()))
        sys.stdout.write("(offline comparison: regressions are not confirmed by re-measuring)\n")
    regressed = [r.name for r in gated if (r.gate or {}).get("change_status") == REGRESSED]
    return 1 if (args.fail and regressed) else 0
