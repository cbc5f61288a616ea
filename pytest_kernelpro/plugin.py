"""pytest hooks of pytest-kernelpro (hooks only; the work lives in the parts).

Imports nothing heavy: torch, triton and GPU libraries load inside the item that needs them.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_kernelpro import hookspec
from pytest_kernelpro.config import add_options

# Clocks and the serializer kept now, before any test module (and kernel) is imported: a kernel
# that rebinds them later cannot change what the timer uses (measure/bound.py; stdlib only).
from pytest_kernelpro.measure import bound as _bound  # noqa: F401
from pytest_kernelpro.problem import MARKER_NAME, MARKER_SIGNATURE, marker_of
from pytest_kernelpro.run.items import (
    PLUGIN_NAME,
    RECORD_KEY,
    KernelBenchFile,
    KernelConfigErrorItem,
    KernelItem,
    kernel_items,
)
from pytest_kernelpro.run.session import REPORT_ATTR, KernelproSession, is_within, start_session


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register the `pytest_kernelpro_*` extension hooks."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the `kernelpro` option group and its ini keys."""
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the marker and start the session (`run.session.start_session`)."""
    config.addinivalue_line("markers", MARKER_SIGNATURE)
    config.pluginmanager.register(start_session(config), PLUGIN_NAME)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(
    collector: pytest.Collector, name: str, obj: Any
) -> list[pytest.Item] | None:
    """Collect functions and classes marked `kernelpro` as kernel items: where defined in a
    test module, or where imported from a library module (which pytest never collects)."""
    # pytest asks for every name of a test module: most carry no marks at all, and go
    # without a call.
    mark = marker_of(obj) if getattr(obj, "pytestmark", None) else None
    if mark is None or not callable(obj):
        return None
    return kernel_items(collector, name, obj, mark)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Collect KernelBench problem files found in the problems directory."""
    session: KernelproSession | None = parent.config.pluginmanager.get_plugin(PLUGIN_NAME)
    problems = session.settings.problems if session else None
    if problems is None or file_path.suffix != ".py" or not is_within(file_path, problems):
        return None
    from pytest_kernelpro.problem.kernelbench import is_kernelbench_file

    if not is_kernelbench_file(file_path):
        return None
    return KernelBenchFile.from_parent(parent, path=file_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --kernelpro-only, deselect everything that is not a kernel item."""
    if not config.getoption("kernelpro_only", default=False):
        return
    kept = [i for i in items if i.get_closest_marker(MARKER_NAME) is not None]
    dropped = [i for i in items if i.get_closest_marker(MARKER_NAME) is None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Log which kernel items were collected, so a missing record can be told (no xdist)."""
    kp: KernelproSession | None = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
    if kp is None or kp.is_xdist_worker or session.config.pluginmanager.hasplugin("dsession"):
        return  # the xdist controller collects nothing itself; a crashed worker fails its item
    if session.config.option.collectonly:
        return  # --co runs nothing: no kernel is missing a record
    kp.log_collected([i.nodeid for i in session.items if isinstance(i, KernelItem)])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    """Attach the kernel record and a `kernelpro` section to the call report."""
    is_kernel = isinstance(item, (KernelItem, KernelConfigErrorItem))
    record = item.stash.get(RECORD_KEY, None) if is_kernel else None
    if call.when == "call" and record is not None and getattr(item.config.option, "xmlpath", None):
        from pytest_kernelpro.gate.junit import junit_properties

        # pytest's --junitxml writes the item's user_properties (as of teardown) as
        # <property> elements of the test case; without it nothing reads them.
        item.user_properties.extend(junit_properties(record))
    report = yield
    if call.when == "call" and record is not None:
        from pytest_kernelpro.gate.format import item_section
        from pytest_kernelpro.record import encode_record

        setattr(report, REPORT_ATTR, encode_record(record).decode())
        report.sections.append(("kernelpro", item_section(record)))
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the JSON report and, when asked, the baseline (controller only); under
    --kernelpro-check a collected kernel without a record fails the session."""
    kp: KernelproSession | None = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
    if kp is None or kp.is_xdist_worker:
        return
    if kp.settings.check and kp.missing_records() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    from pytest_kernelpro.gate.render_session import session_line

    # A check in which every compared kernel was incomparable or unresolved checked nothing
    # (the session decides, not an --kernelpro-isolate child timing one of its items).
    check = kp.settings.check and not kp.settings.isolated_child
    allow = kp.settings.allow_incomparable
    if session.exitstatus == 0 and session_line(kp.records, check=check, allow_incomparable=allow):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if kp.records:
        kp.write_outputs()
    # A requested file that is not on disk fails the session (each named in red).
    if kp.write_failures and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    kp.log_finished(int(session.exitstatus))
    if kp.write_failures and session.exitstatus == 0:  # the records log's last line
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print the kernel table when kernels ran."""
    kp: KernelproSession | None = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if kp is None or kp.is_xdist_worker or not (kp.records or kp.missing_records()):
        return
    from pytest_kernelpro.run.session import terminal_summary

    terminal_summary(kp, terminalreporter)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Drop the session object."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if plugin is not None:
        plugin.stop()
        config.pluginmanager.unregister(plugin, PLUGIN_NAME)
