"""The session's texts byte for byte: the terminal summary with its notes and trailer lines,
the `kernelpro compare` table, and the roofline plot's labels, against golden files in
tests/data/render/ (written from the code before these texts moved into gate/'s text modules:
format.py (terminal_row), plot.py's labels, offline_gate.py's compare_row, render_session.py; a change to them
shows up here as a diff).

`python tests/gate/test_render_goldens.py` rewrites the golden files from the current code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
from gate_factories import make_record

from pytest_kernelpro.gate.baseline import Baseline, unmatched
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.render_session import session_conditions
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import VerdictPart, part_of
from pytest_kernelpro.review.offline_gate import gate_records, render_compare_table
from pytest_kernelpro.review.plot import roofline_figure
from pytest_kernelpro.run.session import terminal_summary

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "render"
BW = 4257636247457.1606
PEAK_NAME = "FP32 CUDA core (measured 50.9 TFLOP/s)"
BUSY = {
    "cores": 2,
    "cpus": 2,
    "threads": 2,
    "others_cores": 1.3,
    "loadavg_1m": 3.8,
    "runnable_threads": 3,
    "wall_s": 1.0,
    "oversubscribed": True,
}


class Recorder:
    """A terminal reporter that keeps what it was asked to write, markup included."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._tw = SimpleNamespace(fullwidth=100, hasmarkup=False)

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(f"[sep {sep}] {title}")

    def write_line(self, line: str, **markup: Any) -> None:
        flags = ",".join(sorted(k for k, v in markup.items() if v))
        self.lines.append(f"[{flags}] {line}" if flags else line)


class FakeConfig:
    """What the terminal summary reads of pytest's config: the verbosity and, for the
    nothing-checked rule, unset kernelpro options."""

    def __init__(self, verbose: int) -> None:
        self.option = SimpleNamespace(verbose=verbose)

    def getoption(self, name: str, default: Any = None) -> Any:
        return default

    def getini(self, name: str) -> Any:
        return None


def _session(verbose: int = 0) -> SimpleNamespace:
    cpu = make_record("layernorm[cpu]", median_s=2e-3, device="cpu", seed=11)
    cpu.timing = msgspec.structs.replace(
        cpu.timing,
        cpu_load=BUSY,
        budget_note="took 3.1 s of a 2 s budget",
        flushed_l2=True,
        flush_bytes=34078720,
        budget={"cpu_flush": "auto"},
    )
    gpu = make_record("softmax[8192x4096]", seed=12)
    gpu.extra = {"profile_skipped": True}
    bad = make_record("broken[1]", outcome="failed", timed=False, roofline_time_s=None)
    bad.extra = {"invalid_marker": True, "correctness_only": True}
    records = [cpu, gpu, bad]
    baseline = Baseline(
        path="kernelpro-baseline.yaml",
        device="",
        commit=None,
        created="",
        tool="",
        entries={
            "test_kernels.py::softmax[8192x4096]": entry_from_record(gpu),
            "test_kernels.py::gone[1]": entry_from_record(make_record("gone[1]")),
        },
    )
    settings = SimpleNamespace(
        check=True,
        allow_incomparable=False,
        correctness_only=True,
        save_baseline=Path("kernelpro-baseline.yaml"),
        profile=True,
        sort="name",
        json_path=Path(".kernelpro/kernelpro-report.json"),
        records_path=Path(".kernelpro/kernelpro-report.jsonl"),
    )
    notes = ["a note another part of the session added"]
    return SimpleNamespace(
        settings=settings,
        config=FakeConfig(verbose),
        records=records,
        notes=notes,
        conditions=lambda: session_conditions(settings, records, notes),
        coverage=lambda: unmatched(baseline, records),
        _baseline=baseline,
        history_path=Path(".kernelpro/history/20261201T170000Z-abc1234-vm.json"),
        records_path=settings.records_path,  # read once at configure (`KernelproSession`)
        json_written=True,
        baseline_written=False,  # correctness-only: no baseline is saved
        write_failures=[],
        records_log=object(),  # started: its line is printed
        missing_records=lambda: ["test_kernels.py::lost[1]"],
    )


def terminal_text(verbose: int = 0) -> str:
    reporter = Recorder()
    terminal_summary(_session(verbose), reporter)  # type: ignore[arg-type]
    return "\n".join(reporter.lines) + "\n"


def terminal_text_verbose() -> str:
    return terminal_text(verbose=1)


def compare_text() -> str:
    base_records = [make_record("a[1]", seed=1), make_record("b[1]", seed=2)]
    head = [make_record("a[1]", seed=3), make_record("b[1]", median_s=60e-6, seed=4)]
    head.append(make_record("c[1]", seed=5))
    entries = {r.nodeid: entry_from_record(r) for r in base_records}
    base = Baseline(path="base.json", device="", commit=None, created="", tool="", entries=entries)
    gated = gate_records(base, head)
    plain = render_compare_table(base, gated, width=100, color=False)
    colored = render_compare_table(base, gated, width=100, color=True)
    return plain + "---- color ----\n" + colored


def _h200(name: str, *, median_s: float, flops: float, min_bytes: float) -> Any:
    rec = make_record(name, median_s=median_s, flops=flops, min_bytes=min_bytes, seed=3)
    return msgspec.structs.replace(
        rec,
        roofline=msgspec.structs.replace(
            rec.roofline, peak_flops=50931005505996.53, bandwidth_Bps=BW, peak_name=PEAK_NAME
        ),
    )


def plot_text() -> str:
    add = _h200("triton_add", median_s=190e-6, flops=6.7e7, min_bytes=8.05e8)
    reg = _h200("softmax[1]", median_s=80e-6, flops=1.7e8, min_bytes=2.7e8)
    reg.gate = part_of(
        VerdictPart, decide_verdict(reg, entry_from_record(make_record("softmax[1]")))
    )
    untimed = make_record("not_timed[1]", timed=False)
    fig = roofline_figure([add, reg, untimed])
    (ax,) = fig.axes
    lines = [
        f"title: {ax.get_title()}",
        f"x: {ax.get_xlabel()}",
        f"y: {ax.get_ylabel()}",
        *(f"legend: {t.get_text()}" for t in ax.get_legend().get_texts()),
        *(f"point: {t.get_text()}" for t in sorted(ax.texts, key=lambda t: t.get_text())),
        *(f"figure: {t.get_text()}" for t in fig.texts),
    ]
    return "\n".join(lines) + "\n"


TEXTS = {
    "terminal_summary.txt": terminal_text,
    "terminal_summary_verbose.txt": terminal_text_verbose,
    "compare_table.txt": compare_text,
    "plot_labels.txt": plot_text,
}


def test_the_terminal_summary_with_its_notes_is_unchanged() -> None:
    assert terminal_text() == (GOLDEN / "terminal_summary.txt").read_text(encoding="utf-8")


def test_the_verbose_terminal_summary_is_unchanged() -> None:
    assert terminal_text_verbose() == (GOLDEN / "terminal_summary_verbose.txt").read_text(
        encoding="utf-8"
    )


def test_every_note_line_is_short_without_verbose() -> None:
    """Quiet by default: each line under the table (after the "kernelpro: " it carries) is
    under 100 characters; under -v the same conditions are said in full."""
    quiet = terminal_text().splitlines()
    notes = [line for line in quiet if line.startswith("kernelpro: ")]
    assert notes
    assert [line for line in notes if len(line) >= 100] == []
    assert "took 3.1 s of a 2 s budget" in terminal_text_verbose()
    assert "took 3.1 s" not in "\n".join(quiet)


def test_the_compare_table_is_unchanged() -> None:
    assert compare_text() == (GOLDEN / "compare_table.txt").read_text(encoding="utf-8")


def test_the_plot_labels_are_unchanged() -> None:
    assert plot_text() == (GOLDEN / "plot_labels.txt").read_text(encoding="utf-8")


if __name__ == "__main__":  # rewrite the goldens from the current code
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, make in TEXTS.items():
        (GOLDEN / name).write_text(make(), encoding="utf-8")
        sys.stdout.write(f"wrote {GOLDEN / name}\n")
