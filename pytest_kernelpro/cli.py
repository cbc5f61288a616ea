"""The `kernelpro` command: comment, approval, compare, history, show, report, calibrate; `--version`.

Each subcommand lives in its part; this module only dispatches, importing lazily.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str, str]] = {
    "comment": (
        "pytest_kernelpro.gate.comment_cli",
        "comment_main",
        "build (and --post) the PR comment from a JSON report or JUnit XML",
    ),
    "approval": (
        "pytest_kernelpro.gate.approval",
        "approval_main",
        "stop unless the PR's head commit is approved by someone with write access",
    ),
    "compare": (
        "pytest_kernelpro.gate.compare",
        "compare_main",
        "compare two JSON reports (base vs head) as a speedup table",
    ),
    "history": (
        "pytest_kernelpro.gate.history",
        "history_main",
        "list the runs kept in .kernelpro/history (one JSON per run, by commit and machine)",
    ),
    "show": (
        "pytest_kernelpro.optimize.search.show",
        "show_main",
        "print a search trajectory's tree and best path",
    ),
    "report": (
        "pytest_kernelpro.gate.records_log",
        "report_main",
        "rebuild the JSON report / JUnit file from a records log; --check fails on missing records",
    ),
    "calibrate": (
        "pytest_kernelpro.measure.calibrate",
        "calibrate_main",
        "re-measure this machine's copy bandwidth and matmul FLOP/s",
    ),
}


def usage() -> str:
    lines = ["usage: kernelpro [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, _, help_text) in COMMANDS.items()]
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
    if name not in COMMANDS:
        print(f"kernelpro: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[name]
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
