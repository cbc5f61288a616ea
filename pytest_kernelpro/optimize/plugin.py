"""pytest hooks of the optimizer plugin (`--kernelpro-optimize`): its own `pytest11` entry
point, loaded beside the gate's and disabled with `-p no:kernelpro_optimize`.

The gate never imports this package; the search reaches a kernel item through the gate's
`pytest_kernelpro_item_measured` hook (after the item was checked, timed and placed on its
roofline) and reports through the record's `SectionPart`, which the gate shows as given.

Every session registers the options (the table below), so the table is all a session without
`--kernelpro-optimize` loads of the optimizer: the settings' resolution (`settings.py`) and
the hooks of a search (`SearchHooks`, registered at configure) come only with the flag, so a
check session's items never call into this package. The work lives in `optimize/loop/`.
"""

from __future__ import annotations

import argparse
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelpro.config import add_setting_options
from pytest_kernelpro.run.items import PLUGIN_NAME as GATE_PLUGIN_NAME
from pytest_kernelpro.setting_table import Setting, choice_parser, parse_positive_int

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.settings import OptimizeConfig
    from pytest_kernelpro.run.session import KernelproSession

GROUP_NAME = "kernelpro-optimize"
GROUP_DESCRIPTION = "kernelpro optimize: the guided kernel search (--kernelpro-optimize)"
SEARCH_PLUGIN_NAME = "kernelpro_optimize_search"


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


def pytest_addoption(parser: pytest.Parser) -> None:
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


@pytest.hookimpl(optionalhook=True)  # the gate's hook: absent with -p no:kernelpro
def pytest_kernelpro_setting_names() -> list[str]:
    return list(SETTINGS_BY_NAME)


def _gate_session(config: pytest.Config) -> KernelproSession | None:
    return config.pluginmanager.get_plugin(GATE_PLUGIN_NAME)


@pytest.hookimpl(trylast=True)  # after the gate's session exists
def pytest_configure(config: pytest.Config) -> None:
    """Under --kernelpro-optimize: the search's settings on the gate's session, the preflight
    (a search that cannot run is a usage error before any work) and the search's hooks."""
    session = _gate_session(config)
    if session is None or not config.getoption("kernelpro_optimize", default=None):
        return
    from pytest_kernelpro.optimize.loop.preflight import preflight
    from pytest_kernelpro.optimize.settings import OptimizeConfig

    settings = OptimizeConfig.extend(session.settings, config)
    # An xdist worker asks the server too (the controller's answer); only the controller runs
    # the checks and says which model it took.
    settings, lines = preflight(settings, checks=not hasattr(config, "workerinput"))
    session.settings = settings
    config.pluginmanager.register(SearchHooks(config, lines), SEARCH_PLUGIN_NAME)


class SearchHooks:
    """The hooks of a session that searches (registered only under --kernelpro-optimize)."""

    def __init__(self, config: pytest.Config, start_lines: list[str]) -> None:
        self.config = config
        self.start_lines = start_lines  # what the preflight decided, said at session start

    def settings(self) -> OptimizeConfig | None:
        """The settings on the gate's session (None: the gate's plugin is gone)."""
        from pytest_kernelpro.optimize.settings import OptimizeConfig

        session = _gate_session(self.config)
        if session is None or not isinstance(session.settings, OptimizeConfig):
            return None
        return session.settings

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionstart(self, session: pytest.Session) -> Generator[None, None, None]:
        """Say what the preflight decided (the model it took from the server) once the
        terminal's header is out."""
        result = yield
        gate = _gate_session(session.config)
        for line in self.start_lines:
            if gate is not None:
                gate.progress(line)
        return result

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """A replay directory must hold a recording for every kernel item to optimize."""
        settings = self.settings()
        if settings is None or hasattr(session.config, "workerinput"):
            return
        from pytest_kernelpro.optimize.loop.preflight import PreflightError, check_replay_items
        from pytest_kernelpro.run.items import KernelItem

        kernels = [
            (item.problem.display_name, item.problem.name)
            for item in session.items
            if isinstance(item, KernelItem)
        ]
        try:
            check_replay_items(settings, kernels)
        except PreflightError as exc:
            raise pytest.UsageError(f"kernelpro: --kernelpro-optimize cannot run: {exc}") from None

    @pytest.hookimpl(optionalhook=True)  # the gate's hook: absent with -p no:kernelpro
    def pytest_kernelpro_item_measured(self, run: Any, session: Any, set_phase: Any) -> None:
        """The search of one measured kernel item, within the session's budget."""
        if self.settings() is None:
            return
        from pytest_kernelpro.optimize.loop.item import optimize_item

        set_phase("optimizing")
        optimize_item(run, session)

    @pytest.hookimpl(optionalhook=True)  # the gate's hook: absent with -p no:kernelpro
    def pytest_kernelpro_isolated_child_args(self, config: pytest.Config) -> list[str]:
        settings = self.settings()
        return [] if settings is None else settings.child_args()
