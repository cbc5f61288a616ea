"""What a session that searches adds to the gate's (`--kernelpro-optimize`, imported by the
optimizer plugin's `pytest_configure` under that flag only): the search's settings on the
gate's session, the preflight, and the hooks of a search (`SearchHooks`).

A check session never imports this module, so none of its items call into the optimizer.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelpro.run.items import PLUGIN_NAME as GATE_PLUGIN_NAME

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search_config import OptimizeConfig
    from pytest_kernelpro.run.session import KernelproSession

SEARCH_PLUGIN_NAME = "kernelpro_optimize_search"


def _gate_session(config: pytest.Config) -> KernelproSession | None:
    return config.pluginmanager.get_plugin(GATE_PLUGIN_NAME)


def start_search(config: pytest.Config) -> None:
    """The search's settings on the gate's session, the preflight (a search that cannot run
    is a usage error before any work) and the search's hooks; nothing without the gate."""
    session = _gate_session(config)
    if session is None:
        return
    from pytest_kernelpro.optimize.loop.preflight import preflight
    from pytest_kernelpro.optimize.search_config import OptimizeConfig

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
        from pytest_kernelpro.optimize.search_config import OptimizeConfig

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
