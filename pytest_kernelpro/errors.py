"""Exceptions and warnings shared by every part of the plugin."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING


class KernelproError(Exception):
    """A failure of one kernel item that the user can act on.

    The message already names the value, where it came from and the fix; `repr_failure`
    shows it without a traceback into the plugin.
    """


class KernelproConfigError(KernelproError):
    """A bad marker keyword, option, ini value or environment variable."""


# The warning is a pytest warning, made when first asked for: importing pytest costs a
# sandbox worker, a judge or a re-measurement process a fifth of a second it never uses.
if TYPE_CHECKING:
    import pytest

    class KernelproWarning(pytest.PytestWarning):
        """Something was not collected or not measured; the run goes on."""

else:

    def __getattr__(name: str) -> type:
        if name != "KernelproWarning":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import pytest

        class KernelproWarning(pytest.PytestWarning):
            """Something was not collected or not measured; the run goes on."""

        KernelproWarning.__module__ = __name__
        globals()[name] = KernelproWarning
        return KernelproWarning


def describe_exception(exc: BaseException) -> str:
    """'TypeError: message (at file.py:12)': the exception and the line it was raised at,
    for an error message that names what failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
