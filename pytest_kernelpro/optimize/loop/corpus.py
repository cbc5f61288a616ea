"""A replay corpus written by hand: candidate sources in, recordings out.

    DIR/candidates/<kernel>/NN_name.py     one candidate each (its docstring starts "Strategy:")
    DIR/candidates/<kernel>/profiling.json the Profiling Agent's replies (optional): a list of
                                           ProfileAnalysis objects (bottleneck, severity,
                                           summary, recommendations)
    DIR/<kernel>.jsonl                     the recording `--kernelpro-llm=replay:DIR` serves

Each candidate becomes one Programmer reply ("### Strategy: ..." and the module in a python
block), in file-name order, which is the order the replay serves them in. With
`--kernelpro-feedback=tools` the Profiling Agent asks the model once per profiled candidate;
its replies are served in the order of profiling.json (the replay serves each purpose in its
own order), so a corpus for that mode needs one per correct candidate.

    python -m pytest_kernelpro.optimize.loop.corpus DIR      # rewrite DIR/<kernel>.jsonl
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

from pytest_kernelpro.optimize.loop.replay import recording_record


def strategy_of(source: str, where: Path) -> str:
    doc = ast.get_docstring(ast.parse(source)) or ""
    if not doc.startswith("Strategy:"):
        raise ValueError(f"{where}: the docstring must start with 'Strategy:'")
    return " ".join(doc.removeprefix("Strategy:").split())


def recording_lines(kernel_dir: Path) -> list[dict[str, Any]]:
    """The recorded Programmer replies for the candidates in `kernel_dir`."""
    lines = []
    for path in sorted(kernel_dir.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        reply = f"### Strategy: {strategy_of(source, path)}\n```python\n{source.rstrip()}\n```\n"
        lines.append(recording_record(reply, model=f"hand-written ({path.name})"))
    analyses = kernel_dir / "profiling.json"
    if analyses.is_file():
        replies = json.loads(analyses.read_text(encoding="utf-8"))
        if not isinstance(replies, list) or not all(
            isinstance(r, dict) and r.get("bottleneck") for r in replies
        ):
            raise ValueError(
                f"{analyses}: must be a JSON list of objects with a 'bottleneck' (the Profiling "
                "Agent's ProfileAnalysis replies)"
            )
        for number, reply in enumerate(replies, 1):
            text = "```json\n" + json.dumps(reply, indent=1) + "\n```\n"
            lines.append(
                recording_record(
                    text, purpose="profiling", model=f"hand-written (profiling.json #{number})"
                )
            )
    return lines


def render(kernel_dir: Path) -> str:
    return "".join(json.dumps(line, sort_keys=True) + "\n" for line in recording_lines(kernel_dir))


def build(directory: Path) -> list[Path]:
    """Write DIR/<kernel>.jsonl for every DIR/candidates/<kernel>/; returns the files."""
    written = []
    for kernel_dir in sorted(p for p in (directory / "candidates").iterdir() if p.is_dir()):
        target = directory / f"{kernel_dir.name}.jsonl"
        target.write_text(render(kernel_dir), encoding="utf-8")
        written.append(target)
    return written


if __name__ == "__main__":
    for written in build(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        sys.stdout.write(f"{written}\n")
