"""Seeded synthetic benchmark: MCTS vs greedy search under equal budgets.

No LLM and no GPU: a synthetic generator plays the Programmer Agent over a hidden
landscape of *approaches* (basins). Each candidate's "code" is a JSON blob of its hidden
state; a synthetic evaluator turns it into an `Evaluation`. Both searches get the same
landscape, the same generator seed and the same number of evaluations.

Landscape families (15 tasks each by default, parameters drawn per task from the seed):

- trap: a common, easy approach whose ceiling is low (1.3-2.1x) and a rarer, harder one
  that starts slower but reaches 5-20x. Refining the first correct seed is a trap.
- unimodal: one approach, steady refinement towards a 3-8x ceiling (depth pays).
- failure-heavy: seeds are correct 8-15% of the time, repairs 15-25%; ceilings 2-6x.
- chain: one approach whose next optimization step first makes the kernel slower (0.7x,
  0.8x of the start) before it pays off (3x, 5x): a multi-step chain through a dip.

Rules common to all: a refinement breaks the kernel with probability `p_break` (a failed
child that remembers what it tried; a repair reveals it with probability `p_fix`); a fresh
seed lands in an approach with its prior probability.

Score of one search: the speedup one would ship, max(1, best correct speedup) (the
reference stays when nothing correct beats it). Reported: geometric-mean ratio
MCTS/greedy over tasks, win/tie/loss (tie: within 1%), per family, and tasks with no
correct solution.

    python bench/search_sim.py --out bench/results/search-sim.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kernelpro.optimize.search.base import Candidate, Evaluation  # noqa: E402
from pytest_kernelpro.optimize.search.greedy import GreedySearch  # noqa: E402
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig  # noqa: E402

FAIL_KINDS = ("build_error", "run_error", "wrong", "timeout")
FAMILIES = ("trap", "unimodal", "failure-heavy", "chain")


@dataclass(frozen=True)
class Basin:
    """One approach to the kernel."""

    prior: float  # probability that a fresh seed takes this approach
    p_ok: float  # probability that a seed in this approach is correct
    p_fix: float  # probability that a repair of a failed candidate works
    p_break: float  # probability that a refinement breaks the kernel
    start: float  # log-speedup of the first correct solution
    ceiling: float  # log-speedup the approach converges to
    rate: float = 0.5  # fraction of the remaining gap a refinement closes (times U(0, 1))
    # For "chain" landscapes: log-speedups of successive stages (refinement moves one
    # stage forward with p_advance, else tweaks within the stage).
    stages: tuple[float, ...] = ()
    p_advance: float = 0.5


@dataclass(frozen=True)
class Task:
    family: str
    index: int
    basins: tuple[Basin, ...]


def make_task(family: str, index: int, rng: random.Random) -> Task:
    """Draw one task of `family` (parameters fixed before any result was looked at)."""
    u = rng.uniform
    if family == "trap":
        easy_start = math.log(u(1.1, 1.4))
        basins = (
            Basin(0.7, 0.7, 0.5, 0.25, easy_start, easy_start + math.log(u(1.2, 1.5))),
            Basin(0.3, 0.4, 0.3, 0.3, math.log(u(0.6, 1.0)), math.log(u(5.0, 20.0))),
        )
    elif family == "unimodal":
        basins = (
            Basin(1.0, 0.7, 0.5, 0.25, math.log(u(0.8, 1.2)), math.log(u(3.0, 8.0)), rate=0.35),
        )
    elif family == "failure-heavy":
        basins = tuple(
            Basin(
                0.5,
                u(0.08, 0.15),
                u(0.15, 0.25),
                0.35,
                math.log(u(0.6, 1.2)),
                math.log(u(2.0, 6.0)),
            )
            for _ in range(2)
        )
    elif family == "chain":
        start = u(1.2, 1.6)
        stages = tuple(math.log(start * m) for m in (1.0, 0.7, 0.8, 3.0, 5.0))
        basins = (Basin(1.0, 0.7, 0.5, 0.2, stages[0], stages[-1], stages=stages),)
    else:
        raise ValueError(f"unknown family {family!r}")
    return Task(family, index, basins)


class SyntheticGenerator:
    """Plays the Programmer Agent on a task's hidden landscape."""

    def __init__(self, task: Task, seed: int) -> None:
        self.task = task
        self.rng = random.Random(seed)
        self.count = 0

    def _candidate(self, state: dict, strategy: str) -> Candidate:
        self.count += 1
        state = {**state, "serial": self.count}
        return Candidate(code=json.dumps(state, sort_keys=True), strategy=strategy, tokens=1000)

    def _outcome(self, basin: int, intended: float, stage: int, p_ok: float) -> dict:
        rng = self.rng
        if rng.random() < p_ok:
            return {"basin": basin, "x": intended, "stage": stage, "ok": True}
        return {
            "basin": basin,
            "x": intended,
            "stage": stage,
            "ok": False,
            "fail": rng.choice(FAIL_KINDS),
        }

    def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
        rng = self.rng
        out = []
        for _ in range(max_candidates):
            if mode == "initial":
                weights = [b.prior for b in self.task.basins]
                b = rng.choices(range(len(self.task.basins)), weights=weights)[0]
                basin = self.task.basins[b]
                x = basin.start + rng.gauss(0.0, 0.05)
                out.append(self._candidate(self._outcome(b, x, 0, basin.p_ok), "seed"))
                continue
            state = json.loads(parent.code)
            basin = self.task.basins[state["basin"]]
            if mode == "debug":
                out.append(
                    self._candidate(
                        self._outcome(state["basin"], state["x"], state["stage"], basin.p_fix),
                        "repair",
                    )
                )
                continue
            # optimize
            stage, x = state["stage"], state["x"]
            if basin.stages:
                if stage + 1 < len(basin.stages) and rng.random() < basin.p_advance:
                    stage += 1
                    x = basin.stages[stage] + rng.gauss(0.0, 0.05)
                else:
                    # A tweak within the stage: noise around the stage's value, not a random
                    # walk (which a max-taking greedy would ratchet up without bound).
                    x = basin.stages[stage] + rng.gauss(0.0, 0.05)
            else:
                x = x + basin.rate * (basin.ceiling - x) * rng.random() + rng.gauss(0.0, 0.08)
                x = min(x, basin.ceiling + 0.05)
            out.append(
                self._candidate(
                    self._outcome(state["basin"], x, stage, 1.0 - basin.p_break), "refine"
                )
            )
        return out


class SyntheticEvaluator:
    """Reads the hidden state back: correct candidates get speedup exp(x)."""

    def evaluate(self, candidate: Candidate) -> Evaluation:
        state = json.loads(candidate.code)
        if state["ok"]:
            return Evaluation(status="correct", speedup=math.exp(state["x"]))
        return Evaluation(status=state["fail"], reason="synthetic failure")


def run_one(task: Task, search: object, budget: int, seed: int) -> float | None:
    result = search.run(SyntheticGenerator(task, seed), SyntheticEvaluator(), str(budget))
    return result.best_speedup


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def compare(tasks: list[Task], budget: int, seed: int, c_uct: float = math.sqrt(2.0)) -> dict:
    """Run MCTS and greedy on every task with the same generator seed and budget."""
    rows = []
    for task in tasks:
        # crc32, not hash(): str hashes change between interpreter runs.
        run_seed = seed * 100_003 + zlib.crc32(f"{task.family}/{task.index}".encode()) % 100_000
        mcts = run_one(task, MCTS(MCTSConfig(c_uct=c_uct), seed=run_seed), budget, run_seed)
        greedy = run_one(task, GreedySearch(seed=run_seed), budget, run_seed)
        rows.append(
            {
                "family": task.family,
                "task": task.index,
                "mcts_best": mcts,
                "greedy_best": greedy,
                "mcts": max(1.0, mcts or 1.0),
                "greedy": max(1.0, greedy or 1.0),
            }
        )
    return {"rows": rows, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    def block(sub: list[dict]) -> dict:
        ratios = [r["mcts"] / r["greedy"] for r in sub]
        tie = math.log(1.01)
        return {
            "tasks": len(sub),
            "geomean_mcts": geomean([r["mcts"] for r in sub]),
            "geomean_greedy": geomean([r["greedy"] for r in sub]),
            "geomean_ratio": geomean(ratios),
            "wins": sum(math.log(x) > tie for x in ratios),
            "ties": sum(abs(math.log(x)) <= tie for x in ratios),
            "losses": sum(math.log(x) < -tie for x in ratios),
            "no_correct_mcts": sum(r["mcts_best"] is None for r in sub),
            "no_correct_greedy": sum(r["greedy_best"] is None for r in sub),
        }

    families = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    return {
        "all": block(rows),
        **{f: block([r for r in rows if r["family"] == f]) for f in families},
    }


def markdown(summary: dict) -> str:
    lines = [
        "| landscape | tasks | geomean MCTS | geomean greedy | ratio MCTS/greedy | W/T/L | "
        "no correct (MCTS/greedy) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['tasks']} | {s['geomean_mcts']:.2f}x | {s['geomean_greedy']:.2f}x | "
            f"{s['geomean_ratio']:.3f} ({(s['geomean_ratio'] - 1) * 100:+.1f}%) | "
            f"{s['wins']}/{s['ties']}/{s['losses']} | "
            f"{s['no_correct_mcts']}/{s['no_correct_greedy']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks-per-family", type=int, default=15)
    parser.add_argument(
        "--budgets",
        default="15,30,60,120,250",
        help="Comma-separated evaluation budgets; each is one comparison",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat-seeds",
        type=int,
        default=4,
        help="Extra master seeds (new tasks, new generator draws) per budget",
    )
    parser.add_argument(
        "--c-uct-sweep",
        default="0.25,0.5,1.0",
        help="Other exploration constants to report (sensitivity; '' to skip)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    sweep = [float(c) for c in args.c_uct_sweep.split(",") if c.strip()]
    start = time.perf_counter()

    def tasks_for(seed: int) -> list[Task]:
        rng = random.Random(seed)
        return [make_task(f, i, rng) for f in FAMILIES for i in range(args.tasks_per_family)]

    tasks = tasks_for(args.seed)
    results: dict = {"budgets": {}, "robustness": {}, "c_uct_sweep": {}}
    for budget in budgets:
        results["budgets"][budget] = compare(tasks, budget, args.seed)
        results["robustness"][budget] = [
            {
                "seed": args.seed + k,
                **compare(tasks_for(args.seed + k), budget, args.seed + k)["summary"]["all"],
            }
            for k in range(1, args.repeat_seeds + 1)
        ]
        results["c_uct_sweep"][budget] = {
            c: compare(tasks, budget, args.seed, c_uct=c)["summary"] for c in sweep
        }
    elapsed = time.perf_counter() - start

    print(
        f"search_sim: {len(tasks)} tasks ({args.tasks_per_family} per family), "
        f"budgets {budgets} evaluations, seed {args.seed}, C_uct = sqrt(2), {elapsed:.1f}s"
    )
    for budget in budgets:
        print(f"\n### Budget {budget} evaluations (seed {args.seed})\n")
        print(markdown(results["budgets"][budget]["summary"]))
    if args.repeat_seeds:
        print("\n### Other master seeds: ratio MCTS/greedy over all tasks (W/T/L)\n")
        print(
            "| budget | "
            + " | ".join(f"seed {args.seed + k}" for k in range(1, args.repeat_seeds + 1))
            + " |"
        )
        print("|---:|" + "---:|" * args.repeat_seeds)
        for budget in budgets:
            cells = [
                f"{r['geomean_ratio']:.3f} ({r['wins']}/{r['ties']}/{r['losses']})"
                for r in results["robustness"][budget]
            ]
            print(f"| {budget} | " + " | ".join(cells) + " |")
    if sweep:
        print(f"\n### Sensitivity to C_uct (seed {args.seed}): ratio MCTS/greedy\n")
        print("| budget | C_uct | all | " + " | ".join(FAMILIES) + " |")
        print("|---:|---:|---:|" + "---:|" * len(FAMILIES))
        for budget in budgets:
            rows = [(math.sqrt(2.0), results["budgets"][budget]["summary"])]
            rows += list(results["c_uct_sweep"][budget].items())
            for c, summ in sorted(rows):
                fam = " | ".join(f"{summ[f]['geomean_ratio']:.3f}" for f in FAMILIES)
                print(f"| {budget} | {c:.2f} | {summ['all']['geomean_ratio']:.3f} | {fam} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "config": {k: str(v) for k, v in vars(args).items()},
                    "example_tasks": {
                        f: asdict(next(t for t in tasks if t.family == f)) for f in FAMILIES
                    },
                    **results,
                    "elapsed_s": elapsed,
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
