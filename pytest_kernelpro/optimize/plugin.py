"""pytest hooks of the optimizer plugin (`--kernelpro-optimize`): its own `pytest11` entry
point, loaded beside the gate's and disabled with `-p no:kernelpro_optimize`.

The gate never imports this package; the search reaches a kernel item through the gate's
`pytest_kernelpro_item_measured` hook (after the item was checked, timed and placed on its
roofline) and reports through the record's `SectionPart`, which the gate shows as given.

Every session registers the options (`settings.py`): pytest needs them before it parses the
command line. The rest, the settings' resolution, the preflight and the hooks of a search
(`search_hooks.py`), is imported at configure under `--kernelpro-optimize` only, so a check
session loads no more of the optimizer than this module and its options. The work lives in
`optimize/loop/`.
"""

from __future__ import annotations

import pytest

from pytest_kernelpro.optimize import settings as optimize_settings


def pytest_addoption(parser: pytest.Parser) -> None:
    """The `kernelpro-optimize` option group and its ini keys."""
    optimize_settings.add_options(parser)


@pytest.hookimpl(optionalhook=True)  # the gate's hook: absent with -p no:kernelpro
def pytest_kernelpro_setting_names() -> list[str]:
    return list(optimize_settings.SETTINGS_BY_NAME)


@pytest.hookimpl(trylast=True)  # after the gate's session exists
def pytest_configure(config: pytest.Config) -> None:
    """Under --kernelpro-optimize: the search set up on the gate's session
    (`search_hooks.start_search`)."""
    if not config.getoption("kernelpro_optimize", default=None):
        return
    from pytest_kernelpro.optimize.search_hooks import start_search

    start_search(config)
