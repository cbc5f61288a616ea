"""The optimize loop on the H200, as a user runs it: `pytest --kernelpro-optimize=N
--kernelpro-llm=replay:replays --kernelpro-feedback=tools` on the example repository's replay
corpus (softmax_rows: memory-bound; matmul: tensor-core GEMM; bias_gelu[2048x1024]: a fusion)
and on KernelBench problems with hand-written replay candidates (bench/kb_replays/), then every
best patch applied in a fresh clone and re-checked with `pytest --kernelpro-check -k KERNEL`.

    python bench/optimize_h200.py --out DIR [--resume OLD_STEPS.jsonl] [--device cpu]
        [--kernels softmax_rows,matmul,...] [--deadline-s 500] [--budget 4]
        [--process-limit-s 205] [--recheck-step recheck:s4 --recheck-limit-s 130]

With --process-limit-s every search group's pytest process gets that limit of its own and is
started only while the deadline leaves that much, so the last step of a search (the final
re-measurement, the confirmation) is not cut to fit one deadline shared by everything. The
re-check saves a baseline from the unpatched code in its own clone first, so the patched
kernels get the gate's verdict against the starting kernel measured in the same call.

Resumable across device calls: every finished step (the environment, each kernel's search,
the re-check) is one line of DIR/steps.jsonl, written as soon as it ends. A later call given
that file (`--resume`) copies its lines and skips the steps they cover: a kernel's search
keeps its best patch's text and the baseline file, so the re-check can run on a fresh
machine. A kernel's search is started only while the deadline leaves room for one
(`--kernel-cost-s`); one cut off by the deadline is not recorded as done (a `partial:` line
says what its run folder held by then) and runs again next time.

Per kernel the line holds: the search's outcome and ranking (speedup vs the starting kernel
and vs the reference, re-measured; % of roofline before and after), the evaluations and
their outcomes, the wall time split (generate / build / check / time / profile / remeasure),
every candidate (status, reason, profile time, ncu kernels, SASS, timeline, Stage 1,
findings), the guidance each optimize prompt carried, the winner's confirmation and the
item's own timing. DIR/raw.tar.gz holds every log, report, trajectory, model-call record and
patch. The KernelBench files are read from --kb (as published; never committed), copied into
the scratch repository's kb_problems/; with --device cpu their sizes are cut down so a CPU
dry run finishes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from optimize_replay import git, records  # noqa: E402  (bench/, beside this file)

# (report name, -k expression, KernelBench file under --kb or None)
KERNELS: dict[str, tuple[str, str | None]] = {
    "softmax_rows": ("softmax_rows", None),
    "matmul": ("matmul", None),
    "bias_gelu[2048x1024]": ("2048x1024", None),
    "88_MinGPTNewGelu": ("88_MinGPTNewGelu", "level1/88_MinGPTNewGelu.py"),
    "12_Gemm_Multiply_LeakyReLU": (
        "12_Gemm_Multiply_LeakyReLU",
        "level2/12_Gemm_Multiply_LeakyReLU.py",
    ),
}
# Searched together in one pytest process each (the CUDA sandbox probe, the interpreter's and
# torch's start are paid once per process).
GROUPS = (
    ("softmax_rows", "matmul", "bias_gelu[2048x1024]"),
    ("88_MinGPTNewGelu", "12_Gemm_Multiply_LeakyReLU"),
)
# CPU dry run: the KernelBench sizes cut down (the published ones take minutes per call there).
CPU_SIZES = {"batch_size": 64, "dim": 256, "in_features": 128, "out_features": 128}
GUIDANCE_HEADS = ("## Automated Bottleneck Analysis", "## Profiler Metrics (raw)")


def log(text: str) -> None:
    sys.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stdout.flush()


class Steps:
    """DIR/steps.jsonl: one line per finished step, appended and flushed at once."""

    def __init__(self, path: Path, resume: list[Path]) -> None:
        self.path = path
        self.done: dict[str, dict[str, Any]] = {}
        lines: list[str] = []
        for old in resume:
            if old.is_file() and old.resolve() != path.resolve():
                lines += [ln for ln in old.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if path.is_file():
            lines += [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        with open(path, "w", encoding="utf-8") as handle:
            for line in lines:
                entry = json.loads(line)
                self.done[entry["step"]] = entry
                handle.write(line + "\n")

    def add(self, step: str, entry: dict[str, Any]) -> None:
        entry = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **entry}
        self.done[step] = entry
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def environment(device: str | None, *, probe: bool = True) -> dict[str, Any]:
    """Device, versions and (`probe`) how the sandbox isolates candidates on this machine
    (every evaluation names its isolation too, so a resumed call skips the probe's ~15 s)."""
    import torch

    from pytest_kernelpro.optimize.sandbox.isolation import Isolation

    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available() and device != "cpu":
        info["device"] = torch.cuda.get_device_name(0)
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=False,
            )
            info["driver_maxclock"] = out.stdout.strip()
    else:
        info["device"] = "cpu"
    ncu = shutil.which("ncu")
    if ncu:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, check=False)
        info["ncu"] = out.stdout.strip().splitlines()[-1:]
    if not probe:
        return info
    started = time.monotonic()
    cuda = info["device"] != "cpu"
    isolation = Isolation.probe("auto", cuda=cuda)
    info["isolation"] = isolation.describe()
    info["isolation_probe_s"] = round(time.monotonic() - started, 1)
    return info


def _commit() -> str | None:
    """The repository's commit, where git can tell (the device's copy may have no .git)."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or None if out.returncode == 0 else None


def make_user_repo(
    root: Path, kb: Path, device: str | None, steps: Steps, *, full_size: bool = False
) -> Path:
    """example_repo/ plus the KernelBench problems and their replays, as a git repository."""
    from pytest_kernelpro.optimize.loop.corpus import build

    user = root / "user-repo"
    shutil.rmtree(user, ignore_errors=True)
    shutil.copytree(
        REPO / "example_repo", user, ignore=shutil.ignore_patterns(".kernelpro", "__pycache__")
    )
    problems = user / "kb_problems"
    problems.mkdir()
    for _, kb_file in KERNELS.values():
        if kb_file is None:
            continue
        text = (kb / kb_file).read_text(encoding="utf-8")
        if device == "cpu" and not full_size:
            for name, value in CPU_SIZES.items():
                text = re.sub(rf"^{name}\s*=\s*\d+", f"{name} = {value}", text, flags=re.M)
        (problems / Path(kb_file).name).write_text(text, encoding="utf-8")
    for kernel_dir in sorted((REPO / "bench" / "kb_replays" / "candidates").iterdir()):
        shutil.copytree(kernel_dir, user / "replays" / "candidates" / kernel_dir.name)
    build(user / "replays")  # DIR/<kernel>.jsonl for every candidates folder
    saved = steps.done.get("baseline")
    if saved and saved.get("text"):
        (root / "base.yaml").write_text(saved["text"], encoding="utf-8")
    git(user, "init", "-q")
    git(user, "add", "-A")
    git(user, "commit", "-qm", "example_repo with KernelBench problems")
    return user


def plugin_args(args: argparse.Namespace) -> list[str]:
    installed = any(
        "pytest_kernelpro" in e.value for e in importlib.metadata.entry_points(group="pytest11")
    )
    common = [] if installed else ["-p", "pytest_kernelpro.plugin"]
    common += [
        "-p",
        "no:cacheprovider",
        f"--kernelpro-time-budget={args.timing}",
        "--kernelpro-warmup-ms=50",
        "--kernelpro-problems=kb_problems",
        f"--kernelpro-profile-timeout={args.profile_timeout}",
    ]
    if args.device:
        common.append(f"--kernelpro-device={args.device}")
    return common


def run(
    cmd: list[str],
    cwd: Path,
    logfile: Path,
    timeout: float,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(extra_env or {}))
    with open(logfile, "w", encoding="utf-8") as out:
        try:
            proc = subprocess.run(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                timeout=max(1.0, timeout), check=False,
            )  # fmt: skip
            code: Any = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"cmd": " ".join(cmd), "exit": code, "wall_s": round(time.monotonic() - started, 1)}


def _guidance(prompt: str) -> str:
    for head in GUIDANCE_HEADS:
        if head in prompt:
            text = prompt[prompt.index(head) :]
            end = text.find("## Output format")
            return text[:end] if end > 0 else text[:6000]
    return ""


def prompts_of(run_dir: Path) -> list[dict[str, Any]]:
    """Each Programmer prompt: its mode, what it carried, and the guidance section."""
    calls = run_dir / "llm-calls.jsonl"
    out: list[dict[str, Any]] = []
    if not calls.is_file():
        return out
    for line in calls.read_text(encoding="utf-8").splitlines():
        call = json.loads(line)
        if call.get("purpose") != "programmer":
            if call.get("purpose") == "profiling":
                out.append(
                    {
                        "mode": "profiling-agent",
                        "node": call.get("node"),
                        "answered_by": (call.get("response") or {}).get("model"),
                    }
                )
            continue
        request = call.get("request")
        if isinstance(request, str):
            request = json.loads(request)
        messages = (request or {}).get("messages") or []
        user = str(messages[0].get("content", "")) if messages else ""
        guidance = _guidance(user)
        out.append(
            {
                "mode": str(call.get("prompt_id") or "").split(".")[0],
                "node": call.get("node"),
                "prompt_chars": len(user),
                "reference_analysis": "Roofline time" in user,
                "sections": [
                    h
                    for h in (
                        "### SASS summary",
                        "### Timeline summary",
                        "### Findings (by severity)",
                        "### ncu metrics by category",
                        "## Profiling analysis",
                    )
                    if h in user
                ],
                "guidance_chars": len(guidance),
                # Which recorded answer the replay served (a hand-written corpus names the
                # candidate file): the prompt -> candidate mapping.
                "answered_by": (call.get("response") or {}).get("model"),
                # Exactly what the prompt carried (the results file quotes from it).
                "guidance": guidance[:8000],
            }
        )
    return out


def nodes_of(run_dir: Path) -> list[dict[str, Any]]:
    """Every evaluated candidate of the trajectory, with what profiling it found and cost."""
    trajectory = run_dir / "trajectory.jsonl"
    nodes: list[dict[str, Any]] = []
    if not trajectory.is_file():
        return nodes
    for line in trajectory.read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        if data.get("kind") != "node":
            continue
        metrics = data.get("metrics") or {}
        profile = metrics.get("profile") or {}
        nodes.append(
            {
                "id": data.get("id"),
                "parent": data.get("parent"),
                "mode": data.get("mode"),
                "strategy": data.get("strategy"),
                "status": data.get("status"),
                "speedup_vs_reference": data.get("speedup"),
                "reason": (data.get("reason") or "")[:400],
                "build_s": data.get("build_s"),
                "wall_s": data.get("wall_s"),
                "sandbox": (metrics.get("sandbox") or {}).get("mode")
                if isinstance(metrics.get("sandbox"), dict)
                else metrics.get("sandbox"),
                "profile_s": profile.get("profile_s"),
                "profile_collect_s": profile.get("collect_s"),
                "profile_kernels": profile.get("kernels"),
                "ncu_gpu_time_s": profile.get("ncu_gpu_time_s"),
                "sass": profile.get("sass"),
                "sass_kernels": profile.get("sass_kernels"),
                "tools_ran": profile.get("tools_ran"),
                "tools_lacking_inputs": profile.get("tools_lacking_inputs"),
                "timeline": profile.get("timeline"),
                "stage1": (profile.get("stage1") or {}).get("cls"),
                "not_collected": profile.get("not_collected"),
                "profile_error": profile.get("error"),
                "findings": [
                    f"[{f.get('severity')}] {f.get('tool')}: {f.get('title')}"
                    for f in data.get("findings") or []
                ],
            }
        )
    return nodes


def search_group(
    kernels: list[str], user: Path, root: Path, raw: Path, args: argparse.Namespace,
    left_s: float,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:  # fmt: skip
    """One pytest process searches every kernel of the group (the sandbox's CUDA probe and
    the interpreter's start are paid once); (the run, each kernel's entry)."""
    select = " or ".join(KERNELS[k][0] for k in kernels)
    slug = "+".join(re.sub(r"[^A-Za-z0-9_.-]", "_", k) for k in kernels)[:80]
    kb = any(KERNELS[k][1] for k in kernels)
    budget_args = [f"--kernelpro-optimize={args.kb_budget if kb else args.budget}"]
    cmd = [
        sys.executable, "-m", "pytest", *plugin_args(args), *budget_args,
        "--kernelpro-llm=replay:replays", "--kernelpro-feedback=tools", "-k", select,
        f"--kernelpro-save-baseline={root / 'base.yaml'}", f"--junitxml={raw / (slug + '.junit.xml')}",
    ]  # fmt: skip
    step = run(cmd, user, raw / f"{slug}.search.log", left_s)
    report = user / ".kernelpro" / "kernelpro-report.json"
    if report.is_file():
        shutil.copy(report, raw / f"{slug}.report.json")
    found = records(report)
    return step, {k: kernel_entry(k, found.get(k) or {}, step, root, raw) for k in kernels}


def kernel_entry(
    kernel: str, record: dict[str, Any], step: dict[str, Any], root: Path, raw: Path
) -> dict[str, Any]:
    """What the report and the kernel's run folder say about one searched kernel."""
    select, _ = KERNELS[kernel]
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", kernel)
    summary = (record.get("extra") or {}).get("optimize") or {}
    entry: dict[str, Any] = {"kernel": kernel, "select": select, "run": step}
    entry["item"] = {
        "outcome": record.get("outcome"),
        "message": record.get("message"),
        "median_s": ((record.get("timing") or {}).get("stats") or {}).get("median_s"),
        "efficiency": record.get("efficiency"),
        "roofline": {
            k: (record.get("roofline") or {}).get(k)
            for k in ("bound", "roofline_time_s", "flops", "bytes")
        },
    }
    keep = (
        "status", "reason", "why", "evaluations", "stop_reason", "outcomes", "elapsed_s",
        "wall_s", "current", "best", "winner", "best_speedup", "best_speedup_vs_current",
        "strategy", "guidance", "profiles", "per_candidate", "reference_profile_s",
        "confirmation", "patch_errors", "rounds", "baseline", "backend",
    )  # fmt: skip
    entry["summary"] = {k: summary.get(k) for k in keep}
    entry["candidates"] = [
        {
            k: c.get(k)
            for k in (
                "rank",
                "node_id",
                "strategy",
                "status",
                "verdict",
                "speedup_vs_current",
                "speedup_vs_reference",
                "efficiency_after",
                "reason",
            )  # fmt: skip
        }
        for c in summary.get("candidates") or []
    ]
    run_dir = Path(summary["run_dir"]) if summary.get("run_dir") else None
    if run_dir is not None and run_dir.is_dir():
        entry["prompts"] = prompts_of(run_dir)
        entry["nodes"] = nodes_of(run_dir)
        shutil.copytree(run_dir, raw / f"{slug}.run", dirs_exist_ok=True)
    best = summary.get("best_patch")
    if best and Path(best).is_file():
        entry["best_patch_text"] = Path(best).read_text(encoding="utf-8")
    base = root / "base.yaml"
    entry["baseline_text"] = base.read_text(encoding="utf-8") if base.is_file() else None
    entry["optimize_text"] = (record.get("extra") or {}).get("optimize_text")
    # The current kernel's median in the search's interleaved rounds (the re-check's "before"
    # when the item's own timing is not in a report).
    entry["current_median_s"] = (summary.get("ranking") or {}).get("current_median_s")
    return entry


FINISHED = ("improved", "no improvement found")


def finished_in_folder(kernel: str, run_dir: Path, root: Path, raw: Path) -> dict[str, Any] | None:
    """A search that ended (ranked and confirmed: its summary.json says so) although the
    pytest session around it was cut off before writing its report: the kernel's entry from
    its run folder (no item timing or baseline, which only the report holds)."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if summary.get("status") not in FINISHED or summary.get("interrupted"):
        return None
    best = summary.get("best_patch")
    if best and not Path(best).is_file():  # a folder copied off the machine it ran on
        moved = run_dir / "patches" / Path(best).name
        summary["best_patch"] = str(moved) if moved.is_file() else None
    summary["run_dir"] = str(run_dir)
    entry = kernel_entry(kernel, {"extra": {"optimize": summary}}, {}, root, raw)
    entry["from_run_folder"] = True
    entry["baseline_text"] = None
    return entry


def partial(kernel: str, user: Path, raw: Path) -> dict[str, Any]:
    """The run folder of a search that was cut off: its summary so far and its nodes."""
    from pytest_kernelpro.optimize.loop.replay import slug

    folders = sorted((user / ".kernelpro" / "optimize" / slug(kernel)).glob("run-*"))
    if not folders:
        return {"kernel": kernel, "run_dir": None}
    run_dir = folders[-1]
    shutil.copytree(run_dir, raw / f"{slug(kernel)}.partial.run", dirs_exist_ok=True)
    summary = run_dir / "summary.json"
    data = json.loads(summary.read_text(encoding="utf-8")) if summary.is_file() else {}
    best = run_dir / "patches" / "best.patch"
    return {
        "kernel": kernel,
        "run_dir": str(run_dir),
        "files": sorted(p.name for p in run_dir.iterdir()),
        "evaluations": data.get("evaluations"),
        "outcomes": data.get("outcomes"),
        "status": data.get("status"),
        "reason": data.get("reason"),
        "nodes": nodes_of(run_dir),
        "prompts": prompts_of(run_dir),
        # The search's best so far (a single measurement, not re-measured): the re-check can
        # still apply it and measure it against the starting kernel.
        "best_patch_text": best.read_text(encoding="utf-8") if best.is_file() else None,
    }


def recheck(
    user: Path, root: Path, raw: Path, searched: dict[str, dict[str, Any]], args: argparse.Namespace,
    left_s: float,
) -> dict[str, Any]:  # fmt: skip
    """Each best patch alone and all together in fresh clones; the check of the patched
    kernels against the baseline saved before the search; collection after the patch."""
    clone = root / "fresh-clone"
    shutil.rmtree(clone, ignore_errors=True)
    git(root, "clone", "-q", str(user), str(clone))
    base = root / "recheck-base.yaml"
    out: dict[str, Any] = {"kernels": {}}
    patched = []
    for kernel, entry in searched.items():
        text = entry.get("best_patch_text")
        # "interim": the best so far of a search cut off before its final re-measurement.
        info: dict[str, Any] = {"patch": bool(text), "patch_from": entry.get("patch_from")}
        if text:
            slug = re.sub(r"[^A-Za-z0-9_.-]", "_", kernel)
            patch = raw / f"{slug}.best.patch"
            patch.write_text(text, encoding="utf-8")
            alone = root / f"alone-{slug}"
            shutil.rmtree(alone, ignore_errors=True)
            git(root, "clone", "-q", str(user), str(alone))
            check = git(alone, "apply", "--check", str(patch))
            info["applies_alone"] = check.returncode == 0
            applied = git(clone, "apply", str(patch))
            info["applied_in_clone"] = applied.returncode == 0
            info["apply_error"] = (check.stderr + applied.stderr).strip() or None
            if applied.returncode == 0:
                patched.append(kernel)
        out["kernels"][kernel] = info
    if not patched:
        return out
    select = " or ".join(KERNELS[k][0] for k in patched)
    # The baseline from the unpatched code on this machine, in this call, as a user saves it on
    # the base commit: the gate's verdict after the patch is against the starting kernel
    # measured here, whatever the search's own session left.
    unpatched = root / "unpatched-clone"
    shutil.rmtree(unpatched, ignore_errors=True)
    git(root, "clone", "-q", str(user), str(unpatched))
    cmd = [sys.executable, "-m", "pytest", *plugin_args(args),
           f"--kernelpro-save-baseline={base}", "-k", select]  # fmt: skip
    base.unlink(missing_ok=True)
    out["baseline_run"] = run(cmd, unpatched, raw / "recheck-baseline.log", left_s / 2)
    before_report = unpatched / ".kernelpro" / "kernelpro-report.json"
    if before_report.is_file():
        shutil.copy(before_report, raw / "recheck-baseline.report.json")
    befores = records(before_report)
    baseline = [f"--kernelpro-baseline={base}"] if base.is_file() else []
    out["baseline_saved"] = base.is_file()
    cmd = [sys.executable, "-m", "pytest", *plugin_args(args), "--kernelpro-check",
           *baseline, "-k", select]  # fmt: skip
    # The re-check's limit covers all three steps: what the baseline left, then the collection.
    out["run"] = run(cmd, clone, raw / "recheck.log", left_s - out["baseline_run"]["wall_s"] - 10)
    report = clone / ".kernelpro" / "kernelpro-report.json"
    if report.is_file():
        shutil.copy(report, raw / "recheck.report.json")
    rechecked = records(report)
    for kernel in patched:
        record = rechecked.get(kernel) or {}
        gate = record.get("gate") or {}
        prior = befores.get(kernel) or {}
        before = ((prior.get("timing") or {}).get("stats") or {}).get("median_s")
        after = ((record.get("timing") or {}).get("stats") or {}).get("median_s")
        ranked = (searched[kernel].get("candidates") or [{}])[0]
        out["kernels"][kernel].update(
            median_before_s=before,
            efficiency_before=prior.get("efficiency"),
            before_outcome=prior.get("outcome"),
            # The search's final interleaved re-measurement of the same candidate.
            search_speedup_vs_current=ranked.get("speedup_vs_current"),
            search_speedup_vs_reference=ranked.get("speedup_vs_reference"),
        )
        out["kernels"][kernel].update(
            outcome=record.get("outcome"),
            message=record.get("message"),
            language=record.get("language"),
            median_after_s=after,
            efficiency_after=record.get("efficiency"),
            verdict=gate.get("status"),
            change=gate.get("change"),
            gate_message=gate.get("message"),
            speedup_vs_starting_kernel=(before / after) if before and after else None,
        )
    cmd = [sys.executable, "-m", "pytest", *plugin_args(args), "--collect-only", "-q"]
    spent = out["baseline_run"]["wall_s"] + out["run"]["wall_s"]
    collected = run(cmd, clone, raw / "collect.log", max(10.0, left_s - spent))
    text = (raw / "collect.log").read_text(encoding="utf-8", errors="replace")
    found = re.search(r"(\d+) tests? collected", text)
    out["collect_after_patch"] = {**collected, "collected": int(found.group(1)) if found else None}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", type=Path, action="append", default=[])
    parser.add_argument(
        "--salvage", type=Path, action="append", default=[],
        help="a raw folder of a cut-off call: its finished searches' run folders count",
    )  # fmt: skip
    parser.add_argument(
        "--kernels",
        default=";".join(",".join(g) for g in GROUPS),
        help="kernels, comma-separated; groups (one pytest process each) separated by ';'",
    )
    parser.add_argument("--kb", type=Path, default=REPO / ".kb" / "KernelBench")
    parser.add_argument("--budget", default="4")
    parser.add_argument("--kb-budget", default="3", help="for the KernelBench problems")
    parser.add_argument("--timing", default="0.2", help="--kernelpro-time-budget (seconds)")
    parser.add_argument("--profile-timeout", default="60")
    parser.add_argument("--device", default=None, help="cpu: a dry run on a machine without GPU")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/kp-optimize-h200"))
    parser.add_argument(
        "--full-size", action="store_true", help="with --device cpu: the published KB sizes"
    )
    parser.add_argument("--deadline-s", type=float, default=500.0)
    parser.add_argument(
        "--interim-patch", action="append", default=[], metavar="KERNEL=FILE",
        help="the best-so-far patch of a search cut off in an earlier call, for the re-check",
    )  # fmt: skip
    parser.add_argument("--commit", default=None, help="main's commit, where git cannot tell")
    parser.add_argument(
        "--process-limit-s", type=float, default=None,
        help="each search group's pytest process gets this limit of its own, and is started "
        "only while the deadline leaves that much (a started search is never cut to fit the "
        "deadline); default: the deadline less --recheck-cost-s, as before",
    )  # fmt: skip
    parser.add_argument("--kernel-cost-s", type=float, default=90.0)
    parser.add_argument("--recheck-cost-s", type=float, default=45.0)
    parser.add_argument(
        "--recheck-step", default="recheck",
        help="the steps.jsonl name of the re-check (a new name re-checks again after a resume)",
    )  # fmt: skip
    parser.add_argument(
        "--recheck-limit-s", type=float, default=None,
        help="the re-check's own limit (its baseline save gets half); default: what is left",
    )  # fmt: skip
    args = parser.parse_args()
    started = time.monotonic()

    def left() -> float:
        return args.deadline_s - (time.monotonic() - started)

    args.out.mkdir(parents=True, exist_ok=True)
    steps = Steps(args.out / "steps.jsonl", args.resume)
    raw = args.scratch / "raw"
    raw.mkdir(parents=True, exist_ok=True)

    def pack() -> None:
        with tarfile.open(args.out / "raw.tar.gz", "w:gz") as tar:
            tar.add(raw, arcname="raw")

    for folder in args.salvage:
        # Run folders of a cut-off call copied back (DIR/<slug>.partial.run): searches that
        # finished there count as done here.
        for kernel in KERNELS:
            from pytest_kernelpro.optimize.loop.replay import slug as run_slug

            run_dir = folder / f"{run_slug(kernel)}.partial.run"
            if f"search:{kernel}" in steps.done or not run_dir.is_dir():
                continue
            done = finished_in_folder(kernel, run_dir, args.scratch, raw)
            if done is not None:
                done["salvaged_from"] = str(folder)
                steps.add(f"search:{kernel}", done)
                log(f"{kernel}: finished in an earlier call (salvaged from its run folder)")
    commit = args.commit or _commit()
    if "env" not in steps.done:
        steps.add("env", {**environment(args.device), "commit": commit})
        log(f"env: {json.dumps(steps.done['env'])}")
    else:
        # This call's machine and code (a resumed file's "env" is an earlier call's).
        name = "env:" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        steps.add(name, {**environment(args.device, probe=False), "commit": commit})
        log(f"{name}: {json.dumps(steps.done[name])}")
    user = make_user_repo(args.scratch, args.kb, args.device, steps, full_size=args.full_size)
    groups = [
        [k.strip() for k in group.split(",") if k.strip()] for group in args.kernels.split(";")
    ]
    groups = [g for g in groups if g]
    wanted = [k for g in groups for k in g]
    unknown = [k for k in wanted if k not in KERNELS]
    if unknown:
        raise SystemExit(f"unknown kernels {unknown}; known: {list(KERNELS)}")
    for group in groups:
        todo = [k for k in group if f"search:{k}" not in steps.done]
        for kernel in group:
            if kernel not in todo:
                log(f"{kernel}: searched in an earlier call, skipped")
        if not todo:
            continue
        if args.process_limit_s is not None:
            limit = args.process_limit_s
            if left() < limit:
                log(f"{todo}: {left():.0f} s left, under the process limit {limit:.0f} s; not "
                    "started (the next call resumes here)")  # fmt: skip
                break
        else:
            cost = args.kernel_cost_s * len(todo)
            if left() < min(cost, args.kernel_cost_s) + args.recheck_cost_s:
                log(f"{todo}: {left():.0f} s left, not started (the next call resumes here)")
                break
            limit = left() - args.recheck_cost_s
        log(f"{todo}: search in one pytest process (limit {limit:.0f} s)")
        step, entries = search_group(todo, user, args.scratch, raw, args, limit)
        for kernel, entry in entries.items():
            if step["exit"] == "timeout" or not entry["summary"].get("status"):
                from pytest_kernelpro.optimize.loop.replay import slug as run_slug

                folders = sorted(
                    (user / ".kernelpro" / "optimize" / run_slug(kernel)).glob("run-*")
                )
                done = (
                    finished_in_folder(kernel, folders[-1], args.scratch, raw) if folders else None
                )
                if done is not None:
                    done["run"] = step
                    log(f"{kernel}: finished (its run folder), the session around it was cut off")
                    steps.add(f"search:{kernel}", done)
                    continue
                # Cut off (or never reached): what its run folder held by then, not a
                # finished step; the next call searches it again.
                log(f"{kernel}: not finished in this call ({step['exit']}, {step['wall_s']} s)")
                steps.add(f"partial:{kernel}", partial(kernel, user, raw))
                continue
            steps.add(f"search:{kernel}", entry)
            if entry.get("baseline_text"):
                steps.add("baseline", {"text": entry["baseline_text"]})
            s = entry["summary"]
            log(
                f"{kernel}: {s.get('status')}; best {s.get('best_speedup_vs_current')} vs "
                f"current, {s.get('best_speedup')} vs ref; wall {s.get('wall_s')}; "
                f"confirmation {(s.get('confirmation') or {}).get('status')}"
            )
        pack()
        if step["exit"] == "timeout" and args.process_limit_s is None:
            break  # the shared deadline is spent; with limits of their own the next may fit
    searched = {k: steps.done[f"search:{k}"] for k in wanted if f"search:{k}" in steps.done}
    for spec in args.interim_patch:
        # Re-checked with the others, not searched again (it need not be in --kernels).
        kernel, _, path = spec.partition("=")
        if kernel not in KERNELS or not Path(path).is_file():
            raise SystemExit(f"--interim-patch {spec!r}: want KERNEL=FILE, KERNEL one of "
                             f"{list(KERNELS)} and FILE an existing patch")  # fmt: skip
        if kernel not in searched:
            searched[kernel] = {"best_patch_text": Path(path).read_text(encoding="utf-8")}
    for kernel in wanted:
        cut = steps.done.get(f"partial:{kernel}") or {}
        if kernel not in searched and cut.get("best_patch_text"):
            searched[kernel] = cut
    for entry in searched.values():
        entry.setdefault("patch_from", "interim" if "summary" not in entry else "final ranking")
    if all(k in searched for k in wanted) and args.recheck_step not in steps.done:
        available = left()
        limit = args.recheck_limit_s if args.recheck_limit_s is not None else available
        if available >= limit and limit > 10:
            log(f"{args.recheck_step}: patches in a fresh clone (limit {limit:.0f} s)")
            result = recheck(user, args.scratch, raw, searched, args, limit)
            steps.add(args.recheck_step, result)
            log(f"{args.recheck_step}: {json.dumps(result, default=str)[:3000]}")
        else:
            log(f"{args.recheck_step}: {left():.0f} s left, under its limit; not started")
    pack()
    log(f"done in {time.monotonic() - started:.0f} s; steps: {sorted(steps.done)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
