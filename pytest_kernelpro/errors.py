"""Exceptions and warnings shared by every part of the plugin."""

from __future__ import annotations

import traceback

# pytest's warning base from the module that defines it (as `pytest.PytestWarning`): importing
# `pytest` itself costs a sandbox worker, a judge or a re-measurement process a tenth of a
# second it never uses.
from _pytest.warning_types import PytestWarning


class KernelproError(Exception):
    """A failure of one kernel item that the user can act on.

    The message already names the value, where it came from and the fix; `repr_failure`
    shows it without a traceback into the plugin.
    """


class KernelproConfigError(KernelproError):
    """A bad marker keyword, option, ini value or environment variable."""


class KernelproWarning(PytestWarning):
    """Something was not collected or not measured; the run goes on."""


def describe_exception(exc: BaseException) -> str:
    """'TypeError: message (at file.py:12)': the exception and the line it was raised at."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
