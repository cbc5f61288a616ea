"""The optimizer's options: its flags, ini keys and `KERNELPRO_*` variables, a section of their
own in `pytest --help` (a check job never needs them).

Every session registers them, so this table (and the plugin's hooks) is all a session without
`--kernelpro-optimize` loads of the optimizer; their values are resolved under the flag only
(`search_config.OptimizeConfig`).
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from pytest_kernelpro.config import Setting, add_setting_options, choice_parser, parse_positive_int

if TYPE_CHECKING:
    import pytest

GROUP_NAME = "kernelpro-optimize"
GROUP_DESCRIPTION = "kernelpro optimize: the guided kernel search (--kernelpro-optimize)"


def parse_budget_text(text: str) -> str:
    """Validate a search budget ("20", "30m", "5usd", "20,30m"); kept as text."""
    from pytest_kernelpro.optimize.search.budget import parse_budget

    parse_budget(text, where="--kernelpro-optimize")  # raises an ArgumentTypeError subclass
    return text


def parse_price_pair(text: str) -> tuple[float, float]:
    """`IN,OUT`: a model's price in US dollars per million input and output tokens."""
    parts = text.split(",")
    try:
        price = tuple(float(part) for part in parts)
    except ValueError:
        price = ()
    if len(price) != 2 or not all(math.isfinite(value) and value >= 0.0 for value in price):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a price: write IN,OUT in dollars per million input and output "
            "tokens, e.g. 3,15 (or 0,0 for a model that costs nothing, such as a local server)"
        )
    return price[0], price[1]


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
        choice_parser("feedback mode", ("tools", "raw", "none")),
        "tools",
        "MODE",
    ),
    Setting(
        "orchestration",
        "How the optimizer's tools are used: proactive (every relevant tool runs on each "
        "candidate's profile) or reactive (the model calls tools itself)",
        choice_parser("orchestration", ("proactive", "reactive")),
        "proactive",
        "MODE",
    ),
    Setting(
        "search",
        "Search algorithm of the optimizer: mcts or greedy",
        choice_parser("search algorithm", ("mcts", "greedy")),
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
        "llm_price",
        "Price of the model in US dollars per million input and output tokens, IN,OUT (e.g. "
        "0,0 for a local server), for a model the built-in price table does not list; unset: "
        "that table's price, or none (its cost shows as $0.00)",
        parse_price_pair,
        None,
        "IN,OUT",
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
    """The `kernelpro-optimize` option group (`--kernelpro-optimize`, `--kernelpro-resume`
    and the search's settings) and its ini keys."""
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
