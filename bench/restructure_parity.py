"""Verdicts and numbers of a fixed set of runs, to compare the code before and after a
structural change (issue 9: the `run/` package, one settings resolution, the timing split).

What it runs, each as its own pytest session in a subprocess (so one crash stays one step):
1. the example repository: `--kernelpro-save-baseline`, then `--kernelpro-check` against that
   baseline, then `--kernelpro-profile` on a few kernels (`--profile-k`);
2. a handful of KernelBench-format problems (`--kb-dir`, the published files staged under an
   ignored folder such as `.kb/KernelBench`; never committed): save a baseline, then check.

Per record it keeps what a structural change must not move: outcome, the gate's status and
failure, the median and its CI, correctness errors and tolerances, FLOPs, minimal bytes, bound,
the peak used, % of roofline, and for profiled items whether a profile and guidance came back.
Everything lands in `--out` as it goes: `parity-LABEL.json` (the table, rewritten after each
step) and `parity-LABEL/` (each step's JSON report, records log and log), so a call cut off
keeps the steps that finished.

Run (H200):  python bench/restructure_parity.py --label before --out $OUT \
                 --ceilings bench/results/raw/2026-11-30-ceilings-h200-run1.json
CPU dry run: python bench/restructure_parity.py --label dry --device cpu --kb-dir DIR \
                 --out /tmp/parity --problems NAME,...
Compare:     python bench/restructure_parity.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path.cwd().resolve()  # run from the repository root (the device stages this file elsewhere)
# Quick on the H200 (0.33-0.42 s an item in the 2026-12-01 KernelBench sweep) and spread over
# GEMM, elementwise, reduction, convolution and whole small networks, all three levels.
DEFAULT_PROBLEMS = (
    "level1/2_Standard_matrix_multiplication_.py",
    "level1/12_Matmul_with_diagonal_matrices_.py",
    "level1/88_MinGPTNewGelu.py",
    "level1/95_CrossEntropyLoss.py",
    "level2/76_Gemm_Add_ReLU.py",
    "level2/24_Conv3d_Min_Softmax.py",
    "level3/4_LeNet5.py",
    "level3/8_ResNetBasicBlock.py",
)
DEFAULT_PROFILE_K = "cuda_saxpy or triton_softmax"


def plugin_autoloaded() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "pytest_kernelpro.plugin" for ep in entry_points(group="pytest11"))


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def summarize_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The parts of one report record that a structure-only change must leave as they are."""
    timing = rec.get("timing") or {}
    stats = timing.get("stats") or {}
    roofline = rec.get("roofline") or {}
    gate = rec.get("gate") or {}
    corr = rec.get("correctness") or {}
    profile = rec.get("profile")
    return {
        "name": rec.get("name"),
        "outcome": rec.get("outcome"),
        "message": (rec.get("message") or "")[:300] or None,
        "device": rec.get("device"),
        "threshold": rec.get("threshold"),
        "min_roofline": rec.get("min_roofline"),
        "gate_status": gate.get("status"),
        "gate_reason": (gate.get("reason") or "")[:200] or None,
        "gate_failed": gate.get("failed"),
        "gate_change": _float(gate.get("change")),
        "median_s": _float(stats.get("median_s")),
        "rel_ci": _float(stats.get("rel_ci_halfwidth")),
        "samples": len(timing.get("samples_s") or []),
        "stop_reason": timing.get("stop_reason"),
        "correct": corr.get("passed"),
        "rtol": (corr.get("tolerance") or {}).get("rtol"),
        "atol": (corr.get("tolerance") or {}).get("atol"),
        "max_abs_err": _float(corr.get("max_abs_err")),
        "flops": roofline.get("flops"),
        "min_bytes": roofline.get("min_bytes"),
        "bound": roofline.get("bound"),
        "peak_name": roofline.get("peak_name"),
        "efficiency": _float(rec.get("efficiency")),
        "profiled": profile is not None,
        "guidance": bool(rec.get("guidance")),
    }


def run_step(name: str, argv: list[str], cwd: Path, limit_s: float, raw: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *argv]
    if not plugin_autoloaded():
        cmd[3:3] = ["-p", "pytest_kernelpro.plugin"]
    started = time.monotonic()
    log = raw / f"{name}.log"
    with open(log, "w", encoding="utf-8") as handle:
        try:
            rc = subprocess.run(
                cmd, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=limit_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = round(time.monotonic() - started, 2)
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-3:]
    print(f"{name}: rc={rc} wall_s={wall} | {' / '.join(tail)}", flush=True)
    return {"step": name, "rc": rc, "wall_s": wall, "cmd": cmd[3:], "cwd": str(cwd)}


def read_report(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"missing": True}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {
        "summary": data.get("summary"),
        "records": {r["nodeid"]: summarize_record(r) for r in data.get("records", [])},
    }


def stage_problems(kb_dir: Path, names: list[str], into: Path) -> list[str]:
    staged = []
    for name in names:
        src = kb_dir / name
        if not src.is_file():
            raise SystemExit(f"--problems: {name} is not a file under --kb-dir {kb_dir}")
        dst = into / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        staged.append(name)
    return staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run", help="names the output files")
    parser.add_argument("--out", default="/tmp/parity")
    parser.add_argument("--device", default="", help="--kernelpro-device (empty: the repo's)")
    parser.add_argument("--kb-dir", default=str(ROOT / ".kb" / "KernelBench"))
    parser.add_argument("--problems", default=",".join(DEFAULT_PROBLEMS))
    parser.add_argument("--profile-k", default=DEFAULT_PROFILE_K)
    parser.add_argument(
        "--ceilings", default="", help="--kernelpro-ceilings JSON (skips measuring)"
    )
    parser.add_argument("--step-limit-s", type=float, default=150.0)
    parser.add_argument(
        "--profile-limit-s", type=float, default=0.0, help="ex_profile's limit (0: --step-limit-s)"
    )
    parser.add_argument(
        "--commit", default="", help="the tree's commit, when `git rev-parse` cannot tell"
    )
    parser.add_argument("--skip", default="", help="comma-separated steps to leave out")
    parser.add_argument("--ex-k", default="", help="-k expression for the example save/check")
    parser.add_argument(
        "--ex-baseline",
        default="",
        help="check the example repository against this baseline (e.g. the one an earlier "
        "call saved with other code) instead of the one ex_save writes",
    )
    parser.add_argument("--kb-baseline", default="", help="the same for the KernelBench check")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(*(json.loads(Path(p).read_text()) for p in args.compare)))
        return 0

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    common: list[str] = []
    if args.device:
        common.append(f"--kernelpro-device={args.device}")
    if args.ceilings:
        common.append(f"--kernelpro-ceilings={Path(args.ceilings).resolve()}")
    result: dict[str, Any] = {
        "label": args.label,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import torch

        result["torch"] = torch.__version__
        result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as exc:  # the table still says what ran where
        result["torch"] = f"unavailable: {exc}"
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result["commit"] = args.commit or commit or os.environ.get("PARITY_COMMIT", "unknown")
    result["git_rev_parse"] = commit
    steps: list[dict[str, Any]] = []
    reports: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        # The reports and logs go straight to --out: a call cut off keeps what finished.
        raw = out / f"parity-{args.label}"
        raw.mkdir(exist_ok=True)
        example = ROOT / "example_repo"
        ex_k = ["-k", args.ex_k] if args.ex_k else []
        ex_base = Path(args.ex_baseline).resolve() if args.ex_baseline else raw / "ex-baseline.yaml"
        kb_base = Path(args.kb_baseline).resolve() if args.kb_baseline else raw / "kb-baseline.yaml"
        result["baselines"] = {"ex": str(ex_base), "kb": str(kb_base)}
        plan: list[tuple[str, list[str], Path]] = [
            (
                "ex_save",
                [
                    *ex_k,
                    f"--kernelpro-save-baseline={ex_base}",
                    f"--kernelpro-json={raw / 'ex_save.json'}",
                ],
                example,
            ),
            (
                "ex_check",
                [
                    *ex_k,
                    "--kernelpro-check",
                    f"--kernelpro-baseline={ex_base}",
                    f"--kernelpro-json={raw / 'ex_check.json'}",
                    f"--junitxml={raw / 'ex_check.junit.xml'}",
                ],
                example,
            ),
            (
                "ex_profile",
                [
                    "-rA",
                    "--kernelpro-profile",
                    "-k",
                    args.profile_k,
                    f"--kernelpro-json={raw / 'ex_profile.json'}",
                ],
                example,
            ),
        ]
        names = [n for n in args.problems.split(",") if n]
        if names and not {"kb_save", "kb_check"} <= skip:
            kb = Path(tmp) / "kb"
            result["kb_problems"] = stage_problems(Path(args.kb_dir), names, kb)
            (kb / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # plugin defaults
            kb_args = [
                "-c",
                str(kb / "pytest.ini"),
                f"--rootdir={kb}",
                f"--kernelpro-problems={kb}",
            ]
            plan += [
                (
                    "kb_save",
                    [
                        *kb_args,
                        f"--kernelpro-save-baseline={kb_base}",
                        f"--kernelpro-json={raw / 'kb_save.json'}",
                    ],
                    kb,
                ),
                (
                    "kb_check",
                    [
                        *kb_args,
                        "--kernelpro-check",
                        f"--kernelpro-baseline={kb_base}",
                        f"--kernelpro-json={raw / 'kb_check.json'}",
                    ],
                    kb,
                ),
            ]
        for name, step_args, cwd in plan:
            if name in skip:
                continue
            limit = (
                args.profile_limit_s
                if name == "ex_profile" and args.profile_limit_s
                else (args.step_limit_s)
            )
            steps.append(run_step(name, [*step_args, *common], cwd, limit, raw))
            reports[name] = read_report(raw / f"{name}.json")
            result.update(steps=steps, reports=reports)
            (out / f"parity-{args.label}.json").write_text(json.dumps(result, indent=1))
    print(compare(result, result) if not args.compare else "", flush=True)
    return 0 if all(s["rc"] in (0, 1) for s in steps) else 1


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A Markdown table per step: each record's verdict and numbers, before and after."""
    lines: list[str] = []
    for step, rep in before.get("reports", {}).items():
        other = after.get("reports", {}).get(step, {})
        lines += [
            f"### {step}",
            "",
            "| item | outcome | gate | median µs before | after | Δ | % roofline before | after "
            "| bound | FLOPs same | bytes same | profiled |",
            "|---|---|---|--:|--:|--:|--:|--:|---|---|---|---|",
        ]
        recs_b = rep.get("records", {})
        recs_a = other.get("records", {})
        for nodeid in sorted(set(recs_b) | set(recs_a)):
            b, a = recs_b.get(nodeid, {}), recs_a.get(nodeid, {})
            mb, ma = b.get("median_s"), a.get("median_s")
            delta = f"{(ma / mb - 1) * 100:+.1f}%" if mb and ma else "-"
            eb, ea = b.get("efficiency"), a.get("efficiency")

            def pair(key: str, b: dict[str, Any] = b, a: dict[str, Any] = a) -> str:
                return (
                    _fmt(b.get(key))
                    if b.get(key) == a.get(key)
                    else (f"{_fmt(b.get(key))} / {_fmt(a.get(key))}")
                )

            lines.append(
                f"| {b.get('name') or a.get('name')} | {pair('outcome')} | {pair('gate_status')} "
                f"| {_fmt(mb * 1e6 if mb else None)} | {_fmt(ma * 1e6 if ma else None)} | {delta} "
                f"| {_fmt(eb * 100 if eb else None)} | {_fmt(ea * 100 if ea else None)} "
                f"| {pair('bound')} | {b.get('flops') == a.get('flops')} "
                f"| {b.get('min_bytes') == a.get('min_bytes')} | {pair('profiled')} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
