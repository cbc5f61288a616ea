"""The optimizer's settings: its flags, ini keys and `KERNELPRO_*` variables, resolved once with
the project's precedence (command line > environment > ini > conftest defaults > built-in).

They are a section of their own in `pytest --help` (a check job never needs them) and extend
the gate's settings: `OptimizeConfig` is the gate's `KernelproConfig` plus the search's own
values, so the search reads one object, and the gate's item runner reads the same one when the
optimizer plugin installs it on the session.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.config import (
    KernelproConfig,
    add_setting_options,
    resolve_setting,
)
from pytest_kernelpro.setting_table import Setting, choice_parser, parse_positive_int

if TYPE_CHECKING:
    import pytest

GROUP_NAME = "kernelpro-optimize"
GROUP_DESCRIPTION = "kernelpro optimize: the guided kernel search (--kernelpro-optimize)"

FEEDBACK_CHOICES = ("tools", "raw", "none")
SEARCH_CHOICES = ("mcts", "greedy")
ORCHESTRATION_CHOICES = ("proactive", "reactive")

parse_feedback = choice_parser("feedback mode", FEEDBACK_CHOICES)


def parse_budget_text(text: str) -> str:
    """Validate a search budget ("20", "30m", "5usd", "20,30m"); kept as text."""
    from pytest_kernelpro.optimize.search.budget import parse_budget

    parse_budget(text, where="--kernelpro-optimize")  # raises an ArgumentTypeError subclass
    return text


def parse_dask_text(text: str) -> str:
    """`local`, `local:N` or a Dask scheduler address (`optimize/dask/cluster.py`)."""
    from pytest_kernelpro.errors import KernelproConfigError
    from pytest_kernelpro.optimize.dask.cluster import parse_dask

    try:
        return parse_dask(text)
    except KernelproConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "feedback",
        "Profiler feedback given to the optimizer: tools, raw or none",
        parse_feedback,
        "tools",
        "MODE",
    ),
    Setting(
        "orchestration",
        "How the optimizer's tools are used: proactive (every relevant tool runs on each "
        "candidate's profile) or reactive (the model calls tools itself)",
        choice_parser("orchestration", ORCHESTRATION_CHOICES),
        "proactive",
        "MODE",
    ),
    Setting(
        "search",
        "Search algorithm of the optimizer: mcts or greedy",
        choice_parser("search algorithm", SEARCH_CHOICES),
        "mcts",
        "ALGO",
    ),
    Setting(
        "llm_base_url",
        "Base URL of the model server (an OpenAI-compatible server for --kernelpro-llm=openai)",
        str,
        None,
        "URL",
    ),
    Setting(
        "dask",
        "Build and evaluate the optimizer's candidates on a Dask cluster, several at once: "
        "local (one worker per visible GPU, or CPU workers), local:N, or a scheduler address "
        "(needs pytest-kernelpro[dask]); unset: one candidate at a time in this process",
        parse_dask_text,
        None,
        "local|ADDRESS",
    ),
    Setting(
        "llm",
        "Model backend of the optimizer: anthropic, openai (an OpenAI-compatible server: "
        "vLLM, SGLang, Ollama), or replay:PATH (recorded calls)",
        str,
        "anthropic",
        "BACKEND",
    ),
    Setting(
        "model",
        "Model name the anthropic or openai backend asks for. Unset with openai and a base "
        "URL: the model the server serves, when it serves exactly one",
        str,
        "claude-sonnet-5-5",
        "NAME",
    ),
    Setting(
        "candidates",
        "Candidates the optimizer asks for per expansion",
        parse_positive_int,
        2,
        "N",
    ),
    Setting(
        "max_tokens",
        "Output token budget of one optimizer call",
        parse_positive_int,
        8192,
        "N",
    ),
)
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


def add_options(parser: pytest.Parser) -> None:
    """`--kernelpro-optimize`, `--kernelpro-resume` and the search's settings."""
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    group.addoption(
        "--kernelpro-optimize",
        default=None,
        metavar="BUDGET",
        type=parse_budget_text,
        help="Run the guided search for each kernel within BUDGET (e.g. 20, 30m, 5usd, "
        "20,30m). Default: None",
    )
    group.addoption(
        "--kernelpro-resume",
        action="store_true",
        default=False,
        help="With --kernelpro-optimize: continue each kernel's latest search (its run folder "
        "under .kernelpro/optimize/) instead of starting a new one; the budget counts the whole "
        "search. Default: False",
    )
    add_setting_options(group, parser, SETTINGS)
    parser.addini(
        "kernelpro_sandbox_data",
        "Data files a kernel needs in the optimizer's sandbox (paths or glob patterns relative "
        "to the rootdir, a directory meaning every file under it); nothing else of the "
        "repository beyond the kernel's imports is visible to a candidate",
        type="linelist",
        default=[],
    )


@dataclass(frozen=True)
class OptimizeConfig(KernelproConfig):
    """The gate's settings and the search's own, parsed once."""

    optimize: str | None = None  # the budget text; None: no search this session
    resume: bool = False  # continue the latest search of each kernel
    feedback: str = "tools"
    orchestration: str = "proactive"
    search: str = "mcts"
    llm_base_url: str | None = None
    dask: str | None = None  # local, local:N or a scheduler address
    llm: str = "anthropic"
    model: str = "claude-sonnet-5-5"
    candidates: int = 2
    max_tokens: int = 8192
    # `kernelpro_sandbox_data`: the data files a candidate may read, as pytest parsed the ini.
    sandbox_data: tuple[str, ...] = ()

    @classmethod
    def extend(
        cls,
        gate: KernelproConfig,
        config: pytest.Config,
        environ: dict[str, str] | None = None,
    ) -> OptimizeConfig:
        """The gate's resolved settings plus the search's. A search's own budget bounds an
        item, so the gate's built-in item time limit is lifted under `--kernelpro-optimize`
        (a limit set anywhere else stays)."""
        values: dict[str, Any] = {}
        sources = dict(gate.sources)
        for setting in SETTINGS:
            values[setting.name], sources[setting.name] = resolve_setting(
                config, setting, environ, dict(gate.conftest_defaults)
            )
        budget = config.getoption("kernelpro_optimize", default=None)
        base = {f.name: getattr(gate, f.name) for f in dataclasses.fields(KernelproConfig)}
        if budget and gate.sources.get("item_timeout") == "default":
            base["item_timeout_s"] = None
            sources["item_timeout"] = "lifted by --kernelpro-optimize (the budget bounds it)"
        base["sources"] = sources
        return cls(
            **base,
            **values,
            optimize=budget,
            resume=bool(config.getoption("kernelpro_resume", default=False)),
            sandbox_data=tuple(config.getini("kernelpro_sandbox_data")),
        )

    def child_args(self) -> list[str]:
        """These settings as flags, for the process of one item under --kernelpro-isolate."""
        if not self.optimize:
            return []
        args = [f"--kernelpro-optimize={self.optimize}"]
        if self.resume:
            args.append("--kernelpro-resume")
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if value is not None:
                args.append(f"{setting.flag}={value}")
        return args
