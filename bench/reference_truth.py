"""Every KernelBench reference against its own float64 truth (`measure/correctness_check.py`),
by the correctness rule of `measure/output_rule.py` (issue 27), on one device.

For each problem (levels 1-3 of a staged KernelBench folder, as `kernelbench_sweep.py` uses
them, built and fed as the gate builds and feeds them: `problem.kernelbench`): the reference
runs once on its seed-1 inputs (fp32 matmuls/convs as torch's flags let them run, recorded as
the gate records them), then `measure.correctness_check.run_truth` re-runs it in float64 (its cost: wall
time and peak memory), and two "kernels" are judged:
- the exact answer (the truth rounded to the output's dtype) by the dtype default, today's
  rule: where it fails, the reference itself disagrees with its truth beyond that rule (the
  exact answer is rejected: 14_Gemm_Divide_Sum_Scaling's case);
- the same exact answer by the new rule: it must pass everywhere a truth ran (a failure is a
  bug in the rule).
Every problem whose reference disagrees with its truth beyond today's rule, whose truth could
not run (and why), or whose exact answer fails the new rule is listed, with the truth's cost.

Run (H200):  PYTHONPATH=$PWD python bench/reference_truth.py --problems .kb/KernelBench --out $OUT
CPU dry run: python bench/reference_truth.py --problems DIR --device cpu --out /tmp/truth --limit 5
Resumable: rows go to OUT/truth.jsonl as each problem finishes (`--state` to continue one);
`--deadline-s` stops starting problems after that many seconds. Writes truth.md (the tables,
also printed last).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

NUMBER_RE = re.compile(r"^(\d+)_")


def problem_files(root: Path, levels: list[int]) -> list[Path]:
    def key(p: Path) -> tuple[int, str]:
        m = NUMBER_RE.match(p.name)
        return (int(m.group(1)) if m else 10**6, p.name)

    out: list[Path] = []
    for level in levels:
        out += sorted((root / f"level{level}").glob("*.py"), key=key)
    return out


def _exact_answer(torch: Any, expected: Any, truth: Any) -> Any:
    """The reference's output structure with each judged leaf replaced by its truth rounded
    to the leaf's dtype (reference - (reference - truth), in chunks)."""
    from pytest_kernelpro.measure.output_rule import leaves_of

    by_path = {p: v for p, v in leaves_of(torch, expected)}
    exact: dict[str, Any] = {}
    for path, leaf in truth.leaves.items():
        ref = by_path[path]
        out = torch.empty_like(ref)
        flat_o, flat_r, flat_d = out.reshape(-1), ref.reshape(-1), leaf.difference.reshape(-1)
        step = 1 << 24
        for lo in range(0, ref.numel(), step):
            wide = torch.float64 if not ref.is_complex() else torch.complex128
            flat_o[lo : lo + step] = (
                flat_r[lo : lo + step].to(wide) - flat_d[lo : lo + step].to(wide)
            ).to(ref.dtype)
        exact[path] = out

    def rebuild(obj: Any, path: str) -> Any:
        if isinstance(obj, (list, tuple)):
            return type(obj)(rebuild(v, f"{path}[{i}]") for i, v in enumerate(obj))
        if isinstance(obj, dict):
            return {k: rebuild(v, f"{path}[{k!r}]") for k, v in obj.items()}
        return exact.get(path, obj)

    return rebuild(expected, "output")


def judge_problem(path: Path, device: str) -> dict[str, Any]:
    import torch

    from pytest_kernelpro.measure.correctness_check import clone_inputs, run_truth
    from pytest_kernelpro.measure.fp32_precision import run_recording_precision
    from pytest_kernelpro.measure.output_rule import (
        CorrectnessRule,
        compare_outputs,
        tolerance_rule,
    )
    from pytest_kernelpro.problem.kernelbench import problem_from_kernelbench

    row: dict[str, Any] = {"problem": path.stem, "level": int(path.parent.name[-1])}
    started = time.perf_counter()
    problem = problem_from_kernelbench(path)
    _kernel, reference = problem.instantiate(device)
    inputs = problem.make_inputs(device, 1)

    def call() -> Any:
        with torch.no_grad():
            out = reference(*clone_inputs(torch, inputs))
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return out

    t0 = time.perf_counter()
    expected, reduced = run_recording_precision(torch, call, device)
    reference_s = time.perf_counter() - t0
    row["reduced"] = reduced
    row["reference_s"] = round(reference_s, 6)
    truth = run_truth(torch, reference, inputs, expected, device=device, reference_s=reference_s)
    row.update(truth.summary())
    row["truth_s"] = row.pop("seconds")
    if truth.available:
        leaves = list(truth.leaves.values())
        row["reference_error"] = max(v.reference_error_rel for v in leaves)
        row["reference_error_max"] = max(v.reference_error_max for v in leaves)
        row["truth_abs_max"] = max(v.truth_abs_max for v in leaves)
        exact = _exact_answer(torch, expected, truth)
        old = [
            r
            for r in compare_outputs(torch, exact, expected, tolerance_rule(reduced=reduced))
            if not r.ok
        ]
        row["old_rule_rejects_exact"] = bool(old)
        row["old_rule_failure"] = old[0].message[:300] if old else None
        row["old_rule_worst_ratio"] = max(
            (
                r.worst_ratio
                for r in compare_outputs(torch, exact, expected, tolerance_rule(reduced=reduced))
            ),
            default=0.0,
        )
        rule = CorrectnessRule()
        rule.reduced = reduced
        rule.set_truth(truth)
        t0 = time.perf_counter()
        new = [r for r in rule.judge(torch, exact, expected) if not r.ok]
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        row["judge_s"] = round(time.perf_counter() - t0, 6)  # the first trial's comparison
        row["new_rule_rejects_exact"] = bool(new)
        row["new_rule_failure"] = new[0].message[:300] if new else None
        row["exact_error"] = rule.kernel_error
        del exact
    del expected, truth
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    row["wall_s"] = round(time.perf_counter() - started, 3)
    return row


def _f(value: Any, spec: str = ".3g") -> str:
    return (
        "–"
        if value is None
        else format(value, spec)
        if isinstance(value, (int, float))
        else str(value)
    )


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    done = [r for r in rows if r.get("kind") == "problem"]
    ran = [r for r in done if r.get("skipped") is None and r.get("error") is None]
    skipped = [r for r in done if r.get("skipped") is not None]
    errors = [r for r in done if r.get("error") is not None]
    old_rejects = [r for r in ran if r.get("old_rule_rejects_exact")]
    new_rejects = [r for r in ran if r.get("new_rule_rejects_exact")]
    truth_s = [r["truth_s"] for r in ran if r.get("truth_s") is not None]
    peaks = [r["peak_bytes"] for r in ran if r.get("peak_bytes") is not None]
    lines = [
        "# KernelBench references against their float64 truth",
        "",
        f"- device: {meta.get('gpu') or meta.get('device')}, torch {meta.get('torch')}",
        f"- problems: {len(done)}; truth ran on {len(ran)}, skipped on {len(skipped)}, "
        f"errors {len(errors)}",
        f"- first-trial comparison by the rule (screen, truth, information): total "
        f"{sum(r.get('judge_s') or 0 for r in ran):.2f} s",
        f"- truth cost (re-run and the reference's errors): total {sum(truth_s):.2f} s, median "
        f"{sorted(truth_s)[len(truth_s) // 2] if truth_s else 0:.4f} s, max "
        f"{max(truth_s, default=0):.3f} s; peak memory max "
        f"{max(peaks, default=0) / 2**30:.2f} GiB",
        f"- the exact answer rejected by today's dtype rule (the reference itself off by more): "
        f"{len(old_rejects)}",
        f"- the exact answer rejected by the new rule (must be 0): {len(new_rejects)}",
        "",
        "## Every reference that disagrees with its own truth beyond today's rule",
        "",
        "| level | problem | reduced | reference error (normwise rel) | max abs error | worst ratio (today's rule) | truth s | truth peak GiB |",
        "|--:|:--|:--|--:|--:|--:|--:|--:|",
    ]
    for r in old_rejects:
        lines.append(
            f"| {r['level']} | {r['problem']} | {r.get('reduced') or '–'} | "
            f"{_f(r.get('reference_error'))} | {_f(r.get('reference_error_max'))} | "
            f"{_f(r.get('old_rule_worst_ratio'))} | {_f(r.get('truth_s'), '.4f')} | "
            f"{_f((r.get('peak_bytes') or 0) / 2**30, '.2f')} |"
        )
    if new_rejects:
        lines += ["", "## The exact answer rejected by the new rule (a bug)", ""]
        for r in new_rejects:
            lines.append(f"- level {r['level']} {r['problem']}: {r.get('new_rule_failure')}")
    lines += ["", "## No truth (the dtype rule decides there)", ""]
    for r in skipped:
        lines.append(f"- level {r['level']} {r['problem']}: {r['skipped']}")
    if errors:
        lines += ["", "## Errors", ""]
        for r in errors:
            lines.append(f"- level {r['level']} {r['problem']}: {r['error'][:300]}")
    lines += [
        "",
        "## All problems",
        "",
        "| level | problem | reduced | reference s | truth s | truth peak GiB | reference error | exact: today's | exact: new |",
        "|--:|:--|:--|--:|--:|--:|--:|:--|:--|",
    ]
    for r in done:
        lines.append(
            f"| {r['level']} | {r['problem']} | {r.get('reduced') or '–'} | "
            f"{_f(r.get('reference_s'), '.4f')} | {_f(r.get('truth_s'), '.4f')} | "
            f"{_f((r.get('peak_bytes') or 0) / 2**30, '.2f')} | {_f(r.get('reference_error'))} | "
            f"{'reject' if r.get('old_rule_rejects_exact') else 'pass' if r.get('reference_error') is not None else '–'} | "
            f"{'reject' if r.get('new_rule_rejects_exact') else 'pass' if r.get('reference_error') is not None else '–'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", required=True, help="folder with level1/ level2/ level3/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--state", help="a truth.jsonl to continue")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--select", help="only problems whose name matches this regex")
    parser.add_argument("--deadline-s", type=float, default=420.0)
    args = parser.parse_args(argv)

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = out / "truth.jsonl"
    if args.state and Path(args.state).resolve() != state.resolve() and Path(args.state).exists():
        state.write_text(Path(args.state).read_text(encoding="utf-8"), encoding="utf-8")
    rows = []
    if state.exists():
        for line in state.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    done = {(r.get("level"), r.get("problem")) for r in rows if r.get("kind") == "problem"}
    files = problem_files(Path(args.problems), [int(x) for x in args.levels.split(",")])
    if args.select:
        files = [f for f in files if re.search(args.select, f.stem)]
    if args.limit:
        files = files[: args.limit]
    started = time.monotonic()
    with open(state, "a", encoding="utf-8") as handle:
        for path in files:
            key = (int(path.parent.name[-1]), path.stem)
            if key in done:
                continue
            if time.monotonic() - started > args.deadline_s:
                print(f"[truth] deadline reached before {path.stem}", flush=True)
                break
            try:
                row = judge_problem(path, device)
            except Exception as exc:  # one problem's failure is a row, not the end
                row = {
                    "problem": path.stem,
                    "level": key[0],
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                    "traceback": traceback.format_exc()[-1500:],
                }
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
            row["kind"] = "problem"
            rows.append(row)
            handle.write(json.dumps(row, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            print(
                f"[truth] L{row['level']} {row['problem']}: truth {row.get('truth_s')} s, "
                f"ref err {row.get('reference_error')}, skipped {row.get('skipped')}, "
                f"today's rule rejects exact: {row.get('old_rule_rejects_exact')}, "
                f"new: {row.get('new_rule_rejects_exact')}",
                flush=True,
            )
    meta = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name(0)
    meta["wall_s"] = round(time.monotonic() - started, 1)
    text = render(rows, meta)
    (out / "truth.md").write_text(text, encoding="utf-8")
    # The short table last: the summary lines and the disagreeing references.
    head = text.split("\n## No truth")[0]
    print(head)
    print(f"[truth] wall {meta['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
