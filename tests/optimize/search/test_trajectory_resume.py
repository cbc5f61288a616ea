"""Trajectory: written as the search goes, loaded (truncated tail), resumed, replayed, shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trajectory_replay import ReplayEvaluator, ReplayGenerator, replay

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.optimize.search.greedy import GreedySearch
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.mcts import MCTS, MCTSConfig
from pytest_kernelpro.optimize.search.restore import render_tree, restore_search
from pytest_kernelpro.optimize.search.show import show_main
from pytest_kernelpro.optimize.search.trajectory import load_trajectory

SPECS = [
    "wrong",
    "1.2",
    "build_error",
    "1.5",
    "run_error",
    "wrong",
    "timeout",
    "2.5",
    "0.9",
    "cheat",
    "1.7",
    "build_error",
] * 3
NODE_FIELDS = {
    "id",
    "parent",
    "mode",
    "prompt_id",
    "strategy",
    "code",
    "status",
    "reason",
    "reward",
    "speedup",
    "build_log",
    "logs",
    "correctness",
    "timing",
    "metrics",
    "findings",
    "tokens",
    "cost_usd",
    "wall_s",
    "elapsed_s",
}


def outcome(spec: str) -> Evaluation:
    try:
        speedup = float(spec)
    except ValueError:
        return Evaluation(status=spec, reason=f"scripted {spec}", build_log=f"log of {spec}")
    return Evaluation(
        status="correct",
        speedup=speedup,
        timing={"candidate": {"median_s": 1e-3}},
        correctness={"trials": 3},
        metrics={"device": "cpu"},
        findings=[{"severity": "low", "title": "t"}],
    )


class CodeEvaluator:
    def __init__(self, on_evaluate=None) -> None:  # noqa: ANN001
        self.on_evaluate = on_evaluate

    def evaluate(self, candidate: Candidate) -> Evaluation:
        if self.on_evaluate:
            self.on_evaluate()
        return outcome(candidate.code.split("#")[0])


class Scripted:
    def __init__(self, specs: list[str], start: int = 0) -> None:
        self.specs = list(specs)
        self.count = start

    def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
        out = []
        for _ in range(max_candidates):
            if self.specs:
                self.count += 1
                out.append(
                    Candidate(
                        code=f"{self.specs.pop(0)}#{self.count}",
                        strategy=f"{mode} step",
                        prompt_id=f"{mode}-v1",
                        tokens=100,
                        cost_usd=0.01,
                    )
                )
        return out


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_node_is_written_as_the_search_goes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    seen: list[int] = []
    evaluator = CodeEvaluator(on_evaluate=lambda: seen.append(len(lines(path)) - 1))
    result = MCTS(seed=2).run(
        Scripted(SPECS), evaluator, "10", trajectory=path, meta={"problem": "softmax"}
    )
    assert seen == list(range(10))  # before each evaluation, all earlier nodes are on disk
    records = lines(path)
    header, nodes = records[0], records[1:]
    assert header["kind"] == "header"
    assert header["algorithm"] == "mcts"
    assert header["config"]["c_uct"] == pytest.approx(2**0.5)
    assert header["reward"] == {"failure": -3.0, "wrong": -2.0, "floor": -1.9}
    assert header["budget"]["max_evaluations"] == 10
    assert header["meta"] == {"problem": "softmax"}
    assert len(nodes) == 10 == result.evaluations
    for record, node in zip(nodes, result.nodes, strict=True):
        assert NODE_FIELDS <= set(record)
        assert record["id"] == node.id
        assert record["parent"] == node.parent.id
        assert record["reward"] == node.reward
        assert record["code"] == node.candidate.code
        assert record["prompt_id"] == f"{record['mode']}-v1"
    failed = next(r for r in nodes if r["status"] == "build_error")
    assert failed["build_log"] == "log of build_error"


def test_existing_trajectory_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    MCTS().run(Scripted(SPECS), CodeEvaluator(), "2", trajectory=path)
    with pytest.raises(KernelproError, match="already exists; pass resume=True"):
        MCTS().run(Scripted(SPECS), CodeEvaluator(), "2", trajectory=path)
    with pytest.raises(KernelproError, match="written by 'mcts', not 'greedy'"):
        GreedySearch().run(Scripted(SPECS), CodeEvaluator(), "4", trajectory=path, resume=True)


def test_truncated_last_line_is_dropped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    MCTS().run(Scripted(SPECS), CodeEvaluator(), "5", trajectory=path)
    with path.open("a") as handle:
        handle.write('{"kind":"node","id":6,"parent":0,"co')  # crash mid-write
    with pytest.warns(KernelproWarning, match="last line .* is incomplete"):
        loaded = load_trajectory(path)
    assert loaded.truncated
    assert len(loaded.nodes) == 5


def test_a_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    MCTS().run(Scripted(SPECS), CodeEvaluator(), "3", trajectory=path)
    text = path.read_text().splitlines()
    text[2] = text[2][:20]
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(KernelproError, match="line 3 is corrupt"):
        load_trajectory(path)


def test_not_a_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"kind": "node"}\n')
    with pytest.raises(KernelproError, match="not a kernelpro trajectory"):
        load_trajectory(path)


def test_resume_after_a_crash_continues_the_same_search(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    first = MCTS(seed=4).run(Scripted(SPECS), CodeEvaluator(), "8", trajectory=path)
    with path.open("a") as handle:
        handle.write('{"kind":"node","id":9')  # the process died here
    with pytest.warns(KernelproWarning, match="incomplete"):
        resumed = MCTS(seed=4).run(
            Scripted(SPECS[8:], start=8), CodeEvaluator(), "12", trajectory=path, resume=True
        )
    assert resumed.evaluations == 12  # 8 recorded + 4 new: the budget counts the whole search
    assert [n.id for n in resumed.nodes] == list(range(1, 13))
    assert resumed.usd == pytest.approx(0.12)
    # The rebuilt part of the tree has the statistics of the first session.
    assert [(n.parent.id, n.reward) for n in resumed.nodes[:8]] == [
        (n.parent.id, n.reward) for n in first.nodes
    ]
    records = lines(path)  # every line parses: the truncated tail was cut off
    assert [r["id"] for r in records[1:]] == list(range(1, 13))
    rebuilt = restore_search(path)
    assert rebuilt.tree.root.visits == 12
    assert rebuilt.tree.root.reward_sum == pytest.approx(sum(n.reward for n in resumed.nodes))


def test_resume_restores_dead_ends(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # A narrow ROOT keeps the search on one seed long enough for its repairs to fail.
    live = MCTS(MCTSConfig(c_pw_root=0.5)).run(
        Scripted(["wrong"] * 20), CodeEvaluator(), "20", trajectory=path
    )
    search = restore_search(path)
    flags = [(n.terminal, n.exhausted) for n in search.tree.evaluated()]
    assert flags == [(n.terminal, n.exhausted) for n in live.nodes]
    assert any(terminal for terminal, _ in flags)


def test_resume_of_a_missing_file_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    result = GreedySearch().run(Scripted(SPECS), CodeEvaluator(), "3", trajectory=path, resume=True)
    assert result.evaluations == 3
    assert lines(path)[0]["algorithm"] == "greedy"


def test_replay_reproduces_the_search(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    original = MCTS(seed=9).run(Scripted(SPECS), CodeEvaluator(), "15", trajectory=path)
    recorded = list(replay(path))
    assert [r.candidate.code for r in recorded] == [n.candidate.code for n in original.nodes]
    assert recorded[0].evaluation.status == original.nodes[0].evaluation.status
    again = MCTS(seed=9).run(ReplayGenerator(path), ReplayEvaluator(path), "15")
    assert [(n.id, n.parent.id, n.candidate.code) for n in again.nodes] == [
        (n.id, n.parent.id, n.candidate.code) for n in original.nodes
    ]


def test_render_tree_shows_every_node_and_the_best_path(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    result = MCTS(seed=1).run(Scripted(SPECS), CodeEvaluator(), "12", trajectory=path)
    text = render_tree(path)
    assert text.startswith("ROOT  mcts  12 nodes")
    for node in result.nodes:
        assert f"#{node.id} " in text
    best = result.best
    assert best is not None
    path_ids = " -> ".join(f"#{n.id}" for n in best.path()[1:])
    best_line = text.strip().splitlines()[-1]
    assert best_line.startswith("Best path: ROOT -> ")
    assert [tok for tok in best_line.split() if tok.startswith("#")][:-1] == path_ids.split(" -> ")
    assert f"(best #{best.id}: {best.speedup:.2f}x)" in best_line
    assert "build_error" in text
    assert "scripted build_error" in text
    assert "speedups vs the reference" in text.splitlines()[0]


def test_render_tree_says_speedups_against_the_current_kernel_too(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    result = MCTS(seed=1).run(
        Scripted(SPECS), CodeEvaluator(), "6", trajectory=path, meta={"current_speedup": 2.0}
    )
    text = render_tree(path)
    assert text.splitlines()[0].endswith("speedups vs the reference; the current kernel 2.00x")
    best = result.best
    assert best is not None
    assert best.speedup is not None
    assert f"(best #{best.id}: {best.speedup:.2f}x ({best.speedup / 2:.2f}x current))" in text


def test_show_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    MCTS().run(Scripted(SPECS), CodeEvaluator(), "4", trajectory=path)
    assert show_main([str(path)]) == 0
    assert "Best path:" in capsys.readouterr().out
    assert show_main([str(path), "--code", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# node 2 (parent")
    assert "#2" in out
    assert show_main([str(path), "--code", "99"]) == 2
    assert "Node 99 is not in" in capsys.readouterr().err
    assert show_main([str(tmp_path / "missing.jsonl")]) == 2
    assert "Cannot read trajectory" in capsys.readouterr().err


def test_show_renders_guidance_per_node_and_accepts_run_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel_dir = tmp_path / "optimize" / "k"
    run = kernel_dir / "run-20261201-000000"
    run.mkdir(parents=True)
    MCTS().run(Scripted(SPECS), CodeEvaluator(), "4", trajectory=run / "trajectory.jsonl")
    (kernel_dir / "LATEST").write_text(run.name + "\n")
    for where in (run, kernel_dir):
        assert show_main([str(where)]) == 0
        out = capsys.readouterr().out
        assert "guidance: [low] t" in out  # the correct nodes' findings
    assert show_main([str(run), "--no-guidance"]) == 0
    assert "guidance:" not in capsys.readouterr().out
    assert show_main([str(tmp_path)]) == 2
    assert "holds no trajectory.jsonl" in capsys.readouterr().err
