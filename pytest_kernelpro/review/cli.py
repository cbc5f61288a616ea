"""The `kernelpro` command: comment, approval, compare, history, report, calibrate, the
commands other parts add through the `kernelpro.commands` entry points (the
optimizer's `show`); `--version`.

Each subcommand lives in its part; this module only dispatches, importing lazily.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points

COMMANDS: dict[str, tuple[str, str, str]] = {
    "comment": (
        "pytest_kernelpro.review.comment_cli",
        "comment_main",
        "build (and --post) the PR comment from a JSON report or JUnit XML",
    ),
    "approval": (
        "pytest_kernelpro.review.approval",
        "approval_main",
        "stop unless the PR's head commit is approved by someone with write access",
    ),
    "compare": (
        "pytest_kernelpro.review.offline_gate",
        "compare_main",
        "compare two JSON reports (base vs head) as a speedup table",
    ),
    "history": (
        "pytest_kernelpro.review.runs",
        "history_main",
        "list the runs kept in .kernelpro/history (one JSON per run, by commit and machine)",
    ),
    "report": (
        "pytest_kernelpro.review.records_report",
        "report_main",
        "rebuild the JSON report / JUnit file from a records log; --check fails on missing records",
    ),
    "calibrate": (
        "pytest_kernelpro.review.calibrate",
        "calibrate_main",
        "re-measure this machine's copy bandwidth and matmul FLOP/s",
    ),
}


ENTRY_POINT_GROUP = "kernelpro.commands"


def added_commands() -> dict[str, EntryPoint]:
    """The subcommands installed parts add (`[project.entry-points."kernelpro.commands"]`)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in COMMANDS}


def usage() -> str:
    lines = ["usage: kernelpro [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, _, help_text) in COMMANDS.items()]
    for name, ep in sorted(added_commands().items()):
        lines.append(f"  {name:<10} {_first_doc_line(ep)}")
    lines.append("\n`kernelpro COMMAND --help` for a command's options")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from pytest_kernelpro import __version__

        print(f"kernelpro (pytest-kernelpro) {__version__}")
        return 0
    name, rest = args[0], args[1:]
    added = added_commands()
    if name in COMMANDS:
        module_name, func_name, _ = COMMANDS[name]
        func = getattr(importlib.import_module(module_name), func_name)
    elif name in added:
        func = added[name].load()
    else:
        print(f"kernelpro: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return int(func(rest) or 0)


def _first_doc_line(ep: EntryPoint) -> str:
    """The first line of the command function's docstring, loaded only for `--help`."""
    try:
        doc = ep.load().__doc__ or ""
    except Exception as exc:  # a broken plugin must not break `kernelpro --help`
        return f"(cannot load {ep.value}: {type(exc).__name__})"
    return doc.strip().splitlines()[0] if doc.strip() else ep.value


if __name__ == "__main__":
    sys.exit(main())
