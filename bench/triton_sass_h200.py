"""SASS of Triton kernels on the H200, in the gate's profile and in a search (issue 12).

    python bench/triton_sass_h200.py --out $OUT --kb .devstage/h12-gpu/kb [--deadline-s 300]
    python bench/triton_sass_h200.py --out /tmp/ts --kb KB --device cpu   # dry run

Steps, each one JSON line of OUT/steps.jsonl as it ends (a failing step is recorded and the
next runs):

1. `profile:cold`: `pytest --kernelpro-profile -k "triton_softmax or triton_add"` on a copy of
   example_repo with an empty Triton cache (TRITON_CACHE_DIR set for the run). Per record:
   each profiled kernel's ncu metrics, SASS instruction count and `sass_source`, the SASS
   summary of its guidance, the tools run, the profile's seconds. `ok` when every Triton
   kernel (`*_kernel`, the example's @triton.jit names) has SASS read from a cubin.
2. `optimize`: `bench/optimize_h200.py` on 12_Gemm_Multiply_LeakyReLU (replay corpus of
   hand-written candidates: node 1 an fp32 Triton GEMM, node 2 the 3xTF32 one, node 3 a
   wrong cuBLAS TF32 one), `--kernelpro-feedback=tools`, in the namespace sandbox. Per
   candidate: status, the kernels with SASS (instructions, cubin), the profile's seconds;
   per prompt: its SASS summary. `ok` when every correct candidate has SASS and an optimize
   prompt made after a profiled Triton candidate carries its SASS summary.
3. `profile:warm`: step 1 again for triton_add with the now warm cache: the kernel is a
   cache hit, the case a private per-profile cache is for.
4. `search_cost`: `bench/search_cost_h200.py` (sandboxed vs unsandboxed candidate profile),
   only while the deadline leaves `--search-cost-s`.

OUT/raw.tar.gz holds every log and report. With --device cpu the Triton kernels skip and
the search's Triton candidates fail: only the plumbing is exercised.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from optimize_h200 import run  # noqa: E402  (bench/, beside this file)

# The example's Triton kernels, by the name ncu and the cubin give them.
TRITON_NAME = re.compile(r"(^|_)kernel$|^_")
SASS_HEAD = "### SASS summary"


def log(text: str) -> None:
    sys.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stdout.flush()


def add_step(out: Path, step: str, entry: dict[str, Any]) -> None:
    line = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **entry}
    with open(out / "steps.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    log(f"{step}: {json.dumps(line, default=str)[:1500]}")


def sass_section(text: str) -> str | None:
    """The SASS summary section of a guidance or prompt text, or None."""
    if SASS_HEAD not in text:
        return None
    section = text.split(SASS_HEAD, 1)[1]
    return SASS_HEAD + section.split("\n###", 1)[0]


def kernel_rows(profile: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for k in profile.get("kernels") or ():
        sass = k.get("sass") or {}
        metrics = (k.get("metrics") or {}).get("metrics") or {}
        rows.append(
            {
                "kernel": k.get("name"),
                "triton": bool(TRITON_NAME.search(str(k.get("name") or ""))),
                "ncu_metrics": len(metrics),
                "sass_instructions": sass.get("total_instructions"),
                "sass_source": k.get("sass_source"),
                "tensor_ops": {
                    op: n
                    for op, n in (sass.get("counts") or {}).items()
                    if op.startswith(("HMMA", "HGMMA", "IMMA"))
                },
                "ffma": (sass.get("counts") or {}).get("FFMA"),
            }
        )
    return rows


def profile_step(
    args: argparse.Namespace, name: str, select: str, cache: Path, raw: Path, left: float
) -> dict[str, Any]:
    """`pytest --kernelpro-profile -k select` on the example repository, Triton's cache at
    `cache` (kept between the cold and the warm step)."""
    repo = args.scratch / "example"
    if not repo.is_dir():
        shutil.copytree(
            REPO / "example_repo",
            repo,
            ignore=shutil.ignore_patterns(".kernelpro", "__pycache__", "replays"),
        )
    cache.mkdir(parents=True, exist_ok=True)
    before = sorted(str(p.relative_to(cache)) for p in cache.glob("*/*.cubin"))
    installed = any(
        "pytest_kernelpro" in e.value for e in importlib.metadata.entry_points(group="pytest11")
    )
    cmd = [
        sys.executable, "-m", "pytest", *([] if installed else ["-p", "pytest_kernelpro.plugin"]),
        "-p", "no:cacheprovider",
        "--kernelpro-profile", "--kernelpro-time-budget=0.2", "--kernelpro-warmup-ms=50",
        "--kernelpro-profile-timeout=60", "-k", select, "-rs",
    ]  # fmt: skip
    if args.device:
        cmd.append(f"--kernelpro-device={args.device}")
    result: dict[str, Any] = {
        "select": select,
        "cache": str(cache),
        "cubins_in_cache_before": before,
        "run": run(cmd, repo, raw / f"{name}.log", left, {"TRITON_CACHE_DIR": str(cache)}),
    }
    report = repo / ".kernelpro" / "kernelpro-report.json"
    if not report.is_file():
        result["ok"] = False
        result["why"] = "no JSON report"
        return result
    shutil.copy(report, raw / f"{name}.report.json")
    records = json.loads(report.read_text(encoding="utf-8"))["records"]
    items = []
    for record in records:
        profile = record.get("profile") or {}
        extra = record.get("extra") or {}
        tools = extra.get("tools") or {}
        rows = kernel_rows(profile)
        items.append(
            {
                "name": record.get("name"),
                "outcome": record.get("outcome"),
                "language": record.get("language"),
                "median_s": ((record.get("timing") or {}).get("stats") or {}).get("median_s"),
                "kernels": rows,
                "sass_notes": [
                    n.get("why")
                    for n in profile.get("not_collected") or ()
                    if n.get("what") == "sass"
                ],
                "not_collected": [n.get("what") for n in profile.get("not_collected") or ()],
                "profile_wall_s": extra.get("profile_wall_s"),
                "tools_ran": [
                    f"{r.get('tool')}{'*' if r.get('triggered') else ''}"
                    for r in tools.get("ran") or ()
                ],
                "tools_skipped": tools.get("skipped"),
                "findings": [
                    f"[{f.get('severity')}] {f.get('tool')}: {f.get('title')}"
                    for f in tools.get("findings") or ()
                ],
                "guidance_sass": sass_section(record.get("guidance") or ""),
                "sources_exist": {
                    r["sass_source"]: Path(r["sass_source"]).is_file()
                    for r in rows
                    if r.get("sass_source")
                },
            }
        )
    result["items"] = items
    triton_rows = [r for it in items for r in it["kernels"] if r["triton"]]
    result["cubins_in_cache_after"] = len(list(cache.glob("*/*.cubin")))
    result["ok"] = bool(triton_rows) and all(
        r["sass_instructions"] and r["sass_source"] for r in triton_rows
    )
    return result


def optimize_step(args: argparse.Namespace, raw: Path, left: float) -> dict[str, Any]:
    out = args.scratch / "opt-out"
    shutil.rmtree(out, ignore_errors=True)
    # optimize_h200 starts the search only while its deadline leaves the process limit, after
    # its environment step (a sandbox probe).
    limit = min(args.process_limit_s, left - 30)
    cmd = [
        sys.executable, str(REPO / "bench" / "optimize_h200.py"), "--out", str(out),
        "--kb", str(args.kb), "--scratch", str(args.scratch / "opt"),
        "--kernels", args.kernel, "--kb-budget", str(args.budget),
        "--process-limit-s", str(limit), "--deadline-s", str(limit + 25),
        "--recheck-limit-s", "0",
    ]  # fmt: skip
    if args.device:
        cmd += ["--device", args.device]
    result: dict[str, Any] = {"run": run(cmd, REPO, raw / "optimize.log", left)}
    for name in ("steps.jsonl", "raw.tar.gz"):
        if (out / name).is_file():
            shutil.copy(out / name, raw / f"optimize.{name}")
    steps = out / "steps.jsonl"
    if not steps.is_file():
        result["ok"] = False
        return result
    entries = [json.loads(ln) for ln in steps.read_text(encoding="utf-8").splitlines() if ln]
    search = next(
        (e for e in entries if e["step"] in (f"search:{args.kernel}", f"partial:{args.kernel}")),
        None,
    )
    if search is None:
        result["ok"] = False
        result["why"] = "no search line"
        return result
    result["search_step"] = search["step"]
    summary = search.get("summary") or {}
    result["status"] = summary.get("status") or search.get("status")
    result["candidates"] = search.get("candidates")
    nodes = []
    for node in search.get("nodes") or ():
        nodes.append(
            {
                k: node.get(k)
                for k in (
                    "id",
                    "mode",
                    "status",
                    "speedup_vs_reference",
                    "profile_s",
                    "profile_collect_s",
                    "profile_kernels",
                    "sass",
                    "sass_kernels",
                    "not_collected",
                    "findings",
                    "profile_error",
                    "stage1",
                )  # fmt: skip
            }
        )
    result["nodes"] = nodes
    prompts = []
    for prompt in search.get("prompts") or ():
        prompts.append(
            {
                "mode": prompt.get("mode"),
                "node": prompt.get("node"),
                "answered_by": prompt.get("answered_by"),
                "sections": prompt.get("sections"),
                "sass_summary": sass_section(prompt.get("guidance") or ""),
            }
        )
    result["prompts"] = prompts
    correct = [n for n in nodes if n["status"] == "correct"]
    triton_sass = [
        k for n in correct for k in n.get("sass_kernels") or () if str(k.get("source") or "")
    ]
    carried = [
        p for p in prompts
        if p["mode"] == "optimize" and p["sass_summary"]
        and "not collected" not in p["sass_summary"]
    ]  # fmt: skip
    result["ok"] = (
        bool(correct) and all(n.get("sass") for n in correct) and bool(triton_sass and carried)
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kb", type=Path, required=True, help="KernelBench files (level2/...)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/kp-triton-sass"))
    parser.add_argument("--device", default=None, help="cpu: a dry run")
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--kernel", default="12_Gemm_Multiply_LeakyReLU")
    parser.add_argument("--budget", default="3")
    parser.add_argument("--process-limit-s", type=float, default=190.0)
    parser.add_argument("--search-cost-s", type=float, default=160.0)
    parser.add_argument("--steps", default="profile:cold,optimize,profile:warm,search_cost")
    args = parser.parse_args()
    started = time.monotonic()

    def left() -> float:
        return args.deadline_s - (time.monotonic() - started)

    args.out.mkdir(parents=True, exist_ok=True)
    args.kb = args.kb.resolve()
    shutil.rmtree(args.scratch, ignore_errors=True)
    raw = args.scratch / "raw"
    raw.mkdir(parents=True)
    cache = args.scratch / "triton-cache"
    wanted = [s.strip() for s in args.steps.split(",") if s.strip()]
    try:
        import torch

        add_step(
            args.out,
            "env",
            {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                "triton": _version("triton"),
            },
        )
    except Exception as exc:  # the steps still run; their logs say more
        add_step(args.out, "env", {"error": repr(exc)})
    for step in wanted:
        try:
            if step == "profile:cold":
                entry = profile_step(
                    args, "profile-cold", "triton_softmax or triton_add", cache, raw,
                    min(120.0, left() - 5),
                )  # fmt: skip
            elif step == "optimize":
                if left() < 100:
                    add_step(args.out, step, {"skipped": f"{left():.0f} s left"})
                    continue
                entry = optimize_step(args, raw, left() - 5)
            elif step == "profile:warm":
                if left() < 45:
                    add_step(args.out, step, {"skipped": f"{left():.0f} s left"})
                    continue
                entry = profile_step(args, "profile-warm", "triton_add", cache, raw, left() - 5)
            elif step == "search_cost":
                if left() < args.search_cost_s:
                    add_step(args.out, step, {"skipped": f"{left():.0f} s left"})
                    continue
                cmd = [sys.executable, str(REPO / "bench" / "search_cost_h200.py"),
                       "--out", str(raw / "search-cost"), "--deadline-s", str(left() - 20)]  # fmt: skip
                if args.device:
                    cmd += ["--device", args.device]
                entry = run(cmd, REPO, raw / "search-cost.log", left() - 5)
            else:
                entry = {"error": f"unknown step {step!r}"}
        except Exception as exc:  # recorded; the next step runs
            entry = {"error": f"{type(exc).__name__}: {exc}"}
        add_step(args.out, step, entry)
        with tarfile.open(args.out / "raw.tar.gz", "w:gz") as tar:
            tar.add(raw, arcname="raw")
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


def _version(name: str) -> str | None:
    try:
        return __import__(name).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
